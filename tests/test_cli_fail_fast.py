"""Issue 13 (CLI): every tool validates its arguments before any work, in one line naming the
option; ``python -m compare`` keeps the variants that finished when a later one fails.

Three classes: late failures (made early, or made harmless), ``compare train`` and the helpers
(``doctor``, ``tools.memory``, ``tools.microbench``), and options that contradict each other.
"""
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import compare.__main__ as compare_main
import compare.suite as compare_suite
from compare.results import SuiteResult
from data_gen.generate import GenConfig, generate

FAST = ["--model", "none", "--steps", "2", "--warmup", "0", "--repeats", "1", "--device", "cpu",
        "--workers", "0", "--image-size", "32", "--batch-size", "4"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """40 small JPEGs in 2 classes."""
    out = tmp_path_factory.mktemp("ff40")
    generate(GenConfig(out=str(out), num_images=40, classes=2, width_range=(48, 96), workers=1),
             progress=False)
    return out


@pytest.fixture(scope="module")
def with_bad_file(root, tmp_path_factory):
    """``root`` plus one file that is not an image."""
    out = tmp_path_factory.mktemp("ffbad") / "data"
    shutil.copytree(root, out)
    (out / "class_0000" / "broken.jpg").write_bytes(b"not a jpeg at all" * 10)
    return out


@pytest.fixture(scope="module")
def all_bad(tmp_path_factory):
    """Two classes of files that are not images: with ``skip`` every epoch is empty."""
    out = tmp_path_factory.mktemp("ffallbad")
    for c in ("a", "b"):
        (out / c).mkdir()
        for i in range(4):
            (out / c / f"{i}.jpg").write_bytes(bytes([i]) * 300)
    return out


@pytest.fixture
def no_timing(monkeypatch):
    """Fails the test if a variant starts: the error must come before the first timed batch."""
    def refuse(*a, **k):
        raise AssertionError("a variant ran before the arguments were checked")

    monkeypatch.setattr(compare_suite, "run_variant", refuse)


def one_line(err: str) -> str:
    lines = [l for l in err.strip().splitlines() if l]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def timed(fn, argv):
    t = time.perf_counter()
    rc = fn(argv)
    assert time.perf_counter() - t < 10
    return rc


# --- late failures: checked up front, or the finished variants are kept --------------------

@pytest.mark.parametrize("args, names", [
    (["--backends", "pageable", "--sweep", "num_workers=0,-1"],
     ["--sweep num_workers=-1", "variant 'pageable num_workers=-1'", "num_workers=-1"]),
    (["--backends", "pinned", "--sweep", "prefetch_factor=0"],
     ["--sweep prefetch_factor=0", "variant 'pinned prefetch_factor=0'", "prefetch_factor=0"]),
    pytest.param(["--backends", "dali", "--sweep", "hw_decoder_load=0,1.5"],
                 ["--sweep hw_decoder_load=1.5", "variant 'dali hw_decoder_load=1.5'",
                  "hw_decoder_load=1.5"],
                 marks=pytest.mark.dali),
    (["--batch-size", "64"], ["--batch-size 64", "variant 'pageable'", "40 images"]),
    (["--backends", ","], ["--backends", "names no backend"]),
    (["--on-bad-file", "skip", "--workers", "-3"], ["--workers", "num_workers=-3"]),
])
def test_bad_values_are_refused_before_the_first_timed_batch(root, tmp_path, capsys, no_timing,
                                                             args, names):
    out = tmp_path / "out"
    rc = timed(compare_main.main, ["--data", str(root), *FAST, "--out", str(out),
                                   "--backends", "pageable,pinned", *args])
    assert rc == 2
    err = one_line(capsys.readouterr().err)
    assert all(n in err for n in names), err
    assert not (out / "results.json").exists()


def test_an_unwritable_out_is_refused_before_any_work(root, tmp_path, capsys, no_timing):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    rc = timed(compare_main.main, ["--data", str(root), *FAST, "--out", str(blocker / "out")])
    assert rc == 2
    err = one_line(capsys.readouterr().err)
    assert "--out" in err and "cannot be written" in err
    assert blocker.read_text() == "x"


def test_default_dataset_is_not_generated_for_a_batch_it_cannot_fill(tmp_path, capsys, monkeypatch,
                                                                     no_timing):
    monkeypatch.setenv("GPU_FEED_CACHE", str(tmp_path / "cache"))
    rc = timed(compare_main.main, ["--num-images", "8", *FAST, "--batch-size", "16",
                                   "--out", str(tmp_path / "out")])
    assert rc == 2
    err = one_line(capsys.readouterr().err)
    assert "--batch-size 16" in err and "<= 8" in err
    assert not (tmp_path / "cache").exists()  # nothing generated


def test_a_late_failure_keeps_the_finished_variants(root, tmp_path, capsys, monkeypatch):
    real = compare_suite.run_variant
    calls = []

    def second_one_fails(v, *a, **k):
        calls.append(v.label)
        if len(calls) == 2:
            raise RuntimeError("boom in the second variant")
        return real(v, *a, **k)

    monkeypatch.setattr(compare_suite, "run_variant", second_one_fails)
    out = tmp_path / "out"
    rc = timed(compare_main.main, ["--data", str(root), *FAST, "--out", str(out),
                                   "--backends", "pageable,pinned"])
    assert rc == 1 and calls == ["pageable", "pinned"]
    err = one_line(capsys.readouterr().err)
    assert "variant 'pinned' failed" in err and "boom" in err
    assert str(out / "results.json") in err and "1 of 2 variants" in err
    res = SuiteResult.load(out / "results.json")
    assert res.complete is False and [v.label for v in res.variants] == ["pageable"]
    assert res.variants[0].median("samples_per_s") > 0 and "boom" in res.setup["error"]
    assert "Partial results" in (out / "summary.md").read_text()
    assert "boom in the second variant" in (out / "error.log").read_text()


def test_a_complete_run_is_marked_complete(root, tmp_path):
    out = tmp_path / "out"
    assert compare_main.main(["--data", str(root), *FAST, "--out", str(out),
                              "--backends", "pageable"]) == 0
    assert json.loads((out / "results.json").read_text())["complete"] is True


def test_on_bad_file_is_exposed_and_a_bad_file_fails_in_one_line(with_bad_file, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--data", str(with_bad_file), *FAST, "--batch-size", "40", "--steps", "1",
            "--backends", "pageable", "--out", str(out)]
    assert timed(compare_main.main, argv) == 1
    err = one_line(capsys.readouterr().err)
    assert "broken.jpg" in err and "no variant finished" in err
    with pytest.warns(RuntimeWarning, match="broken.jpg"):
        assert timed(compare_main.main, [*argv, "--on-bad-file", "skip"]) == 0
    assert SuiteResult.load(out / "results.json").setup["on_bad_file"] == "skip"


def test_the_module_entry_point_prints_one_line_and_exits_2(tmp_path):
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "compare", "--backends", ",", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=60,
                       cwd=Path(__file__).parents[1])
    assert p.returncode == 2 and time.perf_counter() - t < 30  # no dataset made: a loaded CI VM
    assert "--backends" in one_line(p.stderr)


