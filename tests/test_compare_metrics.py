"""The metric code, checked against fakes with known timings."""
import json
import time
from dataclasses import replace

import pytest
import torch

from compare.metrics import loader_only, measure, percentile, stretch
from compare.report import markdown, table, warnings_for
from compare.results import Repeat, SuiteResult, VariantResult
from compare.runner import wave_period
from compare.variants import Variant, parse_sweep, preset
from pipelines import Backend, LoaderConfig

CPU = torch.device("cpu")


def sleepy_loader(wait_s, bs=4):
    x, y = torch.zeros(bs, 3, 2, 2), torch.zeros(bs, dtype=torch.long)
    while True:
        time.sleep(wait_s)
        yield x, y


def sleepy_step(step_s):
    return lambda x, y: time.sleep(step_s)


def test_known_wait_idle_and_throughput():
    # 90 ms waits and 30 ms steps: a loaded machine's few ms of scheduling stay in the margins
    m = measure(sleepy_loader(0.09), sleepy_step(0.03), steps=10, warmup=1, device=CPU)
    assert m.samples == 40
    assert percentile(m.waits_ms, 50) == pytest.approx(90, abs=15)
    assert sum(m.compute_ms) / 10 == pytest.approx(30, abs=8)
    assert m.idle_pct == pytest.approx(75, abs=8)          # 90 of every 120 ms
    assert m.samples_per_s == pytest.approx(4 / 0.120, rel=0.2)


def test_fast_loader_means_no_idle():
    # after one warm-up batch (the generator's start is not the loader's speed); 50 ms steps
    m = measure(sleepy_loader(0.0), sleepy_step(0.05), steps=8, warmup=1, device=CPU)
    assert m.idle_pct < 10 and percentile(m.waits_ms, 95) < 5


def test_loader_only_rate():
    # 40 ms a batch: a sleep's overshoot on a loaded machine (a few ms) stays inside the tolerance
    lo = loader_only(sleepy_loader(0.04, bs=8), steps=10, warmup=1, device=CPU)
    assert lo.rate == pytest.approx(200, rel=0.2)
    assert lo.halves[0] == pytest.approx(200, rel=0.2) and lo.halves[1] == pytest.approx(200, rel=0.2)


def test_loader_only_halves_show_a_ramp():
    """A loader that speeds up halfway (20 ms, then 5 ms a batch of 8) shows it in its halves."""
    def ramp():
        for i in range(100):
            time.sleep(0.02 if i < 6 else 0.005)  # the warm-up takes 1, the first half 5
            yield torch.zeros(8, 1), torch.zeros(8)

    lo = loader_only(ramp(), steps=10, warmup=1, device=CPU)
    assert lo.halves[0] == pytest.approx(400, rel=0.3) and lo.halves[1] == pytest.approx(1600, rel=0.3)
    assert loader_only(ramp(), steps=3, warmup=0, device=CPU).halves is None


def test_loader_only_stretches_hold_whole_waves():
    """Workers in step deliver in waves (here of 4: every 4th batch waits 100 ms, the others are
    ready). Halves of a 12-batch window hold one wave and two; stretches of whole waves hold one
    each, so they agree (NOTE [waves and halves] in compare.metrics)."""
    def waves():
        for i in range(100):
            if i % 4 == 0:  # 100 ms: a loaded machine's scheduling delay stays a small part
                time.sleep(0.1)
            yield torch.zeros(8, 1), torch.zeros(8)

    plain = loader_only(waves(), steps=12, warmup=1, device=CPU)
    assert plain.halves[1] / plain.halves[0] == pytest.approx(0.5, rel=0.25)
    whole = loader_only(waves(), steps=12, warmup=1, device=CPU, period=4)
    assert whole.halves[1] / whole.halves[0] == pytest.approx(1.0, rel=0.25)
    assert whole.rate == pytest.approx(plain.rate, rel=0.25)  # the window itself is the same


def test_stretch_is_half_the_window_in_whole_waves():
    assert stretch(124, 14) == 56 and stretch(310, 14) == 154   # the H200's default and --long
    assert stretch(124, None) == 62 and stretch(124, 1) == 62 and stretch(10, 14) == 5


