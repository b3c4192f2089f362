"""Issue 42, "library first": ``python -m compare --help`` fits a screen and ``--help-all`` has
the rest (compare.args NOTE [short and full help]); the summary answers "which backend?" in its
first lines (compare.report NOTE [verdict first])."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compare.args import build_parser
from compare.report import markdown, verdict_lines
from compare.results import Repeat, SuiteResult, VariantResult

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests/fixtures/results/h200/seeds-reference"
HELP_MAX_LINES = 60
LAB = ("--order-seed", "--long", "--trace", "--cold")


def _compare(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(ROOT)}  # argparse wraps at COLUMNS
    return subprocess.run([sys.executable, "-m", "compare", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_help_fits_a_screen_and_keeps_the_everyday_options():
    r = _compare("--help")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) <= HELP_MAX_LINES, (
        f"python -m compare --help has {len(lines)} lines (budget {HELP_MAX_LINES}): give an "
        "option a shorter help, or hide a lab option (compare.args NOTE [short and full help])")
    for flag in ("--data", "--out", "--backends", "--batch-size", "--workers", "--steps",
                 "--model", "--preset", "--device", "--help-all"):
        assert flag in r.stdout, flag
    for flag in LAB:
        assert flag not in r.stdout, f"{flag} is a lab option: --help-all lists it"
    for command in ("doctor", "diff", "report", "examples/train.py"):  # the epilog names them
        assert command in r.stdout, command


def test_help_all_lists_the_lab_options_and_the_full_description():
    r = _compare("--help-all")
    assert r.returncode == 0, r.stderr
    for flag in LAB:
        assert flag in r.stdout, flag
    flat = " ".join(r.stdout.split())
    assert "Which variants run:" in flat and "NOTE [one validation pass" in flat
    assert "compare.probes.cold" in flat  # a lab option's full help


def test_hidden_options_still_parse():
    a = build_parser().parse_args(["--data", "D", "--trace", "--cold", "--order-seed", "7",
                                   "--long"])
    assert (a.trace, a.cold, a.long) == (True,) * 3
    assert a.order_seed == 7 and a.data == "D"
    plain = build_parser().parse_args([])
    assert (plain.trace, plain.order_seed, plain.cold, plain.long) == (False, 0, False, False)


@pytest.mark.parametrize("flag", ["--paired-long", "--loader-only-last", "--wait-sites",
                                  "--compute-stream"])
def test_removed_probes_are_refused(flag):
    with pytest.raises(SystemExit):
        build_parser().parse_args([flag])


def test_an_error_in_a_hidden_option_names_it_and_points_at_help_all():
    r = _compare("--order-seed", "x")
    assert r.returncode == 2
    err = r.stderr.strip()
    assert "\n" not in err and "--order-seed" in err and "--help-all" in err


def _first_lines(text: str, n: int):
    """The first ``n`` lines after the title, blank ones skipped."""
    body = [ln for ln in text.splitlines()[1:] if ln.strip()]
    return body[:n]


def test_the_summary_opens_with_the_verdict_then_the_table_then_the_research():
    res = SuiteResult.load(FIXTURES / "C/results.json")  # dali 4564 ±11, pinned tv 3630 ±160
    text = markdown(res, details=True)
    assert text.startswith("# gpu-feed comparison\n")
    first, second = _first_lines(text, 2)
    assert first.startswith("**Verdict:** dali is the fastest in training: 4564.1 samples/s")
    assert "97.3% of the model-only ceiling" in first and "3.05x pageable" in first
    assert second.startswith("Runner-up pinned torchvision, 3629.8 samples/s, is 20.5% slower")
    assert "beyond noise" in second
    table = text.index("| backend | samples/s |")
    assert text.index("**Verdict:**") < text.index("- GPU:") < table
    for research in ("**Order of the repeats**", "**Spreads of samples/s**",
                     "**Timed windows**", "**Warnings**"):
        assert text.index(research) > table, research
    short = markdown(res)  # without --details: the verdict, the table, notes and warnings
    assert short.index("**Verdict:**") < short.index("| backend | samples/s |")
    assert "**Warnings**" in short
    for research in ("**Order of the repeats**", "**Spreads of samples/s**", "**Timed windows**"):
        assert research not in short, research


def test_the_verdict_says_within_noise_when_the_gap_is_inside_the_spread():
    res = SuiteResult.load(FIXTURES / "B/results.json")  # dali 4604 ±12, pinned tv 4542 ±63
    lines = verdict_lines(res)
    # the first line names no winner that the next one calls noise
    assert lines[0] == ("Verdict: no significant difference in training between dali (4604.1 "
                        "samples/s, 97.9% of the model-only ceiling, 2.49x pageable) and pinned "
                        "torchvision.")
    assert "pinned torchvision" in lines[1] and "within noise" in lines[1]
    assert 1 <= len(lines) <= 3


def test_the_verdict_names_no_winner_above_the_ceiling():
    lines = verdict_lines(_run({"pageable": ("pageable", [4000.0, 4100.0, 3900.0]),
                                "dali": ("dali", [900.0, 910.0, 890.0])}))
    assert lines[0] == ("Verdict: no reliable winner in training: the fastest row, pageable, is "
                        "above what a loader can reach (4000.0 samples/s, 400.0% of the "
                        "model-only ceiling: see the warnings).")
    assert "beyond noise" in lines[1]


def test_the_verdict_calls_a_speed_up_inside_the_spread_noise():
    lines = verdict_lines(_run({"pageable": ("pageable", [60.0, 80.0, 100.0]),
                                "pinned": ("pinned", [90.0, 120.0, 150.0])}))
    assert lines[0].startswith("Verdict: no significant difference in training between pinned")
    assert "1.50x pageable, within noise" in lines[0]
    assert lines[1].endswith("the measured spread, 60.0 samples/s).")
    apart = verdict_lines(_run({"pageable": ("pageable", [60.0, 61.0, 62.0]),
                                "pinned": ("pinned", [90.0, 91.0, 92.0])}))
    assert "1.49x pageable." in apart[0] and "noise" not in apart[0]


def _run(rows, ceiling=1000.0, complete=True):
    def var(label, backend, sps):
        return VariantResult(label, backend, {}, 1.0,
                             tuple(Repeat(s, 1.0, 1.0, 1.0, 1.0) for s in sps))
    return SuiteResult({"gpu": "H200", "cuda_available": True},
                       {"model": "resnet50", "device": "cuda", "variants": ["a", "b", "c", "d"]},
                       var("ceiling", "none", [ceiling] * 3) if ceiling else None,
                       tuple(var(label, backend, s) for label, (backend, s) in rows.items()),
                       complete=complete)


def test_the_verdict_leaves_out_reference_rows_and_says_what_qualifies_it():
    res = _run({"imagefolder (reference)": ("reference", [900.0] * 3),
                "pageable": ("pageable", [400.0, 410.0, 390.0]),
                "dali": ("dali", [800.0])}, complete=False)
    lines = verdict_lines(res)
    assert lines[0] == ("Verdict: dali is the fastest in training: 800.0 samples/s, 80.0% of "
                        "the model-only ceiling, 2.00x pageable.")
    assert lines[1].startswith("Runner-up pageable, 400.0 samples/s, is 50.0% slower")
    assert "one repeat" in lines[1]  # dali's single repeat has no spread
    assert lines[2] == "(partial results: 3 of 4 variants finished.)"
    only = verdict_lines(_run({"pinned": ("pinned", [495.0, 505.0])}, ceiling=None))
    assert only == ["Verdict: pinned is the only backend timed in training: 500.0 samples/s "
                    "(no model-only ceiling was timed)."]


@pytest.mark.parametrize("fixture", sorted(FIXTURES.parent.rglob("results.json")),
                         ids=lambda p: str(p.relative_to(FIXTURES.parent)))
def test_report_puts_the_verdict_first_for_every_fixture(fixture, tmp_path):
    from compare.report import main as report

    assert report([str(fixture), "--out", str(tmp_path / "summary.md")]) == 0
    text = (tmp_path / "summary.md").read_text()
    assert _first_lines(text, 1)[0].startswith("**Verdict:** ")