# --- examples/train.py and the helpers -----------------------------------------------------------

def _train(*args):
    from examples.train import main as train

    return train(["--backend", "pageable", "--workers", "0", *args])


@pytest.mark.parametrize("args, name", [
    (["--batch-size", "0"], "--batch-size: batch_size=0"),
    (["--epochs", "0"], "--epochs 0"),
    (["--workers", "-1"], "--workers: num_workers=-1"),
    (["--batch-size", "41"], "--batch-size: batch_size=41"),
    (["--lr", "0"], "--lr"),
    (["--model", "no_such_net"], "--model"),
])
def test_train_refuses_bad_arguments_naming_the_option(root, capsys, args, name):
    assert timed(lambda a: _train("--data", str(root), *a), args) == 2
    assert name in one_line(capsys.readouterr().err)


def test_train_an_empty_epoch_is_an_error_not_nan(all_bad, capsys):
    with pytest.warns(RuntimeWarning):
        rc = timed(lambda a: _train(*a), ["--data", str(all_bad), "--batch-size", "2",
                                          "--on-bad-file", "skip"])
    assert rc == 1
    cap = capsys.readouterr()
    assert "nan" not in cap.out and "epoch 0" not in cap.out
    err = one_line(cap.err)
    assert "epoch 0 yielded no image" in err and "8 bad files" in err


