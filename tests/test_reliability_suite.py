"""Issue 40, the suite's share: class 6 (the suite never touches what it did not write, and its
verdicts say what they compare), class 2 in the CLIs (``RANK`` and ``WORLD_SIZE`` come as a
pair), class 4's pre-check of ``--data`` under ``--on-bad-file skip``, and class 7's
``data_gen --shard-size`` without ``--format wds``.

Every refusal is one line on stderr naming the option, exit status 2, before any work.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

import compare.__main__ as compare_main
import compare.isolate as compare_isolate
import compare.suite as compare_suite
from compare import diff, owned
from compare.report import rows as report_rows
from compare.results import Repeat, SuiteResult, VariantResult, strict
from examples import train as compare_train
from tools import resume_test

FAST = ["--model", "none", "--steps", "2", "--warmup", "0", "--repeats", "1", "--device", "cpu",
        "--workers", "0", "--image-size", "32", "--batch-size", "4", "--no-isolate"]
# examples/train.py on the CPU: tinycnn at 224 px, one batch of 32 per epoch of tiny_root's 37
TRAIN = ["--backend", "pageable", "--model", "tinycnn", "--batch-size", "32", "--workers", "0"]


def one_line(err: str) -> str:
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def listing(root: Path) -> list:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def no_timing(monkeypatch):
    """Fails the test if a variant (or an isolated unit) starts."""
    def refuse(*a, **k):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr(compare_suite, "run_variant", refuse)
    monkeypatch.setattr(compare_isolate, "run_all", refuse)


@pytest.fixture
def data(tiny_root, tmp_path):
    """A private copy of tiny_root (37 JPEGs, 3 classes) that a test may write beside."""
    out = tmp_path / "data"
    shutil.copytree(tiny_root, out)
    return out


# -- class 6: --out inside --data -------------------------------------------------------------

def test_out_inside_data_is_refused_from_inside_the_dataset(data, monkeypatch, capsys,
                                                            no_timing):
    before = listing(data)
    monkeypatch.chdir(data)
    assert compare_main.main(["--data", ".", *FAST, "--backends", "pageable"]) == 2
    err = one_line(capsys.readouterr().err)
    assert "--out 'runs/compare' is inside --data '.'" in err
    assert listing(data) == before  # no runs/ class folder, no probe file


def test_out_inside_data_through_a_symlink_is_refused(data, tmp_path, capsys, no_timing):
    link = tmp_path / "link"
    link.symlink_to(data)
    before = listing(data)
    assert compare_main.main(["--data", str(link), *FAST, "--backends", "pageable",
                              "--out", str(data / "class_0000" / "out")]) == 2
    err = one_line(capsys.readouterr().err)
    assert f"is inside --data '{link}' ({data.resolve()})" in err  # the real folder, named
    assert listing(data) == before
    assert compare_main.main(["--data", str(data), *FAST, "--backends", "pageable",
                              "--out", str(data / "out")]) == 2
    assert f"is inside --data '{data}': what" in capsys.readouterr().err  # the path, once


# -- class 6: files the run did not write -----------------------------------------------------

def test_a_successful_run_keeps_an_error_log_it_did_not_write(data, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "error.log").write_text("my own notes\n")
    assert compare_main.main(["--data", str(data), *FAST, "--backends", "pageable",
                              "--out", str(out)]) == 0
    assert (out / "error.log").read_text() == "my own notes\n"
    assert SuiteResult.load(out / "results.json").complete is True


def test_a_failed_run_writes_its_traceback_beside_a_foreign_error_log(data, tmp_path, capsys,
                                                                      monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("boom in the variant")

    monkeypatch.setattr(compare_suite, "run_variant", boom)
    out = tmp_path / "out"
    out.mkdir()
    (out / "error.log").write_text("my own notes\n")
    assert compare_main.main(["--data", str(data), *FAST, "--backends", "pageable",
                              "--out", str(out)]) == 1
    err = one_line(capsys.readouterr().err)
    assert (out / "error.log").read_text() == "my own notes\n"
    assert str(out / "error-1.log") in err
    assert "boom in the variant" in (out / "error-1.log").read_text()
    assert owned.is_ours(out / "error-1.log")


def test_a_successful_run_removes_only_a_stale_error_log_of_the_suites(data, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "error.log").write_text(f"{owned.ERROR_MARK}\nan earlier failed run's traceback\n")
    assert compare_main.main(["--data", str(data), *FAST, "--backends", "pageable",
                              "--out", str(out)]) == 0
    assert not (out / "error.log").exists()


@pytest.mark.parametrize("name,text", [("results.json", "[1, 2, 3]"),
                                       ("summary.md", "# my summary\n"),
                                       ("throughput.png", "not a png")])
def test_a_file_the_suite_did_not_write_in_out_is_refused(data, tmp_path, capsys, no_timing,
                                                          name, text):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text(text)
    assert compare_main.main(["--data", str(data), *FAST, "--backends", "pageable",
                              "--out", str(out)]) == 2
    err = one_line(capsys.readouterr().err)
    assert "--out" in err and name in err and "did not write" in err
    assert (out / name).read_text() == text
    assert sorted(p.name for p in out.iterdir()) == [name]


def test_a_rerun_replaces_its_own_earlier_outputs(data, tmp_path):
    out = tmp_path / "out"
    argv = ["--data", str(data), *FAST, "--backends", "pageable", "--out", str(out)]
    assert compare_main.main(argv) == 0
    for name in owned.SUITE_FILES:  # what the first run wrote is recognised as the suite's
        assert owned.is_ours(out / name), name
    assert compare_main.main(argv) == 0


# -- class 6: compare diff ---------------------------------------------------------------------

def _rep(x: float, decoder=None) -> Repeat:
    return Repeat(x, x, 1.0, 2.0, 0.0, decoder=decoder)


def _variant(label, backend, overrides, values, decoder=None):
    return VariantResult(label, backend, overrides, 1.0,
                         tuple(_rep(x, decoder) for x in values))


def _suite(variants, **setup) -> SuiteResult:
    base = {"model": "none", "batch_size": 4, "dtype": "float32", "augment": "A", "device": "cpu",
            "workers": 0, "dataset": {"num_images": 100, "mean_width": 64, "classes": 2}}
    return SuiteResult({"gpu": None}, {**base, **setup}, None, tuple(variants))


def _write(path: Path, res: SuiteResult) -> str:
    path.mkdir(parents=True, exist_ok=True)
    res.dump(path / "results.json")
    return str(path)


def test_diff_does_not_pair_rows_of_one_label_and_two_configurations(tmp_path, capsys):
    plain = _suite([_variant("pageable", "pageable", {}, [100, 101, 102], "pil"),
                    _variant("pinned", "pinned", {}, [200, 201, 202], "torchvision")])
    seeds = _suite([_variant("pageable", "pageable", {}, [100, 101, 102], "pil"),
                    _variant("pinned", "pinned", {"streams": 2, "decoder": "pil"},
                             [100, 101, 102], "pil")])
    a, b = _write(tmp_path / "a", plain), _write(tmp_path / "b", seeds)
    assert diff.main([a, b]) == 0
    out = capsys.readouterr().out
    table = [x for x in out.splitlines() if not x.startswith("note:")]
    assert any(x.startswith("pageable ") for x in table)
    assert not any(x.startswith("pinned ") for x in table)  # no verdict on two configs
    note = next(x for x in out.splitlines() if x.startswith("note: pinned: not compared"))
    assert "decoder: 'torchvision' in A, 'pil' in B" in note
    assert "streams: 1 in A, 2 in B" in note  # the default, filled in from TorchOptions
    assert diff.main([a, b, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in doc["rows"]] == ["pageable"]
    assert doc["not_compared"][0]["label"] == "pinned"
    # --force compares it anyway, with the note
    assert diff.main([a, b, "--force"]) == 0
    out = capsys.readouterr().out
    assert any(x.startswith("pinned ") for x in out.splitlines())
    assert "pinned: compared anyway (--force)" in out


def test_diff_pairs_the_same_configuration_under_another_label(tmp_path, capsys):
    plain = _suite([_variant("pinned", "pinned", {}, [200, 201, 202], "torchvision")])
    other = _suite([_variant("pinned tv", "pinned", {"decoder": "torchvision"},
                             [200, 201, 202], "torchvision")])
    assert diff.main([_write(tmp_path / "a", plain), _write(tmp_path / "b", other)]) == 0
    out = capsys.readouterr().out
    assert any(x.startswith("pinned (B: pinned tv)") for x in out.splitlines())
    assert "not in both runs:" not in out


def test_diff_with_no_comparable_row_names_the_fields(tmp_path, capsys):
    plain = _suite([_variant("pinned", "pinned", {}, [200, 201, 202], "torchvision")])
    seeds = _suite([_variant("pinned", "pinned", {"streams": 2, "decoder": "pil"},
                             [100, 101, 102], "pil")])
    assert diff.main([_write(tmp_path / "a", plain), _write(tmp_path / "b", seeds)]) == 2
    err = one_line(capsys.readouterr().err)
    assert "pinned: not compared" in err and "decoder: 'torchvision' in A, 'pil' in B" in err


def test_diff_of_runs_that_are_not_comparable_names_the_field_not_the_statistics(tmp_path,
                                                                                 capsys):
    rows = [_variant("pageable", "pageable", {}, [100, 101, 102])]
    a = _suite(rows)
    b = _suite(rows, dataset={"num_images": 200, "mean_width": 64, "classes": 2})
    assert diff.main([_write(tmp_path / "a", a), _write(tmp_path / "b", b)]) == 2
    err = one_line(capsys.readouterr().err)
    assert "data.num_images: 100 -> 200" in err
    assert "mean_width" not in err and "classes" not in err  # the fields that match stay out
    assert "another dataset (A: " in err and "1 of its facts differ" in err
    many = _suite(rows, dataset={f"fact{i}": i for i in range(7)})
    assert diff.main([_write(tmp_path / "a", a), _write(tmp_path / "c", many)]) == 2
    err = one_line(capsys.readouterr().err)
    assert "and 6 more" in err and err.count("data.") == 4  # the first four, then a count


def _good_doc() -> dict:
    res = _suite([_variant("pageable", "pageable", {}, [100, 101, 102])])
    return json.loads(json.dumps(strict(asdict(res)), default=str))


def _malformed():
    def set_(path, value):
        def f(d):
            at = d
            for k in path[:-1]:
                at = at[k]
            at[path[-1]] = value
            return d
        return f

    return {
        "a list": (lambda d: [d], "the document is a list"),
        "null variants": (set_(["variants"], None), "variants is null"),
        "null setup": (set_(["setup"], None), "setup is null"),
        "null repeats": (set_(["variants", 0, "repeats"], None), "variants[0].repeats is null"),
        "null label": (set_(["variants", 0, "label"], None), "variants[0].label is null"),
        "a string rate": (set_(["variants", 0, "repeats", 1, "samples_per_s"], "fast"),
                          "variants[0].repeats[1].samples_per_s is a string ('fast')"),
        "a boolean rate": (set_(["variants", 0, "repeats", 0, "loader_only_per_s"], True),
                           "variants[0].repeats[0].loader_only_per_s is a boolean"),
        "a string in halves": (set_(["variants", 0, "repeats", 0, "halves"], ["1", 2]),
                               "variants[0].repeats[0].halves"),
        "a null repeat": (set_(["variants", 0, "repeats", 0], None),
                          "variants[0].repeats[0] is null"),
    }


@pytest.mark.parametrize("case", sorted(_malformed()))
def test_diff_refuses_a_malformed_results_json_in_one_line(tmp_path, capsys, case):
    mutate, said = _malformed()[case]
    good = _write(tmp_path / "good", _suite([_variant("pageable", "pageable", {},
                                                      [100, 101, 102])]))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "results.json").write_text(json.dumps(mutate(_good_doc())))
    for argv, side in (([good, str(bad)], "B"), ([str(bad), good], "A")):
        assert diff.main(argv) == 2
        err = one_line(capsys.readouterr().err)
        assert f"{side} '{bad}' is not a compare results.json" in err and said in err


def test_a_null_rate_is_still_a_valid_results_json(tmp_path, capsys):
    """A rate that was not finite is written as null (results.strict): not malformed."""
    doc = _good_doc()
    doc["variants"][0]["repeats"][0]["samples_per_s"] = None
    (tmp_path / "results.json").write_text(json.dumps(doc))
    assert len(SuiteResult.load(tmp_path / "results.json").variants[0].values(
        "samples_per_s")) == 2


# -- class 6: --step, --transform, --checkpoint, --resume ---------------------------------------

@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module ``r40user`` with a factory and a transform function that raise, and a module
    ``r40broken`` that raises on import."""
    (tmp_path / "r40user.py").write_text(
        "def make_step(**kw):\n    raise RuntimeError('no GPU for this step')\n"
        "def make_transform():\n    raise RuntimeError('no such weights')\n")
    (tmp_path / "r40broken.py").write_text("raise RuntimeError('broken at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for m in ("r40user", "r40broken"):
        sys.modules.pop(m, None)


@pytest.mark.parametrize("argv,said", [
    (["--step", "r40user:make_step(lr=0.1)"], "--step 'r40user:make_step(lr=0.1)': calling "
                                              "make_step failed (RuntimeError: no GPU"),
    (["--step", "r40user:make_step(lr=0.1)", "--isolate"], "--step 'r40user:make_step"),
    (["--step", "r40broken:step"], "--step 'r40broken:step': importing r40broken raised "
                                   "RuntimeError: broken at import"),
    (["--transform", "r40user:make_transform"], "--transform 'r40user:make_transform': calling "
                                                "make_transform failed (RuntimeError"),
    (["--transform", "r40broken:t"], "--transform 'r40broken:t': importing r40broken raised"),
])
def test_step_and_transform_that_raise_are_one_line_before_any_work(data, tmp_path, capsys,
                                                                    user_module, no_timing,
                                                                    argv, said):
    out = tmp_path / "out"
    assert compare_main.main(["--data", str(data), *FAST, "--backends", "pageable",
                              "--out", str(out), *argv]) == 2
    assert said in one_line(capsys.readouterr().err)
    assert not (out / "results.json").exists()


def _train(argv) -> int:
    return compare_train.main(argv)


def test_a_missing_checkpoint_folder_is_refused_before_training(data, tmp_path, capsys):
    ck = tmp_path / "nowhere" / "ck.pt"
    assert _train([*TRAIN, "--data", str(data), "--checkpoint", str(ck)]) == 2
    cap = capsys.readouterr()
    assert "--checkpoint" in one_line(cap.err) and "does not exist" in cap.err
    assert "epoch 0" not in cap.out  # refused before the first epoch, not at its save


def test_a_checkpoint_inside_data_or_a_folder_is_refused(data, tmp_path, capsys):
    before = listing(data)
    assert _train([*TRAIN, "--data", str(data),
                   "--checkpoint", str(data / "class_0000" / "ck.pt")]) == 2
    assert "--checkpoint" in one_line(capsys.readouterr().err)
    assert _train([*TRAIN, "--data", str(data), "--checkpoint", str(tmp_path)]) == 2
    assert "is a folder" in one_line(capsys.readouterr().err)
    assert listing(data) == before


@pytest.fixture(scope="module")
def tinycnn_checkpoint(tiny_root, tmp_path_factory):
    """A checkpoint of one epoch of tinycnn on tiny_root."""
    ck = tmp_path_factory.mktemp("r40ck") / "ck.pt"
    assert compare_train.main([*TRAIN, "--data", str(tiny_root), "--checkpoint", str(ck)]) == 0
    return ck


def _foreign(tmp_path: Path, kind: str) -> Path:
    import torch

    p = tmp_path / f"{kind}.pt"
    if kind == "empty":
        p.write_bytes(b"")
    elif kind == "text":
        p.write_text("these are my notes, not a checkpoint\n")
    elif kind == "dict":
        torch.save({"weights": torch.zeros(2)}, p)
    elif kind == "list":
        torch.save([1, 2, 3], p)
    return p


@pytest.mark.parametrize("kind,said", [("empty", "the file is empty"),
                                       ("text", "not a checkpoint torch can read"),
                                       ("dict", "not an examples/train.py checkpoint"),
                                       ("list", "not an examples/train.py checkpoint")])
def test_an_empty_or_foreign_checkpoint_is_one_line(tiny_root, tmp_path, capsys, kind, said):
    ck = _foreign(tmp_path, kind)
    raw = ck.read_bytes()
    assert _train([*TRAIN, "--data", str(tiny_root), "--epochs", "2", "--checkpoint", str(ck),
                   "--resume"]) == 2
    cap = capsys.readouterr()
    err = one_line(cap.err)
    assert "--resume --checkpoint" in err and said in err
    assert "epoch" not in cap.out
    assert ck.read_bytes() == raw  # not overwritten


@pytest.mark.parametrize("model", ["resnet18", "none"])
def test_a_checkpoint_of_another_model_is_one_line(tiny_root, tinycnn_checkpoint, tmp_path,
                                                   capsys, model):
    ck = tmp_path / "ck.pt"
    shutil.copy(tinycnn_checkpoint, ck)
    argv = [*TRAIN, "--data", str(tiny_root), "--epochs", "2", "--checkpoint", str(ck),
            "--resume"]
    argv[argv.index("tinycnn")] = model
    assert _train(argv) == 2
    cap = capsys.readouterr()
    assert "a checkpoint of another model" in one_line(cap.err)
    assert "epoch" not in cap.out
    assert ck.read_bytes() == tinycnn_checkpoint.read_bytes()


def test_a_checkpoint_of_the_same_model_resumes(tiny_root, tinycnn_checkpoint, tmp_path, capsys):
    ck = tmp_path / "ck.pt"
    shutil.copy(tinycnn_checkpoint, ck)
    assert _train([*TRAIN, "--data", str(tiny_root), "--epochs", "2", "--checkpoint", str(ck),
                   "--resume"]) == 0
    out = capsys.readouterr().out
    assert "resumed from" in out and "epoch 1:" in out and "epoch 0:" not in out


# -- class 6: tools.resume_test checks where the resumed run started --------------------------------

def _row(e, k):
    return (e, k, f"{e}{k}")


def test_resume_test_refuses_a_resume_that_started_elsewhere():
    killed = [_row(0, k) for k in range(4)] + [_row(1, k) for k in range(3)]
    kill_at = 7  # killed after logging step 7 (epoch 1, batch 2), before its checkpoint
    good = [_row(1, 2), _row(1, 3)]
    assert resume_test.start_error(killed, kill_at, (1, 2), good, 4) is None
    # restarted from scratch (it joins into an "identical" sequence if not checked)
    afresh = [_row(0, k) for k in range(4)] + [_row(1, k) for k in range(4)]
    assert resume_test.join(killed, afresh) == afresh
    assert "started afresh" in resume_test.start_error(killed, kill_at, None, afresh, 4)
    assert "resumed at epoch 1, batch 0" in resume_test.start_error(killed, kill_at, (1, 0),
                                                                    [_row(1, 0)], 4)
    assert "first batch is epoch 1, batch 3" in resume_test.start_error(
        killed, kill_at, (1, 2), [_row(1, 3)], 4)
    # a checkpoint at an epoch's end is the next epoch's first batch
    assert resume_test.start_error(killed[:5], 5, (0, 4), [_row(1, 0)], 4) is None


def _fake_child(resume_honoured: bool):
    """``resume_test._child`` without training: 2 epochs of 4 batches, logged as examples/train.py
    logs them; the killed run dies after its 6th step; the resumed run starts at the
    checkpoint's position, or (``resume_honoured=False``) afresh from batch 0."""
    def child(args, log, extra):
        rows = [(e, k) for e in range(2) for k in range(4)]
        lines, rc = [], 0
        if "--kill-after-steps" in extra:
            rows, rc = rows[:int(extra[extra.index("--kill-after-steps") + 1])], -9
        elif "--resume" in extra and resume_honoured:
            lines, rows = ["# resumed 1 1"], rows[5:]  # the checkpoint after step 5
        log.write_text("\n".join(lines + [f"{e} {k} {e}{k}" for e, k in rows]) + "\n")
        return subprocess.CompletedProcess([], rc, "", "")
    return child


@pytest.mark.parametrize("honoured", [True, False])
def test_resume_test_fails_when_the_resumed_run_restarts_from_batch_0(tiny_root, capsys,
                                                                      monkeypatch, honoured):
    monkeypatch.setattr(resume_test, "_child", _fake_child(honoured))
    argv = [*TRAIN, "--data", str(tiny_root), "--epochs", "2"]
    cap_rc = resume_test.main(argv)
    cap = capsys.readouterr()
    if honoured:
        assert cap_rc == 0 and "identical" in cap.out
    else:  # the joined sequence equals the uninterrupted one, but it did not resume
        assert cap_rc == 1 and "identical" not in cap.out
        assert "did not resume from the checkpoint" in one_line(cap.err)


def test_a_resumed_train_logs_where_it_resumed(tiny_root, tinycnn_checkpoint, tmp_path):
    """The header the resume test reads (examples/train.py --log-batches)."""
    ck, log = tmp_path / "ck.pt", tmp_path / "log"
    shutil.copy(tinycnn_checkpoint, ck)
    assert _train([*TRAIN, "--data", str(tiny_root), "--epochs", "2", "--checkpoint", str(ck),
                   "--resume", "--log-batches", str(log)]) == 0
    lines = log.read_text().splitlines()
    assert lines[0] == "# resumed 0 1" and lines[1].startswith("1 0 ")  # epoch 0's end
    assert resume_test.resumed_at(log) == (0, 1)
    assert resume_test.start_error([(0, 0, "x"), (1, 0, "y")], 2, (0, 1),
                                   resume_test._rows(log), 1) is None


# -- class 6: --cold ----------------------------------------------------------------------------

def _cold_result(resident: float) -> SuiteResult:
    v = VariantResult("pageable", "pageable", {}, 1.0,
                      tuple(Repeat(10.0, 10.0, 1.0, 1.0, 0.0, probes={"cold_resident": resident})
                            for _ in range(2)))
    return SuiteResult({"gpu": None}, {"cold": True, "model": "none", "batch_size": 4}, None,
                       (v,))


def test_a_row_whose_eviction_did_not_take_is_not_labelled_cold():
    assert report_rows(_cold_result(0.01))[0][0] == "pageable (cold)"
    label = report_rows(_cold_result(0.98))[0][0]
    assert "(cold)" not in label and "NOT cold" in label


@pytest.mark.skipif(not (Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK)),
                    reason="no writable /dev/shm (tmpfs)")
