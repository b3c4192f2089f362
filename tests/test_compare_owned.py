"""Issue 55, compare's share. Class 1: ``report``, ``plot`` and ``scaling`` never write over a
file they read, a results.json, or a file the suite did not write (compare/owned.py). Class 6:
``python -m compare`` refuses ``RANK``/``WORLD_SIZE`` with the loader's own message before any
rendezvous; ``--resume`` names a damaged results.json; ``diff`` says when a run is partial.

Every refusal is one line on stderr, exit status 2, and leaves every file as it was.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import compare.__main__ as compare_main
from compare import diff, plot, report, scaling
from compare.results import Repeat, SuiteResult, VariantResult

FAST = ["--model", "none", "--steps", "2", "--warmup", "0", "--repeats", "1", "--device", "cpu",
        "--workers", "0", "--image-size", "32", "--batch-size", "4", "--no-isolate"]


def _line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err and "Traceback" not in err, err
    return err


def _suite(world: int = 1, complete: bool = True, error: str | None = None) -> SuiteResult:
    reps = tuple(Repeat(x * world, x * world, 1.0, 2.0, 0.0) for x in (100, 101, 102))
    setup = {"model": "none", "batch_size": 4, "dtype": "float32", "augment": "A",
             "device": "cpu", "workers": 0, "world_size": world, "variants": ["pageable", "dali"],
             "dataset": {"num_images": 100}, **({"error": error} if error else {})}
    return SuiteResult({"gpu": None}, setup, None,
                       (VariantResult("pageable", "pageable", {}, 1.0, reps),), complete=complete)


def _run(tmp_path: Path, name: str, res: SuiteResult) -> Path:
    (tmp_path / name).mkdir()
    res.dump(tmp_path / name / "results.json")
    return tmp_path / name / "results.json"


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# -- class 1 -------------------------------------------------------------------------------------

def test_report_out_never_replaces_what_it_reads_a_results_file_or_yours(tmp_path, capsys):
    a, b = _run(tmp_path, "a", _suite()), _run(tmp_path, "b", _suite())
    (tmp_path / "notes.md").write_text("# my notes\n")
    before = _files(tmp_path)
    for out, why in ((a, "a file this command reads"), (b, "a results file of the suite"),
                     (tmp_path / "notes.md", "a file the suite did not write")):
        assert report.main([str(a), "--out", str(out)]) == 2
        err = _line(capsys)
        assert f"--out: {str(out)!r} is {why}" in err, err
        assert _files(tmp_path) == before
    summary = tmp_path / "a" / "summary.md"  # a summary the suite wrote: rewritten
    assert report.main([str(a), "--out", str(summary)]) == 0
    assert report.main([str(a.parent), "--out", str(summary)]) == 0  # RESULTS.json as a folder
    assert summary.read_text().startswith("# gpu-feed comparison")


def test_plot_out_never_replaces_a_png_of_yours(tmp_path, capsys):
    a = _run(tmp_path, "a", _suite())
    (tmp_path / "a" / "timeline.png").write_bytes(b"\x89PNG my own plot")
    before = _files(tmp_path)
    assert plot.main([str(a)]) == 2  # the default --out: the folder of RESULTS.json
    assert "timeline.png" in _line(capsys) and _files(tmp_path) == before
    assert plot.main([str(a), "--out", str(tmp_path / "pngs")]) == 0  # a new folder: drawn
    capsys.readouterr()
    assert plot.main([str(a), "--out", str(tmp_path / "pngs")]) == 0  # its own PNGs: redrawn


def test_scaling_out_never_replaces_a_results_file_it_reads(tmp_path, capsys):
    one, many = _run(tmp_path, "one", _suite(1)), _run(tmp_path, "many", _suite(2))
    before = _files(tmp_path)
    assert scaling.main([str(one.parent), str(many), "--out", str(one)]) == 2
    assert "a file this command reads" in _line(capsys) and _files(tmp_path) == before
    out = tmp_path / "scaling.md"
    for _ in range(2):  # then its own markdown is rewritten
        assert scaling.main([str(one), str(many), "--out", str(out)]) == 0
    assert out.read_text().startswith("# gpu-feed scaling")


# -- class 6 -------------------------------------------------------------------------------------

@pytest.mark.parametrize("rank, world", [("2", "2"), ("x", "2"), ("0", "0"), ("1", None)])
def test_python_m_compare_names_a_rank_mismatch_as_the_loader_does(
        rank, world, tiny_root, tmp_path, monkeypatch, capsys):
    from pipelines import LoaderConfig, create_loader

    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RANK", rank)
    if world is not None:
        monkeypatch.setenv("WORLD_SIZE", world)
    with pytest.raises(ValueError) as loader:
        create_loader("pageable", LoaderConfig(root=str(tiny_root), batch_size=4, device="cpu"))
    out = tmp_path / "out"
    assert compare_main.main(["--data", str(tiny_root), *FAST, "--out", str(out)]) == 2
    assert _line(capsys) == f"python -m compare: error: {loader.value}"
    assert not out.exists()


@pytest.mark.parametrize("text", ['{"schema": "gpu-feed.compare/1", "env": {"gpu"', "\x00\xff",
                                  "[]"])
def test_resume_on_a_damaged_results_file_says_so(text, tiny_root, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_bytes(text.encode("latin-1"))
    argv = ["--data", str(tiny_root), *FAST, "--out", str(out), "--resume"]
    assert compare_main.main(argv) == 2
    err = _line(capsys)
    assert f"--resume: {out / 'results.json'} is damaged" in err, err
    assert (out / "results.json").read_bytes() == text.encode("latin-1")


def test_diff_says_a_run_is_partial_with_its_recorded_error(tmp_path, capsys):
    a = _run(tmp_path, "a", _suite())
    b = _run(tmp_path, "b", _suite(complete=False, error="dali failed: RuntimeError: boom"))
    assert diff.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert ("note: B is a partial run: 1 of 2 variants finished, stopped by: dali failed: "
            "RuntimeError: boom") in out
    assert "A is a partial run" not in out
    assert diff.main([str(a), str(b), "--json"]) == 0
    assert any("B is a partial run" in n for n in json.loads(capsys.readouterr().out)["notes"])
