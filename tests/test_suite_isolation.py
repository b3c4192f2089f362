"""The suite measured the pyperf way (issue 19): fresh processes in a seeded order, the user's
own step, ``diff`` verdicts from real runs, ``--cold`` and ``--long``."""
from __future__ import annotations

import json
import os
import time

import pytest

from compare import isolate
from compare.diff import main as diff
from compare.suite import main as suite

FAST = ["--model", "tinycnn", "--batch-size", "8", "--warmup", "1", "--device", "cpu",
        "--workers", "1"]


def _run(root, out, *extra):
    assert suite(["--data", str(root), "--out", str(out), *FAST, *extra]) == 0
    return json.loads((out / "results.json").read_text())


def test_the_order_is_seeded_and_covers_every_unit():
    a, b = isolate.order(3, 2, True, seed=1), isolate.order(3, 2, True, seed=1)
    assert a == b and isolate.order(3, 2, True, seed=2) != a
    assert sorted((u.index, u.repeat, u.ceiling) for u in a) == sorted(
        [(i, r, False) for i in range(3) for r in range(2)] + [(0, r, True) for r in range(2)])
    assert [(u.index, u.repeat) for u in a] != [(i, r) for i in range(3) for r in range(2)] + [
        (0, 0), (0, 1)]  # interleaved, not variant after variant


def test_isolated_repeats_run_in_fresh_processes_in_the_recorded_order(tiny_root, tmp_path):
    r = _run(tiny_root, tmp_path / "iso", "--isolate", "--order-seed", "7", "--backends",
             "pageable,pinned", "--steps", "2", "--repeats", "2")
    pids = [rep["pid"] for v in r["variants"] for rep in v["repeats"]]
    pids += [rep["pid"] for rep in r["ceiling"]["repeats"]]
    assert {rep["decoder"] for v in r["variants"] for rep in v["repeats"]} == {"pil",
                                                                              "torchvision"}
    assert len(pids) == 6 and len(set(pids)) == 6 and os.getpid() not in pids
    # no lab probe asked for: no probe's field in any row (compare.probes)
    from compare.probes import FIELDS

    assert not any(FIELDS & set(rep) for v in r["variants"] + [r["ceiling"]]
                   for rep in v["repeats"])
    s = r["setup"]
    assert s["isolate"] is True and s["order_seed"] == 7
    labels = ["pageable", "pinned"]
    assert s["order"] == [u.name(labels) for u in isolate.order(2, 2, True, 7)]
    assert all(rep["steps"] == 4 and rep["window_s"] > 0 for v in r["variants"]
               for rep in v["repeats"])  # 2 steps, rounded up to a whole 4-batch epoch
    summary = (tmp_path / "iso" / "summary.md").read_text()
    assert not any(s[k] for k in ("long", "cold", "trace"))  # nor their summary sections
    assert not any(x in summary for x in ("**Long windows**", "**Cold page cache**",
                                          "**Traces**", "(cold)"))


@pytest.mark.parametrize("how", ["--isolate", "--no-isolate"])
def test_without_steps_each_window_holds_four_queues(tiny_root, tmp_path, how):
    """No --steps: every unit's window is FIT_QUEUES x its loader's queue (two workers x
    prefetch 2 for pageable: 16 batches, four whole 4-batch epochs, where the CPU's default
    5 steps make two), in the unit's process as in the suite's own, and the run says so."""
    from compare.results import FIT_QUEUES

    r = _run(tiny_root, tmp_path / "fit", how, "--backends", "pageable", "--repeats", "1",
             "--no-ceiling", "--workers", "2")
    (rep,) = r["variants"][0]["repeats"]
    assert r["setup"]["fit_queue"] is True and r["variants"][0]["queue_batches"] == 4
    assert rep["steps"] == FIT_QUEUES * 4 == 16


def test_without_isolation_one_process_runs_every_repeat(tiny_root, tmp_path):
    r = _run(tiny_root, tmp_path / "one", "--no-isolate", "--backends", "pageable", "--steps",
             "2", "--repeats", "2")
    assert {rep["pid"] for rep in r["variants"][0]["repeats"]} == {os.getpid()}
    assert r["setup"]["isolate"] is False


