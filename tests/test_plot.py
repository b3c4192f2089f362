"""``python -m compare plot``: PNGs from a results.json, one-line errors, no torch on import."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from compare import plot
from compare.results import Repeat, SuiteResult, VariantResult

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _variant(label, backend, rate):
    reps = tuple(Repeat(samples_per_s=rate + i, loader_only_per_s=2 * rate, wait_p50_ms=1.0,
                        wait_p95_ms=3.0, idle_pct=10.0, waits_ms=(0.5, 2.0, 1.0))
                 for i in range(2))
    return VariantResult(label, backend, {}, 150528.0, reps)


@pytest.fixture
def results_json(tmp_path):
    res = SuiteResult(env={"gpu": None, "cpu_count": 2}, setup={"model": "tinycnn", "batch_size": 8},
                      ceiling=_variant("ceiling (batch on device)", "ceiling", 300.0),
                      variants=(_variant("pageable", "pageable", 100.0), _variant("dali", "dali", 250.0)))
    path = tmp_path / "run" / "results.json"
    path.parent.mkdir()
    res.dump(path)
    return path


def test_writes_pngs_next_to_the_json(results_json, capsys):
    assert plot.main([str(results_json)]) == 0
    printed = capsys.readouterr().out.split()
    assert sorted(Path(p).name for p in printed) == sorted(plot.FILES)
    for name in plot.FILES:
        assert (results_json.parent / name).read_bytes()[:8] == PNG_MAGIC


def test_out_folder_is_created(results_json, tmp_path):
    out = tmp_path / "a" / "b"
    assert plot.main([str(results_json), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(plot.FILES)
    assert all((out / n).read_bytes()[:8] == PNG_MAGIC for n in plot.FILES)


def test_a_folder_holding_results_json_is_accepted(results_json, tmp_path):
    assert plot.main([str(results_json.parent), "--out", str(tmp_path / "o")]) == 0


def test_report_plots_keeps_its_signature(results_json, tmp_path):
    from compare import report

    paths = report.plots(SuiteResult.load(results_json), tmp_path)
    assert [p.name for p in paths] == list(plot.FILES)


def test_missing_file_is_one_line_exit_2(tmp_path, capsys):
    missing = tmp_path / "nope.json"
    assert plot.main([str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RESULTS.json" in err and "nope.json" in err


@pytest.mark.parametrize("content", ["not json", "[1, 2]", json.dumps({"what": "pin"}),
                                     json.dumps({"schema": "gpu-feed.compare/1", "env": {}})])
def test_not_a_results_json_is_one_line_exit_2(tmp_path, capsys, content):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert plot.main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RESULTS.json" in err and "bad.json" in err
    assert not list(tmp_path.glob("*.png"))


def test_importing_compare_plot_leaves_torch_and_matplotlib_unimported():
    code = ("import compare.plot, compare.report, sys; "
            "assert 'torch' not in sys.modules, 'torch'; "
            "assert 'matplotlib' not in sys.modules, 'matplotlib'")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_help_shows_the_default():
    r = subprocess.run([sys.executable, "-m", "compare.plot", "--help"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "default: the folder of RESULTS.json" in " ".join(r.stdout.split())