def test_wave_period_is_a_dataloaders_workers():
    class Torch:
        prefetch_factor, num_workers = 2, 14

    class Dali:
        num_workers = 14

    class Single(Torch):
        num_workers = 1

    assert wave_period(Torch()) == 14
    assert wave_period(Dali()) is None and wave_period(Single()) is None


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([5], 95) == 5


def _var(label, backend, sps, **ov):
    reps = tuple(Repeat(s, 1000.0, 1.0, 2.0, 10.0, waits_ms=(1.0, 2.0)) for s in sps)
    return VariantResult(label, backend, ov, 100.0, reps)


def test_results_roundtrip_and_derived_numbers(tmp_path):
    res = SuiteResult({"gpu": "X"}, {"model": "m"}, _var("ceiling", "none", [1000, 1000, 1000]),
                      (_var("pageable", "pageable", [100, 110, 90]),
                       _var("dali", "dali", [500, 505, 495])))
    res.dump(tmp_path / "r.json")
    back = SuiteResult.load(tmp_path / "r.json")
    assert back == res
    d = back.variant("dali")
    assert back.speedup(d) == pytest.approx(5.0) and back.pct_of_ceiling(d) == pytest.approx(50.0)
    assert back.baseline().label == "pageable"
    assert "dali" in table(back) and "| dali |" in markdown(back)
    # 20/100 spread on the baseline is >= 10%: it is flagged
    assert any("pageable" in w and "noise" in w for w in warnings_for(back))
    with pytest.raises(ValueError, match="schema"):
        SuiteResult.from_dict({**json.loads((tmp_path / "r.json").read_text()), "schema": "x"})


def _no_constants(name):
    raise AssertionError(f"results.json holds the non-JSON constant {name}")


def test_results_json_is_strict(tmp_path):
    """NaN (the ceiling's loader-only rate) and infinities are written as null."""
    ceiling = VariantResult("ceiling", "none", {}, 0.0,
                            (Repeat(1000.0, float("nan"), 0.0, 0.0, 0.0),))
    res = SuiteResult({"gpu": "X"}, {"model": "m", "odd": float("inf")}, ceiling,
                      (_var("pinned", "pinned", [100, 110, 90]),))
    res.dump(tmp_path / "r.json")
    text = (tmp_path / "r.json").read_text()
    d = json.loads(text, parse_constant=_no_constants)
    assert d["ceiling"]["repeats"][0]["loader_only_per_s"] is None and d["setup"]["odd"] is None
    back = SuiteResult.load(tmp_path / "r.json")
    assert back.ceiling.values("loader_only_per_s") == [] and back.ceiling.median(
        "samples_per_s") == 1000.0


def test_over_the_ceiling_is_flagged_with_the_reasons():
    on_cpu = SuiteResult({"gpu": None, "cuda_available": False}, {"device": "cpu", "steps": 100},
                         _var("ceiling", "none", [100, 100, 100]),
                         (_var("pinned", "pinned", [419, 420, 421]),
                          _var("pageable", "pageable", [104, 104, 104])))
    w = [x for x in warnings_for(on_cpu) if "above 105%" in x]
    assert len(w) == 1 and w[0].startswith("pinned: 420.0% of the ceiling")
    assert "share the cores" in w[0] and "ceiling run itself was steady" in w[0]
    on_gpu = SuiteResult({"gpu": "H200", "cuda_available": True}, {"device": "cuda"},
                         _var("ceiling", "none", [80, 100, 120]),
                         (_var("pinned", "pinned", [119, 120, 121]),))
    (w,) = [x for x in warnings_for(on_gpu) if "above 105%" in x]
    assert "ceiling run varied by 40.0" in w and "share the cores" not in w