def test_an_error_in_an_isolated_repeat_is_raised_with_its_name(tiny_root, tmp_path, capsys):
    out = tmp_path / "bad"
    code = suite(["--data", str(tiny_root), "--out", str(out), *FAST, "--isolate",
                  "--backends", "pageable", "--steps", "2", "--repeats", "1",
                  "--step", "tests.steps:sleepy(ms=-5)"])  # time.sleep refuses a negative
    assert code == 1
    err = capsys.readouterr().err
    assert "pageable #1: ValueError" in err and "error.log" in err
    assert "sleep length must be non-negative" in (out / "error.log").read_text()


def _stop_after(out, n: int, **env) -> bytes:
    """Make ``out``'s complete isolated run look stopped after its first ``n`` units (what a
    time limit leaves: results.json rewritten after each unit); ``env``: facts to change."""
    d = json.loads((out / "results.json").read_text())
    kept: dict[str, list[int]] = {}
    for name in d["setup"]["order"][:n]:
        label, r = name.rsplit(" #", 1)
        kept.setdefault(label, []).append(int(r) - 1)
    row = lambda v: {**v, "repeats": [v["repeats"][r] for r in sorted(kept[v["label"]])]}  # noqa: E731
    d["variants"] = [row(v) for v in d["variants"] if v["label"] in kept]
    d["ceiling"] = row(d["ceiling"]) if "ceiling" in kept else None
    d["complete"], d["setup"]["error"] = False, "stopped"
    d["env"].update(env)
    (out / "results.json").write_text(json.dumps(d))
    return (out / "results.json").read_bytes()


def test_resume_runs_only_the_units_a_stopped_run_did_not_finish(tiny_root, tmp_path, capsys):
    """--resume (compare.resume): the first units' repeats are kept as they were, the others
    run in fresh processes in the recorded order; a different command, host or software, a
    complete run or a non-isolated one is refused in one line, and the file is left alone."""
    args = ("--isolate", "--order-seed", "7", "--backends", "pageable", "--steps", "2",
            "--repeats", "2")
    out = tmp_path / "r"
    first = _run(tiny_root, out, *args)
    order = first["setup"]["order"]
    # seed 7: the second repeat of each row runs first, so both rows resume, each repeat in place
    assert order == ["ceiling #2", "pageable #2", "pageable #1", "ceiling #1"]
    again = lambda *extra: suite(["--data", str(tiny_root), "--out", str(out), *FAST,  # noqa: E731
                                  *args, "--resume", *extra])
    assert again() == 2 and "is complete, nothing to resume" in capsys.readouterr().err
    whole = (out / "results.json").read_bytes()
    stopped = _stop_after(out, 2, torch="0.0-other")
    assert again() == 2
    assert "another machine or software (torch: '0.0-other' ->" in capsys.readouterr().err
    doc = json.loads(stopped)
    for text, says in ((json.dumps({**doc, "schema": "other"}), "not a results.json of this"),
                       (json.dumps({**doc, "setup": {**doc["setup"], "isolate": False}}),
                        "was not isolated")):
        (out / "results.json").write_text(text)
        assert again() == 2 and says in capsys.readouterr().err
    (out / "results.json").write_bytes(whole)
    stopped = _stop_after(out, 2)  # the same file, the host's facts as they are
    for extra, says in ((("--batch-size", "4"), "differs from the stopped run in batch_size"),
                        (("--no-ceiling",), "differs from the stopped run in order"),
                        (("--no-isolate",), "--resume continues an isolated run")):
        assert again(*extra) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, err
        assert (out / "results.json").read_bytes() == stopped
    kept = {(v["label"], r["pid"]) for v in json.loads(stopped)["variants"] for r in v["repeats"]}
    kept |= {("ceiling", r["pid"]) for r in json.loads(stopped)["ceiling"]["repeats"]}
    assert again() == 0
    log = capsys.readouterr().out
    assert "2 of 4 repeats done, 2 to run" in log and "[3/4]" in log and "[1/4]" not in log
    assert "samples/s over 4 steps" in log  # each unit's line: the steps its window ran
    r = json.loads((out / "results.json").read_text())
    assert r["complete"] is True and "error" not in r["setup"] and r["setup"]["order"] == order
    rows = [*r["variants"], r["ceiling"]]
    assert {(v["label"], v["repeats"][1]["pid"]) for v in rows} == kept  # repeat 2, kept as is
    new = {v["repeats"][0]["pid"] for v in rows}  # repeat 1 of each: two new processes
    assert len(new) == 2 and not new & {p for _, p in kept}
    assert suite(["--data", str(tiny_root), "--out", str(tmp_path / "none"), *FAST, *args,
                  "--resume"]) == 2
    assert "none/results.json does not exist" in capsys.readouterr().err


