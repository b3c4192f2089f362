"""``compare diff``: the ratio's bootstrap interval and the verdict rule (issue 19), on
``SuiteResult``s built here with known repeats."""
import json
import math

import pytest

from compare import diff
from compare.diff import MIN_EFFECT, NO_DIFF, judge, ratio_ci, table_rows
from compare.report import markdown
from compare.results import Repeat, SuiteResult, VariantResult

SAME_A = [1000, 1012, 991, 1005, 996]


def _var(label, sps, pids=None):
    pids = pids or [None] * len(sps)
    return VariantResult(label, label.split()[0], {}, 1.0,
                         tuple(Repeat(s, 1.0, 1.0, 1.0, 1.0, pid=p) for s, p in zip(sps, pids)))


def _run(rows_, ceiling=(4700.0, 4700.5, 4699.5)):
    return SuiteResult({"gpu": "H200"}, {"model": "resnet50", "batch_size": 256,
                                         "dtype": "bfloat16", "dataset": {"num_images": 8000},
                                         "device": "cuda"},
                       _var("ceiling", list(ceiling)) if ceiling else None,
                       tuple(_var(label, s) for label, s in rows_.items()))


def _diff(tmp_path, capsys, a, b, *extra):
    a.dump(tmp_path / "a.json")
    b.dump(tmp_path / "b.json")
    capsys.readouterr()
    assert diff.main([str(tmp_path / "a.json"), str(tmp_path / "b.json"), *extra]) == 0
    return capsys.readouterr().out


def _table(out):
    """label -> the row's line, for the rows of the table."""
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("variant"))
    assert lines[head].split()[-1] == "verdict" and "95% CI" in lines[head]
    return {ln.split()[0]: ln for ln in lines[head + 1:]
            if ln.strip() and not ln.startswith(("note:", "not in both runs:"))}


def _ci(line):
    lo, hi = line.split("[", 1)[1].split("]", 1)[0].split(",")
    return float(lo), float(hi)


def test_the_same_distribution_is_no_significant_difference(tmp_path, capsys):
    out = _diff(tmp_path, capsys, _run({"dali": SAME_A}),
                _run({"dali": [1003, 994, 1009, 999, 990]}))
    row = _table(out)["dali"]
    assert row.endswith(NO_DIFF)
    lo, hi = _ci(row)
    assert lo < 1 < hi
    assert _table(out)["ceiling"].endswith(NO_DIFF)


def test_twenty_percent_slower_is_slower_with_the_interval_below_one(tmp_path, capsys):
    out = _diff(tmp_path, capsys, _run({"dali": SAME_A}),
                _run({"dali": [800, 810, 795, 805, 798]}))
    row = _table(out)["dali"]
    assert row.endswith("slower") and " 0.800 " in row
    lo, hi = _ci(row)
    assert lo <= 0.8 <= hi < 1
    assert "note: dali:" not in out  # a reason is given only for no significant difference


def test_twenty_percent_faster_is_faster(tmp_path, capsys):
    out = _diff(tmp_path, capsys, _run({"dali": SAME_A}),
                _run({"dali": [1200, 1210, 1195, 1205, 1190]}))
    row = _table(out)["dali"]
    assert row.endswith("faster")
    assert _ci(row)[0] > 1


def test_a_consistent_change_under_the_minimum_effect_is_not_called(tmp_path, capsys):
    a = [1000, 1000.2, 999.9, 1000.1, 999.8]
    b = [1010, 1010.1, 1009.9, 1010.2, 1009.8]  # +1%, spread 0.4: interval and gap both say so
    out = _diff(tmp_path, capsys, _run({"dali": a}), _run({"dali": b}))
    row = _table(out)["dali"]
    assert row.endswith(NO_DIFF) and _ci(row)[0] > 1
    assert "note: dali: the change (+1.0%) is under the 2% minimum effect" in out
    assert MIN_EFFECT == 0.02