def test_a_step_slowed_by_the_loaders_gpu_work_is_reported():
    """Seen on the H200 (docs/results/h200/seeds-reference/step): DALI beside a compiled
    ResNet-50 well under the ceiling with the compute stream almost never idle: the step
    itself ran slower, which neither the data wait nor the idle column shows."""
    from compare.report import contention_lines, step_slowdown

    def row(label, sps, idle):
        return VariantResult(label, label, {}, 1.0, tuple(
            Repeat(s, 1000.0, 1.0, 2.0, idle) for s in sps))

    ceiling = row("ceiling", [4700, 4700, 4700], 0.0)
    busy = row("dali", [4230, 4230, 4230], 0.0)          # no idle, 10% short: the step slowed
    starved = row("pinned", [4230, 4230, 4230], 10.0)    # 10% idle explains the 10% short
    gpu = SuiteResult({"gpu": "H200", "cuda_available": True}, {"device": "cuda"}, ceiling,
                      (busy, starved))
    assert step_slowdown(gpu, busy) == pytest.approx(4700 / 4230 - 1)
    assert step_slowdown(gpu, starved) == pytest.approx(0.0, abs=1e-9)
    assert contention_lines(gpu) == ["dali: the step took 11.1% longer than on resident batches"]
    assert "The step ran slower beside the loader" in markdown(gpu, details=True)
    assert "The step ran slower beside the loader" not in markdown(gpu)
    cpu = SuiteResult({"gpu": None, "cuda_available": False}, {"device": "cpu"}, ceiling,
                      (busy, starved))
    assert step_slowdown(cpu, busy) is None and contention_lines(cpu) == []
    assert "ran slower beside" not in markdown(cpu)


def _wavy(period, until, sleep_s=0.03):
    """Batches whose every ``period``-th one comes late, up to batch ``until``."""
    i = 0
    while True:
        i += 1
        if i < until and i % period == 0:
            time.sleep(sleep_s)
        yield torch.zeros(2, 3), torch.zeros(2)


def test_settling_warms_up_until_the_workers_are_out_of_step():
    """NOTE [settling] in compare.runner: the window starts once the waves are over."""
    from compare.metrics import long_waits

    cpu = torch.device("cpu")
    m = measure(_wavy(5, 60), lambda x, y: None, 20, 2, cpu, settle=(5, 200))
    assert m.settled is True and m.settle_batches % 5 == 0
    assert 2 + m.settle_batches >= 60 - 5  # not before the last waves had passed
    assert long_waits(m.waits_ms) == []  # the window holds none of them
    capped = measure(_wavy(5, 10_000), lambda x, y: None, 20, 2, cpu, settle=(5, 15))
    assert capped.settled is False and capped.settle_batches == 15
    plain = measure(_wavy(5, 60), lambda x, y: None, 20, 2, cpu)
    assert plain.settle_batches is None and plain.settled is None
    assert len(long_waits(plain.waits_ms)) >= 3  # without settling the window times the waves


def test_settling_ends_only_when_the_job_agrees():
    """Under torchrun every rank must run as many DDP steps: the job's verdict (here: not
    before the fifth check) governs, not this rank's (out of step from the fourth)."""
    calls = []

    def agree(flag):
        calls.append(flag)
        return flag and len(calls) > 4

    cpu = torch.device("cpu")
    m = measure(_wavy(5, 0), lambda x, y: None, 5, 2, cpu, settle=(5, 100), agree=agree)
    assert calls == [False, False, False, True, True]
    assert m.settled is True and m.settle_batches == 20
    alone = measure(_wavy(5, 0), lambda x, y: None, 5, 2, cpu, settle=(5, 100))
    assert alone.settle_batches == 15


def test_only_a_loader_whose_workers_run_across_epochs_settles():
    from types import SimpleNamespace as NS

    from compare.runner import SETTLE_CAP_QUEUES, settle_of

    assert settle_of(NS(num_workers=14, epoch_stream=True), 30) == (14, SETTLE_CAP_QUEUES * 30)
    assert settle_of(NS(num_workers=14, epoch_stream=False), 28) is None  # pageable
    assert settle_of(NS(num_workers=1, epoch_stream=True), 4) is None
    assert settle_of(NS(queue_batches=2), 2) is None  # DALI's recipe, no DataLoader