def test_diff_of_two_real_runs_calls_a_step_twice_as_long_slower(tiny_root, tmp_path, capsys):
    """End to end: two runs' results.json through ``compare diff``. The step's sleep dominates
    (the loader keeps up), so doubling it halves the run's rate, far beyond any noise of a
    loaded machine; the verdict rule itself (the same command twice: "no significant
    difference") is tested on known repeats in tests/test_diff.py. No ceiling: the row checked
    is the loader's, and the ceiling's repeats would sleep as long again (issue 42)."""
    run = lambda name, ms: _run(  # noqa: E731
        tiny_root, tmp_path / name, "--no-isolate", "--no-ceiling", "--backends", "pinned",
        "--steps", "6", "--repeats", "3", "--step", f"tests.steps:sleepy(ms={ms})")
    run("a", 100), run("slow", 200)
    capsys.readouterr()
    assert diff([str(tmp_path / "a"), str(tmp_path / "slow")]) == 0
    rows = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()}
    assert rows["pinned"].endswith("slower")
    ratio = float(rows["pinned"].split()[3])
    assert 0.4 < ratio < 0.7, rows["pinned"]


def test_the_step_example_runs_and_a_bad_step_is_named(tiny_root, tmp_path, capsys):
    r = _run(tiny_root, tmp_path / "ex", "--no-isolate", "--backends", "pageable", "--steps",
             "2", "--repeats", "1", "--step", "compare.steps:compiled(model='tinycnn', "
             "compile=False, num_classes=3)")
    assert r["setup"]["step"].startswith("compare.steps:compiled")
    assert r["variants"][0]["repeats"][0]["samples_per_s"] > 0 and r["ceiling"] is not None
    for ref, msg in (("tests.steps:takes_one", "must take (images, labels)"),
                     ("tests.steps:nothing", "cannot be loaded"),
                     ("tests.steps:sleepy(ms=", "is not NAME(key=literal")):
        assert suite(["--data", str(tiny_root), "--out", str(tmp_path / "x"), *FAST,
                      "--step", ref]) in (1, 2)
        assert msg in capsys.readouterr().err


@pytest.mark.skipif(not __import__("compare.probes.cold").probes.cold.available(),
                    reason="needs Linux posix_fadvise and mincore")
def test_cold_runs_evict_check_and_say_so(tiny_root, tmp_path):
    from compare.report import rows

    os.sync()  # pages not yet written back cannot be evicted (the suite refuses, by name)
    r = _run(tiny_root, tmp_path / "cold", "--no-isolate", "--backends", "pageable",
             "--steps", "2", "--warmup", "3", "--repeats", "2", "--cold")
    reps = r["variants"][0]["repeats"]
    assert r["setup"]["cold"] is True and all(x["cold_resident"] is not None for x in reps)
    assert max(x["cold_resident"] for x in reps) <= 0.05
    from compare.results import SuiteResult

    res = SuiteResult.load(tmp_path / "cold" / "results.json")
    assert rows(res)[0][0] == "pageable (cold)"
    md = (tmp_path / "cold" / "summary.md").read_text()
    # 37 images: the drained queue (2 batches of 8) and the warm-up (3) read 40 before the
    # window, which reads 32 more (2 steps, rounded up to a 4-batch epoch): none of it can
    # be cold, and 72 images would be needed
    assert "pageable: at most 0% of its window was read cold (40 samples were read" in md
    assert "a cold window needs at least 72 images" in md