def test_the_interval_guard_catches_overlapping_runs_whose_gap_exceeds_the_spread():
    # medians 100 -> 160, a gap of 60 over spreads of 50, but B's low repeat is under A's high
    j = judge(_var("x", [100, 100, 150]), _var("x", [110, 160, 160]))
    assert j.verdict == NO_DIFF and j.lo < 1 and "interval" in j.note


def test_the_spread_guard_catches_an_outlier_the_interval_misses():
    # 10 repeats: the medians' interval excludes 1, but one outlier per run makes the
    # spread (about 150) larger than the gap of the medians (50)
    a = [1000, 1001, 999, 1002, 998, 1000, 1001, 999, 1000, 1150]
    b = [1050, 1051, 1049, 1052, 1048, 1050, 1051, 1049, 1050, 900]
    j = judge(_var("x", a), _var("x", b))
    assert j.lo > 1 and j.verdict == NO_DIFF and "spread" in j.note


def test_too_few_repeats_keeps_the_verdict_and_says_why(tmp_path, capsys):
    out = _diff(tmp_path, capsys, _run({"dali": [1000]}), _run({"dali": [2000, 2010, 1990]}))
    row = _table(out)["dali"]
    assert row.endswith(NO_DIFF) and " 2.000 " in row and "[" not in row
    assert "note: dali: too few repeats (A 1, B 3" in out


def test_ratio_ci_known_inputs():
    assert ratio_ci([5.0, 5.0, 5.0], [5.0, 5.0, 5.0]) == (1.0, 1.0, 1.0)
    assert ratio_ci([100.0] * 4, [50.0] * 3) == (0.5, 0.5, 0.5)
    r, lo, hi = ratio_ci([100, 110, 90], [200, 220, 180])
    assert r == 2.0 and 180 / 110 <= lo < 2 < hi <= 220 / 90
    assert ratio_ci([100, 110, 90], [200, 220, 180]) == (r, lo, hi)  # seeded: reproducible
    assert all(math.isnan(x) for x in ratio_ci([], [1.0]))
    assert all(math.isnan(x) for x in ratio_ci([0.0, 0.0], [1.0, 2.0]))


def test_table_rows_pair_the_ceiling_and_each_variant():
    a, b = _run({"dali": SAME_A}), _run({"dali": [800, 810, 795, 805, 798]})
    (ceiling, dali) = table_rows(a, b)
    assert (dali.label, dali.a, dali.b, dali.ratio, dali.verdict) == ("dali", 1000, 800, 0.8,
                                                                      "slower")
    assert ceiling.label == "ceiling" and ceiling.verdict == NO_DIFF
    assert judge(a.variant("dali"), b.variant("dali"))[:1] == (0.8,)


def test_json_is_strict_and_holds_the_rows(tmp_path, capsys):
    out = _diff(tmp_path, capsys, _run({"dali": SAME_A, "pinned": [1]}, ceiling=None),
                _run({"dali": [800, 810, 795, 805, 798], "pinned": [2], "pageable": [1, 1]},
                     ceiling=None), "--json")
    doc = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    by = {r["label"]: r for r in doc["rows"]}
    assert set(by) == {"dali", "pinned"} and doc["not_in_both"] == ["pageable"]
    assert by["dali"]["verdict"] == "slower" and by["dali"]["hi"] < 1 and by["dali"]["n_a"] == 5
    assert by["pinned"]["verdict"] == NO_DIFF and by["pinned"]["lo"] is None
    assert "too few repeats" in by["pinned"]["note"]


def test_repeats_in_one_process_are_noted(tmp_path, capsys):
    def run(pids):
        return SuiteResult({"gpu": "H200"}, {"model": "m"}, None,
                           (_var("dali", SAME_A, pids),))
    out = _diff(tmp_path, capsys, run([7] * 5), run([1, 2, 3, 4, 5]))
    assert "note: A ran each variant's repeats in one process" in out
    assert "note: B ran" not in out