def test_cpu_runs_say_so_and_drop_the_gpu_idle_column(tmp_path):
    from compare.report import rows

    idle = lambda res: {r[0]: r[5] for r in rows(res)}  # noqa: E731 - column "GPU idle %"
    variants = (_var("dali", "dali", [50, 50, 50]), _var("pageable", "pageable", [10, 10, 10]))
    cpu = SuiteResult({"gpu": None, "cuda_available": False}, {"device": "cpu"}, None, variants)
    gpu = SuiteResult({"gpu": "H200", "cuda_available": True}, {"device": "cuda"}, None, variants)
    assert "dali (CPU operators)" in table(cpu) and "(CPU operators)" not in table(gpu)
    assert idle(cpu)["pageable"] == "-" and idle(gpu)["pageable"] == "10.0 ±0.0"
    assert any("do not predict GPU ones" in x for x in warnings_for(cpu))
    assert not any("predict" in x for x in warnings_for(gpu))
    assert "do not predict GPU ones" in markdown(cpu)
    assert any("DALI ran its CPU operators" in x for x in warnings_for(cpu))
    torch_only = SuiteResult(cpu.env, cpu.setup, None, variants[1:])
    assert not any("DALI" in x for x in warnings_for(torch_only))  # no DALI row: not named


def test_difference_within_spread_is_called_noise():
    res = SuiteResult({}, {}, None, (_var("pageable", "pageable", [100, 120, 80]),
                                     _var("pinned", "pinned", [105, 106, 104])))
    assert any("pinned vs pageable" in w for w in warnings_for(res))


def test_sweep_and_preset_parsing():
    vs = parse_sweep("num_workers=0,4 pin=on,off", [Backend.DALI])
    assert [v.label for v in vs] == ["pinned num_workers=0", "pinned num_workers=4",
                                     "pageable num_workers=0", "pageable num_workers=4"]
    assert vs[1].overrides == {"num_workers": 4} and vs[1].backend is Backend.PINNED
    with pytest.raises(ValueError, match="KEY"):
        parse_sweep("threads=2", [Backend.PINNED])
    with pytest.raises(ValueError, match="on or off"):
        parse_sweep("pin=maybe", [Backend.PINNED])
    vs = parse_sweep("cpu_binding=none,rank", [Backend.PINNED])
    assert [v.overrides for v in vs] == [{"cpu_binding": "none"}, {"cpu_binding": "rank"}]
    assert vs[1].options_of().cpu_binding.value == "rank"
    for gone in ("pin_mode=thread,ring", "handoff=stream", "executor=pipelined",
                 "labels_via=torch"):
        key = gone.partition("=")[0]
        with pytest.raises(ValueError, match=f"^--sweep {key} is an option that was removed"):
            parse_sweep(gone, [Backend.PINNED, Backend.DALI])
    vs = parse_sweep("preallocate_width_hint=0,1024", [Backend.DALI])
    assert vs[1].overrides == {"preallocate_width_hint": 1024}
    [spin] = parse_sweep("cpu_binding=spin", [Backend.PINNED])
    with pytest.raises(ValueError, match="cpu_binding='spin' is not valid"):
        spin.options_of()
    vs = parse_sweep("pipelines=1,2 use_mmap=on,off", [Backend.DALI])
    assert [v.overrides for v in vs] == [
        {"pipelines": p, "use_mmap": m} for p in (1, 2) for m in (True, False)]
    with pytest.raises(ValueError, match="use_mmap=yes must be on or off"):
        parse_sweep("use_mmap=yes", [Backend.DALI])
    vs = parse_sweep("queue_depth=1,3", [Backend.PAGEABLE, Backend.PINNED, Backend.DALI])
    assert [v.label for v in vs] == ["pageable", "pinned queue_depth=1", "pinned queue_depth=3",
                                     "dali queue_depth=1", "dali queue_depth=3"]
    notes = []
    vs = parse_sweep("hw_decoder_load=0 run_on=off | hw_decoder_load=1,0 pipelines=1,2 | "
                     "hw_decoder_load=1 pipelines=2", [Backend.DALI], note=notes.append)
    assert [v.label for v in vs] == [
        "dali hw_decoder_load=0 run_on=off", "dali hw_decoder_load=1 pipelines=1",
        "dali hw_decoder_load=1 pipelines=2", "dali hw_decoder_load=0 pipelines=1",
        "dali hw_decoder_load=0 pipelines=2"]
    assert vs[0].overrides == {"hw_decoder_load": 0.0, "run_on": False}
    assert notes == ["--sweep dali hw_decoder_load=1 pipelines=2 is made by two of the '|' "
                     "sweeps; it runs once"]
    with pytest.raises(ValueError, match="empty sweep between"):
        parse_sweep("pipelines=1 | ", [Backend.DALI])
    with pytest.raises(ValueError, match="batch_size"):
        Variant("cheat", Backend.DALI, {"batch_size": 64})
    seeds = preset("seeds", [Backend.PINNED, Backend.PAGEABLE])
    assert [v.label for v in seeds] == ["pageable", "pin-only", "pinned", "pinned torchvision",
                                        "pinned scaled"]
    # the seeds' three rows share the PIL decoder, so only pinning and streams differ
    assert [v.options_of().decoder for v in seeds] == [None, "pil", "pil", "torchvision", "scaled"]
    assert preset("seeds", list(Backend))[-1].backend is Backend.DALI
    large = preset("large", list(Backend))
    assert [v.label for v in large] == ["pageable", "pinned", "pinned torchvision", "dali",
                                        "dali one pipeline", "dali hw 0"]
    # the loaders' defaults for large photos, not a forced decoder or pipeline count
    assert large[1].options_of().decoder is None and large[3].options_of().pipelines is None
    assert large[4].options_of().pipelines == 1 and large[5].options_of().hw_decoder_load == 0.0
    # the default share is the word "auto", and a sweep may name it
    assert large[3].options_of().hw_decoder_load == "auto"
    assert parse_sweep("hw_decoder_load=auto,0.5", [Backend.DALI])[0].overrides == {
        "hw_decoder_load": "auto"}