class _Evicts:
    """``compare.probes.Active`` with a probe that logs an eviction before each window."""

    def __init__(self, events):
        self.events = events

    def before_window(self):
        self.events.append("cold")
        return {}

    def after_windows(self, rerun, unit, first):
        return {}


def _logged(events):
    """An endless fake loader that logs each batch it hands out in ``events``."""
    import torch

    while True:
        events.append("batch")
        yield torch.zeros(2, 3, 4, 4), torch.zeros(2, dtype=torch.long)


def test_a_cold_window_starts_after_the_queue_filled_during_the_eviction():
    """Regression (H200): the loader filled its queue from cached files while the eviction
    ran, and the window counted those batches: a --cold row trained faster than the warm one."""
    import torch

    from compare.runner import time_repeat

    events = []

    time_repeat(_logged(events), lambda x, y: events.append("step"), steps=3, warmup=2,
                device=torch.device("cpu"), probes=_Evicts(events), queue=4)
    first, second = [i for i, e in enumerate(events) if e == "cold"]
    assert events[first + 1:second] == ["batch"] * (4 + 2 + 3)  # drain, then loader-only
    assert events[second + 1:second + 6] == ["batch"] * 4 + ["batch"]  # drain, then the step
    assert events[second + 6] == "step"


def test_long_windows_are_ten_queues_and_cross_an_epoch(tiny_root, tmp_path):
    r = _run(tiny_root, tmp_path / "long", "--no-isolate", "--backends", "pageable",
             "--steps", "2", "--repeats", "1", "--long", "--details")
    v = r["variants"][0]
    q = v["queue_batches"]
    assert q == 2  # 1 worker x prefetch 2
    epoch = 37 // 8  # last_batch="drop"
    assert v["repeats"][0]["steps"] == max(2, 10 * q, epoch + 1)
    assert r["setup"]["long"] is True
    assert "**Long windows** (`--long`)" in (tmp_path / "long" / "summary.md").read_text()
    # compare report: the research sections only with --details, as python -m compare
    from compare.report import main as report

    for flag, shown in (([], False), (["--details"], True)):
        assert report([str(tmp_path / "long"), "--out", str(tmp_path / "s.md"), *flag]) == 0
        text = (tmp_path / "s.md").read_text()
        assert text.startswith("# gpu-feed comparison") and "| pageable |" in text
        assert ("**Long windows**" in text) is shown and ("**Timed windows**" in text) is shown


def test_the_reference_row_is_the_plain_imagefolder_recipe(tiny_root, tmp_path, capsys):
    r = _run(tiny_root, tmp_path / "ref", "--no-isolate", "--backends", "pageable", "--steps",
             "2", "--repeats", "1", "--reference")
    rows = {v["label"]: v for v in r["variants"]}
    ref = rows["imagefolder (reference)"]
    assert ref["backend"] == "reference" and rows["pageable"]["backend"] == "pageable"
    assert ref["repeats"][0]["samples_per_s"] > 0 and ref["queue_batches"] == 2
    assert suite(["--data", str(tiny_root), "--out", str(tmp_path / "x"), *FAST,
                  "--reference", "--mix", "mixup=0.2"]) == 2
    assert "--reference has no MixUp/CutMix" in capsys.readouterr().err


def test_the_reference_loader_reads_like_imagefolder(tiny_root):
    from torchvision import datasets

    from compare.reference import ImageFolderReference
    from pipelines import AugmentSpec, LoaderConfig

    cfg = LoaderConfig(root=tiny_root, batch_size=8, device="cpu", num_workers=0,
                       augment=AugmentSpec(size=16), last_batch="drop")
    with ImageFolderReference(cfg) as ld:
        ld.set_epoch(0)
        labels = [y for _, y in ld]
        assert len(ld) == len(labels) == 37 // 8
    want = sorted(datasets.ImageFolder(str(tiny_root)).targets)
    got = sorted(int(v) for y in labels for v in y)
    assert set(got) <= set(want) and len(got) == 32 and labels[0].dtype.is_floating_point is False