def test_a_small_change_between_runs_in_one_process_each_is_not_called():
    """Seen in CI: two runs of one command, each in one process, apart by more than 2% with
    tight repeats. Such a change is called only in fresh processes, where the spread is the one
    between processes."""
    tight_a, tight_b = [100.0, 100.2, 99.9, 100.1, 100.0], [96.0, 96.1, 95.9, 96.0, 96.2]
    one = judge(_var("pinned", tight_a, [7] * 5), _var("pinned", tight_b, [8] * 5))
    assert one.verdict == NO_DIFF and "under the 5% minimum effect (repeats in one process)" \
        in one.note
    fresh = judge(_var("pinned", tight_a, [1, 2, 3, 4, 5]), _var("pinned", tight_b,
                                                                 [6, 7, 8, 9, 10]))
    assert fresh.verdict == "slower"
    big = judge(_var("pinned", tight_a, [7] * 5), _var("pinned", [x * 0.85 for x in tight_b],
                                                       [8] * 5))
    assert big.verdict == "slower"  # a 20%-slower step still shows


def test_a_cold_run_against_a_warm_one_is_compared_and_noted(tmp_path, capsys):
    warm = _run({"pageable": SAME_A})
    cold = SuiteResult(warm.env, {**warm.setup, "cold": True}, warm.ceiling,
                       (_var("pageable", [700, 705, 698, 702, 699]),))
    out = _diff(tmp_path, capsys, warm, cold)
    assert "note: page cache: warm in A, cold (--cold) in B" in out
    assert _table(out)["pageable"].endswith("slower")
    assert "page cache" not in _diff(tmp_path, capsys, warm, warm)


def test_a_long_window_is_noted(tmp_path, capsys):
    a = _run({"pageable": SAME_A})
    b = SuiteResult(a.env, {**a.setup, "long": True, "fit_queue": True}, a.ceiling, a.variants)
    out = _diff(tmp_path, capsys, a, b)
    assert "note: window: default in A, long (--long) in B" in out
    # a run from before FIT_QUEUES (no fit_queue) against a default run after it
    assert ("note: window length: --steps batches in A, at least 4x the queue (no --steps) "
            "in B") in out
    assert "window" not in _diff(tmp_path, capsys, b, b)


def test_another_host_or_software_is_noted_and_not_refused(tmp_path, capsys):
    a = _run({"pinned": SAME_A})
    env = {"gpu": "H200", "platform": "Linux-6.18-v657", "torch": "2.11.0", "pillow": "12.3.0"}
    a = SuiteResult(env, a.setup, a.ceiling, a.variants)
    b = SuiteResult({**env, "platform": "Linux-6.18-v973", "torch": "2.11.0"}, a.setup,
                    a.ceiling, a.variants)
    out = _diff(tmp_path, capsys, a, b)
    assert ("note: another host or software (platform: 'Linux-6.18-v657' -> 'Linux-6.18-v973')"
            in out)
    assert "torch:" not in out and "pillow" not in out  # unchanged facts are not listed
    assert _table(out)["pinned"].endswith(NO_DIFF)
    assert "another host" not in _diff(tmp_path, capsys, a, a)
    bare = SuiteResult({"gpu": "H200"}, a.setup, a.ceiling, a.variants)  # older files
    assert "another host" not in _diff(tmp_path, capsys, a, bare)


def _halved(label, sps, gap):
    """Repeats whose windows' halves differ by ``gap`` samples/s."""
    return VariantResult(label, label.split()[0], {}, 1.0, tuple(
        Repeat(s, 1.0, 1.0, 1.0, 1.0, halves=(s + gap / 2, s - gap / 2),
               loader_only_halves=(0.5, 1.5)) for s in sps))


def test_the_within_window_spread_is_reported_and_survives_json(tmp_path):
    a_sps = [1000, 1004, 998, 1002, 1001]
    wobbly = _halved("pinned", a_sps, 300.0)
    assert wobbly.within_spread() == 300.0 and wobbly.spread("samples_per_s") == 6
    run = SuiteResult({"gpu": "H200"}, {"model": "resnet50"}, None, (wobbly,))
    run.dump(tmp_path / "r.json")
    back = SuiteResult.load(tmp_path / "r.json").variants[0]
    assert back.repeats[0].halves == (1150.0, 850.0) and back.within_spread() == 300.0
    assert back.repeats[0].loader_only_halves == (0.5, 1.5)
    assert "| pinned | 6.0 | 300.0 |" in markdown(run, details=True)