def test_cold_on_tmpfs_is_refused_before_timing(tiny_root, tmp_path, capsys, no_timing):
    from compare.probes.cold import available

    if not available():
        pytest.skip("no posix_fadvise / mincore here")
    import tempfile

    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        src = Path(shm) / "data"
        shutil.copytree(tiny_root, src)
        out = tmp_path / "out"
        assert compare_main.main(["--data", str(src), *FAST, "--backends", "pageable",
                                  "--out", str(out), "--cold"]) == 2
    err = one_line(capsys.readouterr().err)
    assert "--cold" in err and "did NOT take" in err
    assert not (out / "results.json").exists()


# -- class 2: RANK and WORLD_SIZE as a pair, in every CLI ---------------------------------------

def _cli_calls(data: Path, out: Path):
    from compare import doctor
    from tools import memory, microbench
    from tools.fuzz import cli as fuzz_cli

    return {
        "run": lambda: compare_main.main(["--data", str(data), *FAST, "--out", str(out)]),
        "train": lambda: compare_train.main([*TRAIN, "--data", str(data)]),
        "resume-test": lambda: resume_test.main([*TRAIN, "--data", str(data), "--epochs", "2"]),
        "memory": lambda: memory.main(["--data", str(data), "--backends", "pageable",
                                       "--out", str(out), "--epochs", "1"]),
        "doctor": lambda: doctor.main([]),
        "microbench": lambda: microbench.main(["decode", "--data", str(data)]),
        "fuzz": lambda: fuzz_cli.main(["--out", str(out), "--cases", "1"]),
    }


