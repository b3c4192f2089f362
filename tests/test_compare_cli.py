"""``python -m compare`` and ``examples/train.py`` end to end on the CPU."""
import json

import pytest

from compare.__main__ import main
from compare.results import SuiteResult


def test_compare_writes_table_json_png_and_summary(tiny_root, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["--data", str(tiny_root), "--steps", "2", "--warmup", "1", "--repeats", "2",
               "--batch-size", "4", "--image-size", "32", "--workers", "0", "--model", "tinycnn",
               "--device", "cpu", "--out", str(out), "--backends", "pageable,pinned"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "pageable" in text and "ceiling" in text and "% ceiling" in text
    report = text[text.rindex("Verdict: "):]  # the run's report opens with the verdict
    assert report.index("% ceiling") > 0
    # a tiny CPU run: a winner, or a verdict that names none and says why
    first = report.splitlines()[0]
    assert (first.split(" ")[1] in ("pageable", "pinned")
            or first.startswith(("Verdict: no significant difference", "Verdict: no reliable"))), first
    res = SuiteResult.load(out / "results.json")
    assert [v.label for v in res.variants] == ["pageable", "pinned"]
    assert all(len(v.repeats) == 2 and v.median("samples_per_s") > 0 for v in res.variants)
    assert res.ceiling is not None and res.setup["batch_size"] == 4
    assert res.env["torch"] and res.setup["dataset"]["num_images"] == 37
    for f in ("throughput.png", "timeline.png"):
        assert (out / f).read_bytes()[:4] == b"\x89PNG"
    summary = (out / "summary.md").read_text()
    assert "| pinned |" in summary and summary.splitlines()[2].startswith("**Verdict:** ")


@pytest.mark.parametrize("args, msg", [
    (["--model", "no_such_net"], "model='no_such_net'"),
    (["--backends", "ffcv"], "valid backends"),
    (["--steps", "0"], "--steps"),
])
def test_bad_flags_give_one_line_errors(tiny_root, tmp_path, capsys, args, msg):
    assert main(["--data", str(tiny_root), "--out", str(tmp_path), "--device", "cpu", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "\n" not in err


def test_missing_data_root_is_one_line(tmp_path, capsys):
    assert main(["--data", str(tmp_path / "nope"), "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["pageable", "pinned", pytest.param("dali", marks=pytest.mark.dali)])
def test_train_loop_prints_loss_per_epoch(tiny_root, capsys, backend):
    from examples.train import main as train

    rc = train(["--backend", backend, "--data", str(tiny_root), "--epochs", "2",
               "--batch-size", "8", "--workers", "0"])
    assert rc == 0
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("epoch")]
    assert len(lines) == 2 and "loss" in lines[0] and "32 images" in lines[0]


def test_microbench_validate_reports_a_cost(tiny_root, capsys):
    from tools.microbench import main as mb

    assert mb(["validate", "--data", str(tiny_root), "--repeats", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["images"] == 37 and 0 < out["us_per_file"] < 1000


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_microbench_decode_times_three_decoders(tiny_root, capsys, mode):
    from tools.microbench import main as mb

    assert mb(["decode", "--data", str(tiny_root), "--images", "4", "--repeats", "1",
               "--mode", mode]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == mode and out["images"] == 4
    assert all(out[f"{k}_ms_per_img"] > 0 for k in ("pil", "torchvision", "scaled"))
    assert out["scaled_library"] in ("pil", "simplejpeg")


def test_microbench_baseline_gives_the_plain_recipes_outputs(tiny_root, capsys):
    """``pageable``'s item and the plain ImageFolder item, seeded alike, give the same tensors
    (the check the timing relies on), and both costs are timed."""
    from tools.microbench import main as mb

    assert mb(["baseline", "--data", str(tiny_root), "--images", "5", "--repeats", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["images"] == 5 and out["same_output"] == 5
    assert out["pageable_ms_per_img"] > 0 and out["imagefolder_ms_per_img"] > 0
    assert out["pageable_over_imagefolder"] > 0 and out["seed_us"] > 0 and out["check_us"] > 0


def test_microbench_baseline_needs_data(capsys):
    from tools.microbench import main as mb

    assert mb(["baseline"]) == 2
    assert "--data DIR is needed by baseline" in capsys.readouterr().err


def test_microbench_interleaves_what_it_compares():
    """Each round times every function once, the order reversed every other round."""
    from tools.microbench import _interleaved

    calls = []
    med = _interleaved({k: (lambda k=k: calls.append(k)) for k in "abc"}, repeats=3)
    assert "".join(calls) == "abccbaabc" and set(med) == set("abc")


def test_microbench_early_exit_times_both_epoch_starts(tiny_root, capsys):
    from tools.microbench import main as mb

    assert mb(["early-exit", "--data", str(tiny_root), "--backends", "pageable", "--device",
               "cpu", "--batch-size", "4", "--repeats", "2"]) == 0
    r = json.loads(capsys.readouterr().out)["backends"]["pageable"]
    assert len(r["trials_after_break_s"]) == len(r["trials_after_whole_epoch_s"]) == 2
    assert 0 < r["after_break_at_batch_1_s"] < 60 and 0 < r["after_whole_epoch_s"] < 60


@pytest.mark.parametrize("decoder", ["torchvision", "scaled", "eighth"])
def test_microbench_cpu_scaling_runs_one_process_per_core(tiny_root, capsys, decoder):
    from tools.microbench import main as mb

    assert mb(["cpu-scaling", "--data", str(tiny_root), "--processes", "1",
               "--seconds", "0.5", "--images", "4", "--decoder", decoder]) == 0
    r = json.loads(capsys.readouterr().out)
    (row,) = r["rows"]
    assert r["decoder"] == decoder
    assert row["processes"] == 1 and row["img_per_s"] > 0 and row["per_process_vs_first"] == 1.0


def test_microbench_host_probe_is_slower_beside_spinning_processes(capsys):
    """The host CPU probe (tools.hostprobe) on a core shared with two spinning processes takes
    longer: it follows the share of a core the host gives a process."""
    from tools.microbench import main as mb

    assert mb(["host-probe", "--busy", "0,2", "--repeats", "5"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["busy_processes"] for r in rows] == [0, 2] and rows[0]["vs_first"] == 1.0
    assert rows[1]["probe_ms"] > 1.5 * rows[0]["probe_ms"]


@pytest.mark.parametrize("name", ["fuzz", "microbench"])
def test_moved_tools_are_no_compare_command(name, capsys):
    """The fuzzer and the microbenchmarks left the installed package for tools/ (issue 42):
    ``python -m compare fuzz`` is refused in one line that names the new command."""
    assert main([name, "--cases", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("python -m compare: error: ")
    assert f"python -m tools.{name}" in err


def test_transform_option_takes_every_form_users_pass(monkeypatch):
    import sys
    import types

    import torch
    from torchvision import transforms as v1
    from torchvision.transforms import v2

    from compare.suite import load_transform

    m = types.ModuleType("user_augs")
    m.single = v2.RandomResizedCrop(32)
    m.seq = torch.nn.Sequential(v2.RandomResizedCrop(32), v2.RandomHorizontalFlip())
    m.old = v1.Compose([v1.RandomResizedCrop(32), v1.ToTensor()])
    m.factory = lambda: v2.Compose([v2.CenterCrop(32)])
    m.needs_args = lambda size: v2.CenterCrop(size)
    m.not_a_transform = 42
    monkeypatch.setitem(sys.modules, "user_augs", m)
    for name, n in (("single", 1), ("seq", 2), ("old", 2), ("factory", 1)):
        c = load_transform(f"user_augs:{name}")
        assert isinstance(c, v2.Compose) and len(c.transforms) == n, name
    for name, msg in (("needs_args", "needs arguments"), ("not_a_transform", "transform="),
                      ("missing", "cannot be loaded")):
        with pytest.raises(ValueError, match=msg):
            load_transform(f"user_augs:{name}")


def test_help_and_usage_errors_do_not_import_torch():
    """``python -m compare --help`` returns at once: torch is imported only when a run starts."""
    import subprocess
    import sys

    code = ("import sys\nfrom compare.__main__ import main\n"
            "for argv in (['--help'], ['--steps', 'x']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"
    assert "default: 256 with CUDA, 32 without" in out.stdout


def test_a_row_that_cannot_run_the_transform_is_reported_not_run(tiny_root, tmp_path, capsys,
                                                                 monkeypatch):
    """Issue 57, item 6: DALI cannot translate RandomPerspective, so its row is reported as not
    run, with the reason, in the output and summary.md, and the other rows still run; with no
    row left, the refusal is the one-line error it was."""
    import sys
    import types

    import torch
    from torchvision.transforms import v2

    pytest.importorskip("nvidia.dali")
    m = types.ModuleType("user_perspective")
    m.t = v2.Compose([v2.RandomResizedCrop(32, antialias=True), v2.RandomPerspective(),
                      v2.ToDtype(torch.float32, scale=True)])
    monkeypatch.setitem(sys.modules, "user_perspective", m)
    common = ["--data", str(tiny_root), "--steps", "2", "--warmup", "1", "--repeats", "1",
              "--batch-size", "4", "--workers", "0", "--model", "none", "--device", "cpu",
              "--no-ceiling", "--transform", "user_perspective:t"]
    out = tmp_path / "out"
    assert main([*common, "--backends", "dali,pinned", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "not run: dali: --transform user_perspective:t:" in err and "RandomPerspective" in err
    assert [v.label for v in SuiteResult.load(out / "results.json").variants] == ["pinned"]
    assert "not run: dali" in (out / "summary.md").read_text()
    assert main([*common, "--backends", "dali", "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "(for dali)" in err[0] and "RandomPerspective" in err[0]