def test_train_a_bad_file_under_error_is_one_line(all_bad, capsys):
    assert timed(lambda a: _train(*a), ["--data", str(all_bad), "--batch-size", "2"]) == 1
    err = one_line(capsys.readouterr().err)
    assert "bad image file" in err and "epoch 0" in err


@pytest.mark.parametrize("args, name", [
    (["--workers", "-2"], "--workers: num_workers=-2"),
    (["--batch-size", "-8"], "--batch-size: batch_size=-8"),
])
def test_doctor_fails_negative_settings(capsys, args, name):
    from compare.doctor import main as doctor

    assert timed(doctor, args) == 1
    out = capsys.readouterr().out
    fails = [l for l in out.splitlines() if l.startswith("[FAIL]")]
    assert len(fails) == 1 and name in fails[0] and "[OK" not in out


@pytest.mark.parametrize("args, name", [
    (["--backends", ","], "--backends"),
    (["--backends", "pinned,ffcv"], "--backends: backend='ffcv'"),
    (["--epochs", "0"], "--epochs 0"),
    (["--batch-size", "0"], "--batch-size: batch_size=0"),
    (["--workers", "-1"], "--workers: num_workers=-1"),
])
def test_memory_refuses_bad_arguments_before_any_epoch(root, tmp_path, capsys, args, name):
    from tools.memory import main as memory

    out = tmp_path / "mem"
    assert timed(memory, ["--data", str(root), "--out", str(out), "--backends", "pageable",
                          "--workers", "0", *args]) == 2
    assert name in one_line(capsys.readouterr().err)
    assert not out.exists()


def test_memory_missing_data_and_unwritable_out(tmp_path, root, capsys):
    from tools.memory import main as memory

    assert memory(["--data", str(tmp_path / "nope"), "--out", str(tmp_path / "m")]) == 2
    assert "--data: root=" in one_line(capsys.readouterr().err)
    (tmp_path / "f").write_text("x")
    assert memory(["--data", str(root), "--out", str(tmp_path / "f"), "--backends",
                   "pageable"]) == 2
    assert "--out" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("args, name", [
    (["validate", "--data", "ROOT", "--images", "0"], "--images 0"),
    (["validate", "--data", "ROOT", "--repeats", "0"], "--repeats 0"),
    (["decode"], "--data DIR"),
    (["validate", "--data", "/nonexistent/x"], "--data: root="),
    (["early-exit", "--data", "ROOT", "--backends", "ffcv"], "--backends 'ffcv'"),
    (["early-exit"], "--data DIR"),
    (["cpu-scaling", "--data", "ROOT", "--processes", "0"], "--processes '0'"),
    (["cpu-scaling", "--data", "ROOT", "--processes", "100000"], "exceed the"),
    (["cpu-scaling"], "--data DIR"),
    (["host-probe", "--busy", "-1"], "--busy '-1'"),
    (["host-probe", "--repeats", "0"], "--repeats 0"),
])
def test_microbench_refuses_bad_arguments(root, capsys, args, name):
    from tools.microbench import main as mb

    assert timed(mb, [str(root) if a == "ROOT" else a for a in args]) == 2
    assert name in one_line(capsys.readouterr().err)


def test_argparse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        _train("--data", "x", "--epochs", "two")
    assert e.value.code == 2
    assert "--epochs" in one_line(capsys.readouterr().err)


# --- options that contradicted each other ------------------------------------------------------