def test_the_dali_reference_is_dalis_file_reader_recipe(tiny_root):
    pytest.importorskip("nvidia.dali")
    import torch

    from compare.reference import DaliFileReaderReference
    from pipelines import AugmentSpec, LoaderConfig

    cfg = LoaderConfig(root=tiny_root, batch_size=8, device="cpu", num_workers=2,
                       augment=AugmentSpec(size=16), last_batch="drop", channels_last=True,
                       dtype="bfloat16")
    with DaliFileReaderReference(cfg) as ld:
        assert len(ld) == 37 // 8 and ld.queue_batches == 2
        for epoch in range(2):  # the iterator resets itself at the epoch's end
            ld.set_epoch(epoch)
            batches = list(ld)
            assert len(batches) == 37 // 8
        x, y = batches[0]
        assert x.shape == (8, 3, 16, 16) and x.is_contiguous(memory_format=torch.channels_last)
        assert x.dtype == torch.bfloat16 and y.dtype == torch.int64
        assert set(y.tolist()) <= {0, 1, 2} and -3 < float(x.min()) < 0 < float(x.max()) < 3
    with pytest.raises(ValueError, match="train recipe only"):
        DaliFileReaderReference(cfg.replace(augment=AugmentSpec(mode="eval", size=16)))


def test_the_reference_rows_of_a_run_with_dali(tiny_root, tmp_path, capsys):
    pytest.importorskip("nvidia.dali")
    r = _run(tiny_root, tmp_path / "ref", "--no-isolate", "--backends", "dali", "--steps", "2",
             "--repeats", "1", "--reference")
    rows = {v["label"]: v for v in r["variants"]}
    assert list(rows) == ["dali", "dali file reader (reference)"]  # no torch backend: no ImageFolder
    assert rows["dali file reader (reference)"]["backend"] == "reference"
    assert rows["dali file reader (reference)"]["repeats"][0]["loader_only_per_s"] > 0
    r = _run(tiny_root, tmp_path / "eval", "--no-isolate", "--backends", "pinned,dali", "--steps",
             "2", "--repeats", "1", "--reference", "--mode", "eval")
    assert [v["label"] for v in r["variants"]] == ["imagefolder (reference)", "pinned", "dali"]
    assert "no DALI file-reader row: --mode is eval" in capsys.readouterr().err


def test_a_loader_that_hangs_or_fails_while_closing_is_bounded_and_reported():
    import threading
    import time

    gate = threading.Event()

    class Hangs:
        def close(self):
            gate.wait(30)

    class Fails:
        def close(self):
            raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Aborted.")

    t = time.perf_counter()
    assert isolate.close_within(Hangs(), 0.3) == "it did not close within 0 s"
    assert time.perf_counter() - t < 5
    gate.set()
    assert isolate.close_within(Fails(), 5) == (
        "RuntimeError: DataLoader worker (pid 1) is killed by signal: Aborted.")
    assert isolate.close_within(None, 5) == ""
    assert "timed 2.0, close 0.5" in str(isolate.Phases(1.0, 1.5, 2.0, 0.5))


def _start_method(q, restore: bool) -> None:
    import multiprocessing as mp

    if restore:
        isolate.default_start_method()
    q.put(mp.get_start_method())