def test_window_shorter_than_the_dataloader_queue_is_flagged():
    def res(steps, workers):
        return SuiteResult({}, {"steps": steps, "workers": workers, "prefetch": 2}, None,
                           (_var("pinned", "pinned", [100, 100, 100]),
                            _var("dali", "dali", [500, 500, 500])))
    w = warnings_for(res(8, 14))
    assert [x for x in w if "queue" in x] == [
        "pinned: 8 timed steps are fewer than the DataLoader's queue of 28 batches (workers x "
        "prefetch); its numbers count batches decoded before the clock started. Use --steps >= 28, "
        "or --long"]
    assert not any("queue" in x for x in warnings_for(res(40, 14)))   # long enough window
    # a recorded queue (any backend) and window win over the setup's guess
    rec = SuiteResult({}, {"steps": 8, "workers": 14, "prefetch": 2}, None, (
        VariantResult("dali", "dali", {}, 1.0, (Repeat(1.0, 1.0, 1.0, 1.0, 1.0, steps=40),), 6),
        VariantResult("pinned", "pinned", {}, 1.0, (Repeat(1.0, 1.0, 1.0, 1.0, 1.0, steps=8),), 30)))
    (w,) = [x for x in warnings_for(rec) if "queue" in x]
    assert w.startswith("pinned: 8 timed steps are fewer than the DataLoader's queue of 30")


def test_an_epoch_with_fewer_batches_than_workers_is_noted(tiny_root):
    from compare.suite import short_epochs

    vs = [Variant("pageable", Backend.PAGEABLE), Variant("pinned", Backend.PINNED),
          Variant("dali", Backend.DALI)]
    cfg = LoaderConfig(root=tiny_root, batch_size=64, num_workers=14, device="cpu",
                       last_batch="drop")
    lines = short_epochs(256, vs, [cfg] * 3)
    assert [x.split(":")[0] for x in lines] == ["pageable", "pinned"]  # DALI has no workers
    assert "an epoch of 256 images is 4 batches of 64, fewer than its 14 workers" in lines[0]
    assert "use at least 896 images" in lines[0]
    assert short_epochs(1024, vs, [cfg] * 3) == []  # 16 batches for 14 workers
    assert short_epochs(32, vs, [cfg] * 3) == []  # no batch: check_dataset's error, not a note


def test_the_large_preset_defaults_to_batch_64_with_cuda(tmp_path, monkeypatch):
    from compare.args import parse_args
    from compare.suite import LARGE_BATCH, plan
    from data_gen.generate import GenConfig, generate

    root = tmp_path / "d"
    generate(GenConfig(out=str(root), num_images=64, classes=2, seed=0, width_range=(32, 48)),
             progress=False)
    for cuda, want in ((False, 32), (True, LARGE_BATCH)):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        a = parse_args(["--preset", "large", "--data", str(root), "--device", "cpu",
                        "--out", str(tmp_path)])
        assert plan(a, lambda m: None).base.batch_size == want
    a = parse_args(["--preset", "large", "--data", str(root), "--device", "cpu",
                    "--batch-size", "16", "--out", str(tmp_path)])
    assert plan(a, lambda m: None).base.batch_size == 16  # given: kept