@pytest.mark.parametrize("args, names", [
    (["--preset", "seeds", "--sweep", "num_workers=0,2"], ["--preset seeds", "--sweep"]),
    (["--sweep", "hw_decoder_load=0,1", "--backends", "pageable"],
     ["--sweep hw_decoder_load", "no effect on pageable"]),
    (["--sweep", "streams=1,2", "--backends", "pageable"], ["--sweep streams", "pinned"]),
    (["--sweep", "num_workers=0 cpu_binding=rank", "--backends", "pageable"],
     ["--sweep cpu_binding"]),
    (["--sweep", "handoff=current,stream"], ["--sweep handoff", "was removed"]),
    (["--sweep", "pin=on", "--backends", "pinned,pageable"], ["--sweep pin=on", "--backends"]),
    (["--sweep", "threads=2"], ["--sweep item 'threads=2'"]),
    (["--sweep", "num_workers=1,"], ["--sweep item 'num_workers=1,'", "empty value"]),
    (["--sweep", ""], ["--sweep ''"]),
    (["--num-images", "50"], ["--num-images", "--data"]),  # it sizes the generated set only
])
def test_contradicting_options_are_refused(root, tmp_path, capsys, no_timing, args, names):
    rc = timed(compare_main.main, ["--data", str(root), *FAST, "--out", str(tmp_path), *args])
    assert rc == 2
    err = one_line(capsys.readouterr().err)
    assert all(n in err for n in names), err


@pytest.mark.dali
def test_pin_sweep_with_dali_backends_is_refused(root, tmp_path, capsys, no_timing):
    rc = compare_main.main(["--data", str(root), *FAST, "--out", str(tmp_path),
                            "--sweep", "pin=on,off", "--backends", "dali"])
    assert rc == 2
    err = one_line(capsys.readouterr().err)
    assert "--sweep pin=on,off" in err and "--backends is dali" in err


def _labels(out):
    return [v.label for v in SuiteResult.load(out / "results.json").variants]


def test_a_knob_runs_only_where_it_has_an_effect(root, tmp_path, capsys):
    out = tmp_path / "out"
    assert timed(compare_main.main, ["--data", str(root), *FAST, "--out", str(out),
                                     "--backends", "pageable,pinned",
                                     "--sweep", "streams=0,1"]) == 0
    assert _labels(out) == ["pageable", "pinned streams=0", "pinned streams=1"]
    err = capsys.readouterr().err
    assert "--sweep streams: no effect on pageable; it runs once" in err
    notes = SuiteResult.load(out / "results.json").setup["notes"]
    assert notes == ["--sweep streams: no effect on pageable; it runs once"]
    assert "no effect on pageable" in (out / "summary.md").read_text()


def test_preset_is_restricted_to_the_given_backends(root, tmp_path):
    out = tmp_path / "out"
    assert timed(compare_main.main, ["--data", str(root), *FAST, "--out", str(out),
                                     "--preset", "seeds", "--backends", "pinned"]) == 0
    assert _labels(out) == ["pin-only", "pinned", "pinned torchvision", "pinned scaled"]


def test_duplicate_backends_and_sweep_values_run_once_with_a_note(root, tmp_path, capsys):
    out = tmp_path / "out"
    assert timed(compare_main.main, ["--data", str(root), *FAST, "--out", str(out),
                                     "--backends", "pageable,pageable",
                                     "--sweep",
                                     "num_workers=0,0 prefetch_factor=1 prefetch_factor=1"]) == 0
    assert _labels(out) == ["pageable num_workers=0 prefetch_factor=1"]
    err = capsys.readouterr().err.splitlines()
    assert [l for l in err if "note:" in l] == [
        "python -m compare: note: --backends lists pageable more than once; each runs once",
        "python -m compare: note: --sweep num_workers lists 0 more than once; it runs once",
        "python -m compare: note: --sweep prefetch_factor is given twice; its values are merged",
        "python -m compare: note: --sweep prefetch_factor lists 1 more than once; it runs once",
    ]