def test_a_wide_within_window_spread_raises_the_noise_floor():
    """Issue 19: the noise verdict uses the larger of the spread across repeats and the one
    within a window. Steady repeats (spread 6) whose windows swing by 300 between halves
    cannot call a 5% change; the same repeats with steady windows can."""
    from compare.diff import within_as_range

    a_sps, b_sps = [1000, 1004, 998, 1002, 1001], [1050, 1054, 1048, 1052, 1051]
    steady = judge(_halved("pinned", a_sps, 2.0), _halved("pinned", b_sps, 2.0))
    wobbly = judge(_halved("pinned", a_sps, 300.0), _halved("pinned", b_sps, 2.0))
    assert steady.verdict == "faster"
    assert wobbly.verdict == NO_DIFF and "within a window" in wobbly.note
    # five repeats: a range of d2(5) / (0.954 sqrt 2) = 1.724 gaps
    assert within_as_range(_halved("pinned", a_sps, 300.0)) == pytest.approx(517.2, abs=0.5)
    assert within_as_range(_halved("pinned", a_sps[:1], 300.0)) == 0.0  # one repeat: none


def test_measure_times_the_two_halves_of_its_window():
    import time

    import torch

    from compare.metrics import measure

    calls = []

    def step(x, y):  # the second half of the window is three times slower
        calls.append(1)
        time.sleep(0.02 if len(calls) <= 2 + 4 else 0.06)  # long enough for a loaded machine

    batches = iter(lambda: (torch.zeros(2, 1), torch.zeros(2)), None)
    m = measure(batches, step, steps=8, warmup=2, device=torch.device("cpu"))
    first, second = m.halves()
    assert len(m.starts_ms) == 8 and 2.0 < first / second < 4.5
    assert measure(batches, step, steps=3, warmup=0, device=torch.device("cpu")).halves() is None


def test_a_jobs_halves_are_the_sum_of_its_ranks_like_its_rate():
    from compare.ddp import merge

    ranks = [_halved("pinned", [100.0], 20.0), _halved("pinned", [100.0], 10.0)]
    job = merge(ranks).repeats[0]
    assert job.samples_per_s == 200.0 and job.halves == (215.0, 185.0)
    assert job.loader_only_halves == (1.0, 3.0)
    ranks[1] = VariantResult("pinned", "pinned", {}, 1.0, (Repeat(100.0, 1.0, 1.0, 1.0, 1.0),))
    assert merge(ranks).repeats[0].halves is None
    assert merge(ranks).repeats[0].loader_only_halves is None


def _lo(run, values):
    """``run`` with its one variant's loader-only rates set to ``values``."""
    from dataclasses import replace

    v = run.variants[0]
    reps = tuple(replace(r, loader_only_per_s=x) for r, x in zip(v.repeats, values))
    return replace(run, variants=(replace(v, repeats=reps),))


def test_diff_judges_the_loader_only_rate_on_request(tmp_path, capsys):
    """A loader 20% slower alone, with the same training rate (bound by the GPU): the default
    metric sees nothing, ``--metric loader-only`` calls it slower and has no ceiling row."""
    a = _lo(_run({"pinned": SAME_A}), [5000, 5050, 4950, 5020, 4980])
    b = _lo(_run({"pinned": SAME_A}), [4000, 4040, 3960, 4010, 3990])
    out = _diff(tmp_path, capsys, a, b)
    assert "no significant difference" in out.split("pinned", 1)[1].splitlines()[0]
    lo = _diff(tmp_path, capsys, a, b, "--metric", "loader-only")
    row = [x for x in lo.splitlines() if x.startswith("pinned")][0]
    assert row.endswith("slower") and "0.800" in row and "A img/s" in lo
    assert not any(x.startswith("ceiling") for x in lo.splitlines())
    doc = json.loads(_diff(tmp_path, capsys, a, b, "--metric", "loader-only", "--json"))
    assert doc["metric"] == "loader_only_per_s" and doc["rows"][0]["verdict"] == "slower"
    same = _diff(tmp_path, capsys, a, _lo(_run({"pinned": SAME_A}), [5000, 5050, 4950, 5020,
                                                                       4980]),
                 "--metric", "loader-only")
    assert [x for x in same.splitlines() if x.startswith("pinned")][0].endswith(
        "no significant difference")