def test_windows_fit_the_queue_only_without_steps_and_not_in_the_large_preset(tmp_path):
    """Without --steps a window holds FIT_QUEUES x its queue (runner.window); the run records
    it. Given --steps, or in --preset large (whose torch rows decode tens of photos a second),
    --steps is the window."""
    from compare.args import parse_args
    from compare.suite import plan

    def fit(*extra):
        a = parse_args(["--data", str(tmp_path), "--device", "cpu", "--out", str(tmp_path),
                        *extra])
        if a.preset == "large":
            from data_gen.generate import GenConfig, generate

            generate(GenConfig(out=str(tmp_path / "d"), num_images=64, classes=2, seed=0,
                               width_range=(32, 48)), progress=False)
            a.data = str(tmp_path / "d")
            plan(a, lambda m: None)
        return getattr(a, "given_steps", a.steps) is None

    assert fit() is True
    assert fit("--steps", "7") is False
    assert fit("--preset", "large") is False


def test_a_loader_only_rate_below_the_training_rate_is_reported():
    """A loader cannot feed training faster than it runs alone: on the H200 DALI's first epoch
    in the loader-only window, and the suite's windows before their fixes, showed it
    (docs/results/h200; copies in tests/fixtures)."""
    from pathlib import Path

    from compare.report import below_training_lines

    def row(label, pairs):
        reps = tuple(Repeat(s, lo, 1.0, 2.0, 10.0, waits_ms=(1.0,)) for lo, s in pairs)
        return VariantResult(label, "dali", {}, 100.0, reps)

    res = SuiteResult({"gpu": "X", "cuda_available": True}, {"device": "cuda"}, None, (
        row("below", [(90.0, 100.0), (80.0, 100.0), (91.0, 100.0)]),
        row("one above", [(90.0, 100.0), (101.0, 100.0), (80.0, 100.0)]),
        row("close", [(97.0, 100.0), (96.0, 100.0)]),
        row("fast loader", [(300.0, 100.0), (310.0, 100.0)])))
    lines = below_training_lines(res)
    assert len(lines) == 1 and lines[0].startswith("below:") and "0.90x" in lines[0]
    assert "half" not in lines[0]  # no halves recorded: nothing said of them
    ramp = tuple(replace(r, loader_only_halves=(60.0, 120.0)) for r in res.variants[0].repeats)
    res2 = replace(res, variants=(replace(res.variants[0], repeats=ramp),))
    assert "last stretch ran 2.00x its first" in below_training_lines(res2)[0]
    assert any(x.startswith("below:") for x in warnings_for(res))
    here = Path(__file__).resolve().parent / "fixtures/results/h200"
    first = below_training_lines(SuiteResult.load(here / "dali-first-epoch/warmup10/results.json"))
    assert [x.split(":")[0] for x in first] == ["dali hw_decoder_load=0", "dali hw_decoder_load=1"]
    unprimed = below_training_lines(
        SuiteResult.load(here / "suite-steady-state/isolated-unprimed/results.json"))
    assert [x.split(":")[0] for x in unprimed] == ["pageable", "pinned"]
    steady = below_training_lines(  # pinned's loader-only rate: below in 2 of 3 repeats only
        SuiteResult.load(here / "seeds-reference/steady/default/results.json"))
    assert steady == []


def test_every_recorded_run_loads_and_summarises_with_the_current_code():
    """docs/results/README.md says plots and summaries are drawn again from any results.json
    there: every one left under docs/results, and every fixture copy, loads with the current code,
    and its summary says which backends it ran. No count floor: superseded runs leave the tree."""
    from pathlib import Path

    from compare.report import markdown

    tests = Path(__file__).resolve().parent
    recorded = sorted((tests.parent / "docs/results").rglob("results.json"))
    fixtures = sorted((tests / "fixtures/results").rglob("results.json"))
    assert recorded and fixtures
    for path in recorded + fixtures:
        res = SuiteResult.load(path)
        text = markdown(res, details=True)
        assert all(res.row_label(v) in text for v in res.variants), path