@pytest.mark.parametrize("restore", [False, True])
def test_a_units_dataloader_workers_start_as_in_the_users_job(restore):
    """Regression: a spawned unit inherited ``spawn``, so each DataLoader worker was spawned
    and imported torch again (about 100 s a unit on the H200)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_start_method, args=(q, restore))
    p.start()
    got = q.get(timeout=60)
    p.join()
    want = mp.get_all_start_methods()[0]
    assert (got == want) is restore or want == "spawn"


def test_pinned_repeats_record_their_settling_and_pageable_ones_do_not(tiny_root, tmp_path):
    """NOTE [settling] in compare.runner, through the suite and its summary."""
    fast = [x if x != "1" or i != FAST.index("--workers") + 1 else "2"
            for i, x in enumerate(FAST)]
    assert suite(["--data", str(tiny_root), "--out", str(tmp_path / "s"), *fast, "--no-isolate",
                  "--backends", "pageable,pinned", "--steps", "3", "--repeats", "1",
                  "--details"]) == 0
    r = json.loads((tmp_path / "s" / "results.json").read_text())
    rep = {v["label"]: v["repeats"][0] for v in r["variants"]}
    assert rep["pageable"]["settle_batches"] is None and rep["pageable"]["settled"] is None
    n = rep["pinned"]["settle_batches"]
    assert isinstance(n, int) and n % 2 == 0 and n >= 6  # 3 waves of 2 workers seen at least
    assert isinstance(rep["pinned"]["settled"], bool)
    summary = (tmp_path / "s" / "summary.md").read_text()
    assert "more warm-up batches until the workers were out of step" in summary
    # each repeat names the decoder that ran: PIL for the baseline, pinned's from the data
    assert (rep["pageable"]["decoder"], rep["pinned"]["decoder"]) == ("pil", "torchvision")
    assert "torchvision decoder" in summary and "pil decoder" in summary


def test_the_step_runs_its_first_calls_before_any_window():
    """Regression: the model's first steps (CUDA set-up) ran inside the training warm-up, and
    the loader filled its queue meanwhile, so the window counted batches made before it."""
    import torch

    from compare.runner import time_repeat

    events = []

    def step(x, y):
        events.append("step")

    time_repeat(_logged(events), step, steps=3, warmup=2, device=torch.device("cpu"))
    assert events[:3] == ["batch", "step", "step"]  # primed on one batch, then the windows
    assert events[3:3 + 5] == ["batch"] * 5  # loader-only: warm-up 2 + 3 timed


def test_a_new_loader_runs_its_first_epoch_before_the_windows():
    """Regression (H200): DALI's one-time file checks of the first epoch fell inside the
    loader-only window, which then ran below the same process's later window. The rest of a
    short first epoch now runs first, before an eviction (it would re-read the files)."""
    import torch

    from compare.runner import first_epoch, time_repeat

    assert first_epoch(31, 62) == 31 and first_epoch(124, 62) == 124
    assert first_epoch(125, 62) == 0 and first_epoch(0, 62) == 0  # long epochs hold windows
    events = []

    time_repeat(_logged(events), lambda x, y: events.append("step"), steps=3, warmup=2,
                device=torch.device("cpu"), probes=_Evicts(events), queue=2,
                first=5)
    assert events[:3] == ["batch", "step", "step"]  # primed on the first epoch's first batch
    cold = events.index("cold")
    assert events[3:cold] == ["batch"] * 4  # the rest of the first epoch, then the eviction
    assert events[cold + 1:cold + 1 + 2 + 2 + 3] == ["batch"] * 7  # queue, warm-up, window
    assert events[cold + 8] == "cold"

def test_the_loader_only_window_starts_after_the_queue_made_while_the_step_was_primed():
    """Regression (H200, issue 19): the loader filled its queue while the step was primed,
    and the loader-only window counted those batches, so a default window ran above a
    ``--long`` one. A fake loader makes one batch every 20 ms into a queue of 8."""
    import queue as q
    import threading

    import torch

    from compare.runner import time_repeat

    period, depth, stop = 0.02, 8, threading.Event()
    made: q.Queue = q.Queue(maxsize=depth)
    batch = torch.zeros(4, 3, 2, 2), torch.zeros(4, dtype=torch.long)

    def produce():
        while not stop.is_set():
            time.sleep(period)
            while not stop.is_set():
                try:
                    made.put(batch, timeout=0.05)
                    break
                except q.Full:
                    continue

    def batches():
        while True:
            yield made.get()

    threading.Thread(target=produce, daemon=True).start()
    try:
        calls = []

        def step(x, y):  # the priming (the first call) is long enough to fill the queue
            calls.append(1)
            time.sleep(0.3 if len(calls) == 1 else 0.0)

        rep = time_repeat(batches(), step, steps=8, warmup=1, device=torch.device("cpu"),
                          queue=depth)
    finally:
        stop.set()
    # the steady rate is 4 images / 20 ms; counting the queue made 8 batches look instant
    assert rep.loader_only_per_s == pytest.approx(4 / period, rel=0.3)


_UNIT = '''
import os, subprocess, time

def unit(path, parent):
    os.setpgrp()  # as compare.isolate._child
    from compare.isolate import die_with_parent
    die_with_parent(parent, every=0.1)
    worker = subprocess.Popen(["sleep", "60"])  # a loader worker, in the unit's group
    with open(path + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {worker.pid}")
    os.rename(path + ".tmp", path)
    time.sleep(60)
'''

_SUITE = '''
import multiprocessing as mp, os, sys, time
sys.path.insert(0, sys.argv[1])
import fake_unit
p = mp.get_context("spawn").Process(target=fake_unit.unit, args=(sys.argv[2], os.getpid()))
p.start()
time.sleep(60)
'''


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_unit_and_its_workers_die_with_a_killed_suite(tmp_path):
    """Regression (H200): ``timeout`` killed the suite, and the unit it was running, in a
    process group of its own, went on decoding with its workers through the next run."""
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "fake_unit.py").write_text(_UNIT)
    pids = tmp_path / "pids"
    import compare

    root = os.path.dirname(os.path.dirname(os.path.abspath(compare.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p))
    suite_p = subprocess.Popen([sys.executable, "-c", _SUITE, str(tmp_path), str(pids)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not pids.exists():
            assert time.monotonic() < deadline and suite_p.poll() is None, "the unit never started"
            time.sleep(0.1)
        unit, worker = map(int, pids.read_text().split())
        assert _alive(unit) and _alive(worker)
        suite_p.send_signal(signal.SIGKILL)
        suite_p.wait()
        deadline = time.monotonic() + 10
        while (_alive(unit) or _alive(worker)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(unit) and not _alive(worker)
    finally:
        suite_p.kill()
        for pid in pids.read_text().split() if pids.exists() else ():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("steps,long,queue,epoch,want,fit", [
    (50, False, 30, 31, 62, False),    # the H200 case: two whole 31-batch epochs, not 50
    (50, False, 30, 100, 100, False),  # an epoch at most twice the window: one whole epoch
    (50, False, 30, 5000, 50, False),  # long epochs: their boundaries are rare in training too
    (50, True, 28, 31, 310, False),    # --long: 10x the queue (280), rounded up to 10 epochs
    (2, True, 2, 4, 20, False),
    (50, False, 30, 31, 124, True),    # no --steps on the H200: 4x the queue (120), 4 epochs
    (50, False, 28, 5000, 112, True),  # 4x the queue, long epochs left alone
    (50, False, 2, 31, 62, True),      # a short queue (DALI's): steps decide, as before
    (50, True, 30, 31, 310, True),     # --long wins
])
def test_windows_hold_whole_epochs_when_epochs_are_short(steps, long, queue, epoch, want, fit):
    """Regression (H200): a 50-batch window over 31-batch epochs held one epoch start where
    the steady state has more, and pageable, which restarts its workers each epoch, trained
    faster in the default window than in a --long one. Without --steps (``fit``) the window
    also holds FIT_QUEUES x the queue: two-epoch stretches of a --long window varied about
    three times as much as four-epoch ones (seeds-reference/README.md)."""
    from compare.probes import Active
    from compare.runner import window

    n = window(steps, queue, epoch, fit, Active({"long": True} if long else {}))
    assert n == want
    starts = {sum(1 for b in range(s, s + n) if b % epoch == 0) for s in range(epoch)}
    assert len(starts) == 1 or epoch > 2 * n  # every placement holds as many epoch starts