def test_the_loader_only_noise_floor_is_its_own_stretches():
    from compare.diff import within_as_range

    v = _halved("pinned", [1000, 1004, 998], 300.0)  # loader-only stretches 0.5 and 1.5 apart
    assert v.within_spread() == 300.0 and v.within_spread("loader_only_halves") == 1.0
    assert within_as_range(v, "loader_only_per_s") == pytest.approx(1.0 * 1.693 / 1.349)
    assert within_as_range(v) == pytest.approx(300.0 * 1.693 / 1.349)


def test_report_writes_the_summary_of_a_results_json_again(tmp_path, capsys):
    from compare.report import main as report

    run = _run({"dali": [100.0, 101.0]})
    run.dump(tmp_path / "results.json")
    assert report([str(tmp_path), "--out", str(tmp_path / "summary.md")]) == 0
    text = (tmp_path / "summary.md").read_text()
    assert text.startswith("# gpu-feed comparison") and "| dali |" in text
    capsys.readouterr()
    assert report([str(tmp_path / "results.json")]) == 0
    assert "| dali |" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text("{}")
    assert report([str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("python -m compare report: error: RESULTS.json:") and "\n" not in err


# what the probes removed in issue 42 wrote into a results.json: setup keys and repeat fields
OLD_SETUP = {"paired_long": True, "loader_only_last": False, "wait_sites": True,
             "compute_stream": "high"}
OLD_REPEAT = {"cpu_probe_ms": 9.5, "cpu_steal_pct": 0.2, "wait_sites": {"x.py:1": 1.0},
              "cpu_roles": {"training": {"main": 1.0}}, "paired_long": {"steps": 40},
              "cold_resident": 0.01}


def test_a_results_json_of_removed_probes_still_loads_diffs_reports_and_plots(tmp_path, capsys):
    """Unknown fields (probes since removed) are ignored; a kept probe's field is kept."""
    import json

    from compare.plot import main as plot
    from compare.report import main as report

    _run({"pinned": SAME_A}).dump(tmp_path / "new.json")
    doc = json.loads((tmp_path / "new.json").read_text())
    doc["setup"].update(OLD_SETUP)
    for r in doc["variants"][0]["repeats"]:
        r.update(OLD_REPEAT)
    (tmp_path / "old").mkdir()
    (tmp_path / "old/results.json").write_text(json.dumps(doc))
    old = SuiteResult.load(tmp_path / "old/results.json")
    assert old.variants[0].repeats[0].probes == {"cold_resident": 0.01}
    assert _table(_diff(tmp_path, capsys, old, _run({"pinned": SAME_A})))["pinned"].endswith(
        NO_DIFF)
    assert report([str(tmp_path / "old")]) == 0 and "| pinned |" in capsys.readouterr().out
    assert plot([str(tmp_path / "old/results.json"), "--out", str(tmp_path / "png")]) == 0


def test_a_decoder_one_run_did_not_record_is_no_difference_but_two_decoders_are(tmp_path, capsys):
    """An older results.json has no ``decoder`` per repeat: its rows still pair with a newer
    run's; two runs that recorded different decoders are refused by name."""
    import dataclasses

    def decoded(run, name):
        v = run.variants[0]
        reps = tuple(dataclasses.replace(r, decoder=name) for r in v.repeats)
        return dataclasses.replace(run, variants=(dataclasses.replace(v, repeats=reps),))

    old, new = _run({"pinned": SAME_A}), decoded(_run({"pinned": SAME_A}), "torchvision")
    assert "pinned" in _table(_diff(tmp_path, capsys, old, new))
    out = _diff(tmp_path, capsys, decoded(old, "pil"), new)
    assert "pinned" not in _table(out)
    assert "decoder: 'pil' in A, 'torchvision' in B" in out