@pytest.mark.parametrize("given,missing", [("RANK", "WORLD_SIZE"), ("WORLD_SIZE", "RANK")])
@pytest.mark.parametrize("cli_name", ["run", "train", "resume-test", "memory", "doctor",
                                      "microbench", "fuzz"])
def test_half_of_the_distributed_pair_is_refused_by_every_cli(tiny_root, tmp_path, monkeypatch,
                                                              capsys, no_timing, given,
                                                              missing, cli_name):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv(given, "1")
    out = tmp_path / "out"
    assert _cli_calls(tiny_root, out)[cli_name]() == 2
    err = one_line(capsys.readouterr().err)
    assert f"{given}='1' is set in the environment but {missing} is not" in err
    assert not out.exists()


def test_half_of_the_pair_is_refused_by_python_m_compare(tiny_root, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["WORLD_SIZE"] = "2"
    r = subprocess.run([sys.executable, "-m", "compare", "--data", str(tiny_root), *FAST,
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, env=env,
                       cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert r.returncode == 2
    assert "but RANK is not" in one_line(r.stderr)
    assert not (tmp_path / "out").exists()


# -- class 4: --data is pre-checked under the run's --on-bad-file ------------------------------

@pytest.fixture
def list_with_a_bad_row(tiny_root, tmp_path):
    """A file list of tiny_root's images, with one row that has no label."""
    rows = [f"{p},{p.parent.name}" for p in sorted(tiny_root.rglob("*.jpg"))]
    rows.insert(3, f"{sorted(tiny_root.rglob('*.jpg'))[0]},")
    lst = tmp_path / "list.csv"
    lst.write_text("path,label\n" + "\n".join(rows) + "\n")
    return lst


def test_the_suite_prechecks_a_list_with_the_runs_policy(list_with_a_bad_row, tmp_path, capsys):
    argv = ["--data", str(list_with_a_bad_row), *FAST, "--backends", "pageable"]
    assert compare_main.main([*argv, "--out", str(tmp_path / "e")]) == 2
    assert "no label" in one_line(capsys.readouterr().err)
    with pytest.warns(RuntimeWarning, match="dropped 1 rows"):
        rc = compare_main.main([*argv, "--out", str(tmp_path / "s"), "--on-bad-file", "skip"])
    assert rc == 0
    assert SuiteResult.load(tmp_path / "s" / "results.json").complete is True


def test_train_prechecks_a_list_with_the_runs_policy(list_with_a_bad_row, capsys):
    argv = [*TRAIN, "--data", str(list_with_a_bad_row)]
    assert compare_train.main(argv) == 2
    assert "no label" in one_line(capsys.readouterr().err)
    with pytest.warns(RuntimeWarning, match="dropped 1 rows"):
        assert compare_train.main([*argv, "--on-bad-file", "skip"]) == 0
    assert "epoch 0:" in capsys.readouterr().out


# -- class 7: data_gen --shard-size without --format wds -----------------------------------------

@pytest.mark.parametrize("extra", [[], ["--format", "folder"], ["--format", "list"]])
def test_data_gen_shard_size_without_wds_is_refused(tmp_path, capsys, extra):
    from data_gen.__main__ import main as data_gen

    out = tmp_path / "x"
    assert data_gen(["--out", str(out), "--num-images", "4", "--classes", "2", "--workers", "1",
                     "--shard-size", "2", *extra]) == 2
    err = one_line(capsys.readouterr().err)
    assert "--shard-size" in err and "--format wds" in err
    assert not out.exists()


def test_data_gen_shard_size_with_wds_still_works(tmp_path):
    from data_gen.__main__ import main as data_gen

    out = tmp_path / "x"
    assert data_gen(["--out", str(out), "--num-images", "5", "--classes", "2", "--workers", "1",
                     "--width-range", "32,48", "--format", "wds", "--shard-size", "2",
                     "--quiet"]) == 0
    assert len(list(out.glob("shard-*.tar"))) == 3


def test_memory_refuses_out_inside_data(data, capsys):
    from tools import memory

    before = listing(data)
    assert memory.main(["--data", str(data), "--backends", "pageable", "--epochs", "1",
                        "--out", str(data / "mem")]) == 2
    assert "--out" in one_line(capsys.readouterr().err)
    assert listing(data) == before
