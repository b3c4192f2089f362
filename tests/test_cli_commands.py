"""``python -m compare``'s commands: each one's --help is fast (no torch) and shows defaults;
``diff`` gives a verdict per row and refuses runs that cannot be compared."""
import subprocess
import sys
import time

import pytest

from compare import diff
from compare.__main__ import COMMANDS, MOVED, main
from compare.results import Repeat, SuiteResult, VariantResult


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_every_command_has_a_fast_help_without_torch(command):
    code = ("import sys, compare.__main__ as m\n"
            f"argv = {[command] if command else []!r} + ['--help']\n"
            "try:\n    m.main(argv)\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')")
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert time.perf_counter() - t < 10  # generous: CI machines are slow and shared
    assert out.strip().endswith("NO-TORCH") and "usage:" in out


@pytest.mark.parametrize("command", sorted(MOVED))
def test_a_moved_command_is_one_line_naming_its_new_place(command, capsys):
    assert main([command, "--help"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no longer a command" in err and MOVED[command] in err


def test_run_help_lists_the_commands_and_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert all(c in out for c in COMMANDS)  # the short help's epilog names them
    flat = " ".join(out.split())
    assert "timed repeats per variant (default: 3)" in flat
    assert "output directory (default: runs/compare)" in flat
    with pytest.raises(SystemExit):
        main(["run", "--help-all"])
    out = capsys.readouterr().out
    assert all(f"  {c} " in out for c in COMMANDS)  # one line each, in the full description


def _run(gpu, rows, ceiling=1000.0, model="resnet50"):
    def var(label, backend, sps):
        return VariantResult(label, backend, {}, 1.0,
                             tuple(Repeat(s, 1.0, 1.0, 1.0, 1.0) for s in sps))
    return SuiteResult({"gpu": gpu}, {"model": model, "batch_size": 256, "dtype": "bfloat16",
                                      "dataset": {"num_images": 8000}, "device": "cuda"},
                       var("ceiling", "none", [ceiling] * 3),
                       tuple(var(label, label.split()[0], s) for label, s in rows.items()))


def test_diff_gives_a_verdict_per_row(tmp_path, capsys):
    a = _run("H200", {"pageable": [100, 110, 90], "dali": [500, 505, 495]})
    b = _run("H200", {"pageable": [104, 106, 102], "dali": [560, 565, 555], "pinned": [1, 1, 1]})
    a.dump(tmp_path / "a.json")
    (tmp_path / "b").mkdir()
    b.dump(tmp_path / "b" / "results.json")
    assert diff.main([str(tmp_path / "a.json"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    lines = {ln.split()[0]: ln for ln in out.splitlines()[1:] if ln.strip()}
    assert lines["pageable"].endswith("no significant difference")  # 4 < the 20 spread
    assert lines["dali"].endswith("faster") and " 1.120 " in lines["dali"]
    assert lines["ceiling"].endswith("no significant difference")
    assert "not in both runs: pinned" in out
    from dataclasses import replace

    replace(b, ceiling=None).dump(tmp_path / "b" / "results.json")  # B ran with --no-ceiling
    assert diff.main([str(tmp_path / "a.json"), str(tmp_path / "b")]) == 0
    assert "not in both runs: pinned, ceiling (only A timed it)" in capsys.readouterr().out


def test_diff_refuses_runs_that_cannot_be_compared(tmp_path, capsys):
    _run("H200", {"dali": [1, 1, 1]}).dump(tmp_path / "a.json")
    _run("A100", {"dali": [2, 2, 2]}, model="vit_l_16").dump(tmp_path / "b.json")
    assert diff.main([str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "gpu: 'H200' -> 'A100'" in err and "model:" in err
    assert diff.main([str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--force"]) == 0
    assert "note: differs: gpu" in capsys.readouterr().out
    assert diff.main([str(tmp_path / "nope.json"), str(tmp_path / "b.json")]) == 2
    assert "A " in capsys.readouterr().err
