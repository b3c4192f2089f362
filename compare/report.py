"""A ``SuiteResult`` as a terminal table, a markdown summary and PNG plots (``compare.plot``);
``python -m compare report RESULTS.json`` writes the summary again."""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from . import cli, owned
from .plot import plots as plots  # re-exported: compare.suite calls report.plots(suite, out)
from .probes import PROBES
from .results import FIT_QUEUES, OVER_CEILING, SPREAD_WARN, SuiteResult, VariantResult

SLOWER_STEP = 0.03  # a step this much slower than on resident batches is reported

COLUMNS = ("backend", "samples/s", "loader img/s", "wait p50 ms", "wait p95 ms", "GPU idle %",
           "% ceiling", "speed-up", "H2D KiB/sample", "CPU %", "NVML idle %")


def _f(x, fmt="{:.1f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _pm(v: VariantResult, metric: str, fmt="{:.1f}") -> str:
    m, s = v.median(metric), v.spread(metric)
    if len(v.repeats) < 2 or math.isnan(s):
        return _f(m, fmt)
    return f"{_f(m, fmt)} ±{_f(s / 2, fmt)}"


CPU_ONLY = ("no GPU was timed: these are CPU numbers ({}GPU idle % is not measured), and they do "
            "not predict GPU ones")  # {}: DALI's CPU operators, where a DALI row ran


def rows(res: SuiteResult) -> list[list[str]]:
    out = []
    gpu = res.on_gpu
    for v in res.variants:
        nv = v.median("nvml_util_pct")
        out.append([
            res.row_label(v) + "".join(p.row_suffix(res, v) for p in PROBES),
            _pm(v, "samples_per_s"),
            _pm(v, "loader_only_per_s", "{:.0f}"),
            _pm(v, "wait_p50_ms", "{:.2f}"), _pm(v, "wait_p95_ms", "{:.2f}"),
            _pm(v, "idle_pct") if gpu else "-", _f(res.pct_of_ceiling(v)),
            _f(res.speedup(v), "{:.2f}x"),
            _f(None if v.h2d_bytes_per_sample is None else v.h2d_bytes_per_sample / 1024),
            _f(v.median("cpu_util_pct"), "{:.0f}"), _f(None if math.isnan(nv) else 100 - nv),
        ])
    if res.ceiling is not None:
        c = res.ceiling
        out.append(["ceiling (on device)", _pm(c, "samples_per_s"), "-", "-", "-",
                    _pm(c, "idle_pct") if gpu else "-",
                    "100.0", _f(res.speedup(c), "{:.2f}x"), "0.0", "-", "-"])
    return out


def warnings_for(res: SuiteResult) -> list[str]:
    dali = "DALI ran its CPU operators, " if any(v.backend == "dali" for v in res.variants) else ""
    w = [] if res.on_gpu or not res.variants else [CPU_ONLY.format(dali)]
    for v in res.variants + ((res.ceiling,) if res.ceiling else ()):
        if v.noisy():
            w.append(f"{v.label}: samples/s spread {v.spread('samples_per_s'):.1f} is >= {SPREAD_WARN:.0%} "
                     f"of the median {v.median('samples_per_s'):.1f}; differences of that size are noise")
    steps, s = res.setup.get("steps"), res.setup
    for v in res.variants:
        timed = max((r.steps or 0 for r in v.repeats), default=0) or steps
        queue = v.queue_batches
        if queue is None and v.backend in ("pinned", "pageable"):  # results from before
            queue = (v.overrides.get("num_workers", s.get("workers") or 0)
                     * v.overrides.get("prefetch_factor", s.get("prefetch", 2)))
        if timed and queue and timed < queue:
            w.append(f"{v.label}: {timed} timed steps are fewer than the DataLoader's queue of "
                     f"{queue} batches (workers x prefetch); its numbers count batches decoded "
                     f"before the clock started. Use --steps >= {queue}, or --long")
    w += below_training_lines(res)
    w += [x for p in PROBES for x in p.warnings(res)]
    for v in res.variants:
        pct = res.pct_of_ceiling(v)
        if pct is not None and pct > OVER_CEILING:
            c = res.ceiling
            why = [f"the ceiling run varied by {c.spread('samples_per_s'):.1f} samples/s"
                   if c.noisy() else "the ceiling run itself was steady"]
            if not res.on_gpu:
                why.append("on the CPU the loader's workers and the model step share the cores, "
                           "so the ceiling (model alone) is not an upper bound")
            if steps and any("DataLoader's queue" in x and x.startswith(v.label) for x in w):
                why.append("the loader's queue was already full when the clock started")
            w.append(f"{v.label}: {pct:.1f}% of the ceiling is above {OVER_CEILING:.0f}%, which "
                     f"a loader cannot reach; treat this row as unmeasured ({'; '.join(why)})")
    b = res.baseline()
    if b is not None:
        for v in res.variants:
            if v is b:
                continue
            gap = abs(v.median("samples_per_s") - b.median("samples_per_s"))
            if gap <= max(v.spread("samples_per_s"), b.spread("samples_per_s")):
                w.append(f"{v.label} vs {b.label}: the difference ({gap:.1f} samples/s) is within "
                         "the spread: treat it as noise")
    return w


def verdict_lines(res: SuiteResult) -> list[str]:
    """One to three lines that answer "which backend?", printed first.

    NOTE [verdict first]
    The fastest non-reference row by median samples/s (loader-only img/s where no row has a
    training rate), with its % of the ceiling and speed-up (", within noise" when that gap is
    inside the spread, as for the runner-up); then the runner-up and whether the
    gap is inside ``compare diff``'s noise floor; then what qualifies the run (partial, CPU).
    The first line says "no significant difference" when that gap is inside the noise, and "no
    reliable winner" when the fastest row is above the ceiling, so it never names a winner that
    the lines after it take back."""
    from .diff import within_as_range

    s = res.setup
    alone = s.get("model") == "none" and not s.get("step")
    rows = [v for v in res.variants if v.backend != "reference"]

    def rate(v, metric):
        m = v.median(metric)
        return m if math.isfinite(m) else None

    metric, unit = "samples_per_s", "samples/s"
    where = "with no model step (--model none: the loader alone)" if alone else "in training"
    if not any(rate(v, metric) for v in rows) and any(rate(v, "loader_only_per_s") for v in rows):
        metric, unit, where = "loader_only_per_s", "img/s", "loader-only"
    ranked = sorted((v for v in rows if rate(v, metric) is not None),
                    key=lambda v: rate(v, metric), reverse=True)
    tail = []
    if not res.complete:
        tail.append(f"partial results: {len(res.variants)} of "
                    f"{len(s.get('variants') or ()) or '?'} variants finished")
    if not res.on_gpu and res.variants:
        tail.append("CPU numbers, which do not predict GPU ones")
    if not ranked:
        return ["Verdict: no backend row has a rate yet."] + ([f"({'; '.join(tail)}.)"] if tail else [])
    best = ranked[0]
    b = rate(best, metric)
    facts = [f"{b:.1f} {unit}"]
    pct = res.pct_of_ceiling(best) if metric == "samples_per_s" else None
    if pct is not None:
        facts.append(f"{pct:.1f}% of the model-only ceiling"
                     + (": see the warnings" if pct > OVER_CEILING else ""))
    else:
        facts[0] += " (no model-only ceiling was timed)"
    def noise(a, b) -> float | None:
        """``compare diff``'s noise floor for a gap between rows ``a`` and ``b`` (None: one
        repeat, no spread)."""
        if min(len(a.values(metric)), len(b.values(metric))) < 2:
            return None
        return max(a.spread(metric), b.spread(metric), within_as_range(a, metric),
                   within_as_range(b, metric))

    base = res.baseline()
    if base is not None and base is not best and metric == "samples_per_s":
        up = res.speedup(best)
        if up is not None and math.isfinite(up):
            floor = noise(best, base)
            quiet = floor is not None and b - rate(base, metric) <= floor
            facts.append(f"{up:.2f}x {base.label}" + (", within noise" if quiet else ""))
    second, within = [], False
    if len(ranked) > 1:
        ru = ranked[1]
        r = rate(ru, metric)
        gap = b - r
        head = (f"Runner-up {res.row_label(ru)}, {r:.1f} {unit}, is {100 * gap / b:.1f}% slower")
        floor = noise(best, ru)
        if floor is None:
            second.append(f"{head}; with one repeat there is no spread to tell noise by.")
        else:
            within = gap <= floor
            second.append(f"{head}: {'within' if within else 'beyond'} noise (the gap, "
                          f"{gap:.1f} {unit}, is {'inside' if within else 'larger than'} the "
                          f"measured spread, {floor:.1f} {unit}).")
    if pct is not None and pct > OVER_CEILING:
        first = (f"Verdict: no reliable winner {where}: the fastest row, {res.row_label(best)}, "
                 f"is above what a loader can reach ({', '.join(facts)}).")
    elif within:
        first = (f"Verdict: no significant difference {where} between "
                 f"{res.row_label(best)} ({', '.join(facts)}) and {res.row_label(ranked[1])}.")
    else:
        verb = "is the fastest" if len(ranked) > 1 else "is the only backend timed"
        first = f"Verdict: {res.row_label(best)} {verb} {where}: {', '.join(facts)}."
    lines = [first] + second
    if tail:
        lines.append(f"({'; '.join(tail)}.)")
    return lines


RANK_COLUMNS = ("backend", "rank", "samples/s", "loader img/s", "wait p50 ms", "wait p95 ms", "GPU idle %")


def rank_rows(res: SuiteResult) -> list[list[str]]:
    """Each rank's medians, per variant and for the ceiling (empty outside torchrun)."""
    out = []
    for v in res.variants + ((res.ceiling,) if res.ceiling else ()):
        for r in range(v.world if v.world > 1 else 0):
            out.append([v.label, str(r), _f(v.rank_median(r, "samples_per_s")),
                        _f(v.rank_median(r, "loader_only_per_s"), "{:.0f}"),
                        _f(v.rank_median(r, "wait_p50_ms"), "{:.2f}"),
                        _f(v.rank_median(r, "wait_p95_ms"), "{:.2f}"),
                        _f(v.rank_median(r, "idle_pct"))])
    return out


def grid(columns, body) -> str:
    """A plain-text table: the first column left-aligned, the others right-aligned."""
    data = [list(columns)] + body
    widths = [max(len(r[i]) for r in data) for i in range(len(columns))]
    line = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([line(data[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in body])


def table(res: SuiteResult) -> str:
    text = grid(COLUMNS, rows(res))
    per_rank = rank_rows(res)
    if per_rank:
        text += "\n\nper rank (medians over repeats):\n" + grid(RANK_COLUMNS, per_rank)
    return text


BELOW_TRAINING = 0.95  # loader-only under this share of the training rate is reported


def below_training_lines(res: SuiteResult) -> list[str]:
    """The rows whose loader-only rate fell below ``BELOW_TRAINING`` x their training rate in
    every repeat: one of the two windows missed the steady state."""
    out = []
    for v in res.variants:
        pairs = [(r.loader_only_per_s, r.samples_per_s) for r in v.repeats
                 if r.loader_only_per_s is not None and r.samples_per_s
                 and r.loader_only_per_s == r.loader_only_per_s]  # NaN: no loader-only run
        if not pairs or any(lo >= sps for lo, sps in pairs):
            continue
        ratio = statistics.median(lo / sps for lo, sps in pairs)
        if ratio < BELOW_TRAINING:
            halves = [r.loader_only_halves for r in v.repeats if r.loader_only_halves]
            ramp = (f"; the loader-only window's last stretch ran "
                    f"{statistics.median(b / a for a, b in halves):.2f}x its first at the median"
                    if halves and all(a > 0 for a, _ in halves) else "")
            out.append(f"{v.label}: its loader-only rate was below its training rate in every repeat "
                       f"({ratio:.2f}x at the median), which a steady loader cannot do: one of the two "
                       "windows missed the steady state (a start-up transient in the loader-only window, "
                       f"or batches made before the training window's clock){ramp}")
    return out


def _span(xs, fmt: str) -> str:
    """``"lo-hi"`` of ``xs`` in format ``fmt``, or one value when they agree."""
    lo, hi = format(min(xs), fmt), format(max(xs), fmt)
    return lo if lo == hi else f"{lo}-{hi}"


def window_lines(res: SuiteResult) -> list[str]:
    """Per variant: the timed window against the loader's queue, the decoder, the calibration
    and the settling warm-up."""
    out = []
    for v in res.variants:
        steps = [r.steps for r in v.repeats if r.steps]
        secs = [r.window_s for r in v.repeats if r.window_s]
        if not steps:
            continue
        q = v.queue_batches
        rel = f", {max(steps) / q:.1f}x its queue of {q} batches" if q else ""
        decoders = sorted({r.decoder for r in v.repeats if r.decoder})
        dec = f", {'/'.join(decoders)} decoder" if decoders else ""
        line = f"{v.label}: {max(steps)} batches, {_span(secs, '.1f')} s{rel}{dec}"
        cal = [f"{r.calibration[-1]} after {len(r.calibration)} decision(s)"
               for r in v.repeats if r.calibration]
        if cal:
            line += "; DALI tuner's last choice per repeat: " + " | ".join(cal)
        extra = [r.settle_batches for r in v.repeats if r.settle_batches is not None]
        if extra:
            stuck = sum(r.settled is False for r in v.repeats)
            line += (f"; after {_span(extra, 'd')} more warm-up batches until the workers "
                     "were out of step" + (f" (still in step at the cap in {stuck} of "
                                           f"{len(v.repeats)} repeats)" if stuck else ""))
        out.append(line)
    return out


def step_slowdown(res: SuiteResult, v: VariantResult) -> float | None:
    """How much longer ``v``'s step took than the ceiling's (busy time per sample), on a GPU
    with a ceiling, else ``None``: above 0, the loader's GPU work shared the device."""
    if not res.on_gpu or res.ceiling is None:
        return None
    c, r, idle = (res.ceiling.median("samples_per_s"), v.median("samples_per_s"), v.median("idle_pct"))
    if not (c > 0 and r > 0 and math.isfinite(idle)):
        return None
    return (1 - idle / 100) * c / r - 1


def contention_lines(res: SuiteResult) -> list[str]:
    """The rows whose step ran ``SLOWER_STEP`` or more slower than on resident batches."""
    out = []
    for v in res.variants:
        d = step_slowdown(res, v)
        if d is not None and d >= SLOWER_STEP:
            out.append(f"{res.row_label(v)}: the step took {100 * d:.1f}% longer than on resident batches")
    return out


def _block(heading: str, items: list[str]) -> list[str]:
    """A summary block: ``heading``, then one bullet per item; nothing without items."""
    return [heading, ""] + [f"- {x}" for x in items] + [""] if items else []


def md_table(columns, body) -> str:
    head = "| " + " | ".join(columns) + " |\n|" + "|".join("---" for _ in columns) + "|\n"
    return head + "".join("| " + " | ".join(r) + " |\n" for r in body)


def research_lines(res: SuiteResult) -> list[str]:
    """The order of the isolated repeats and the spreads."""
    s = res.setup
    lines: list[str] = []
    if s.get("isolate") and s.get("order"):
        lines += [f"**Order of the repeats** (seed {s.get('order_seed')}): {', '.join(s['order'])}.", ""]
    within = [(v.label, v.spread("samples_per_s"), gap) for v in res.variants
              if (gap := v.within_spread()) is not None]
    if within:
        lines += ["**Spreads of samples/s**: across repeats (max - min), and within one process (the median "
                  "gap between the two halves of a repeat's window). `compare diff` and the verdict take "
                  "the larger as their noise floor, the gap first scaled to a range over the repeats.", "",
                  "| backend | across repeats | within a window |", "|---|---|---|"]
        lines += [f"| {label} | {a:.1f} | {w:.1f} |" for label, a, w in within]
        lines += [""]
    return lines


def details_lines(res: SuiteResult) -> list[str]:
    """The research sections (``--details``), the probes' included."""
    lines = research_lines(res)
    lines += _block("**The step ran slower beside the loader** (busy time per sample against "
                    "the ceiling's; not data waits: the loader's own GPU work shared the device)",
                    contention_lines(res))
    lines += _block("**Timed windows** (training run; without `--steps` at least "
                    f"{FIT_QUEUES}x the queue; whole epochs when an epoch is at most twice the "
                    "window; `--long` makes them at least 10x the queue)", window_lines(res))
    for p in PROBES:
        lines += p.summary_lines(res)
    return lines


def _steps_run(res: SuiteResult) -> str:
    """``": N here"`` or ``": LO-HI here"``: the timed steps the repeats ran (none: "")."""
    n = sorted({r.steps for v in res.variants for r in v.repeats if r.steps})
    return "" if not n else f": {n[0]}{'' if len(n) == 1 else f'-{n[-1]}'} here"


def markdown(res: SuiteResult, details: bool = False) -> str:
    """summary.md: the verdict, the setup, the table, notes and warnings (and ``details``)."""
    s = res.setup
    e = res.env
    w = warnings_for(res)
    world = s.get("world_size") or 1
    job = (f"- torchrun job: {world} ranks on {s.get('nodes', 1)} node(s), {s.get('local_world_size', 1)} "
           "per node; DDP model step; batch and workers are per rank; samples/s and loader img/s are the "
           "job's (sum over ranks), waits and idle % the ranks' mean" if world > 1 else None)
    lines = [
        "# gpu-feed comparison",
        "",
        *[f"**Verdict:**{x[len('Verdict:'):]}" if x.startswith("Verdict:") else x
          for x in verdict_lines(res)],
        "",
        f"- GPU: {e.get('gpu', 'none')} (driver {e.get('driver', '-')}, CUDA {e.get('cuda_runtime', '-')}); "
        f"CPU: {e.get('cpu_count')} cores ({e.get('cpu_model')})",
        f"- torch {e.get('torch')}, torchvision {e.get('torchvision')}, DALI {e.get('dali')}",
        f"- data: {s.get('data')} ({s.get('dataset', {}).get('num_images', '?')} images, "
        f"mean {s.get('dataset', {}).get('mean_kib', '?')} KiB)",
        (f"- step {s['step']}" if s.get("step") else f"- model {s.get('model')}")
        + f", batch {s.get('batch_size')}, {s.get('steps')} timed steps"
        + (f" (at least {FIT_QUEUES}x each loader's queue{_steps_run(res)})"
           if s.get("fit_queue") else "")
        + f" after {s.get('warmup')} warm-up, {s.get('repeats')} repeats, dtype {s.get('dtype')}, "
        f"channels_last {s.get('channels_last')}, workers {s.get('workers')}",
        f"- augmentation: {s.get('augment')}",
        *([job] if job else []),
        "",
        "Values are medians over repeats, ± half the range. % ceiling compares with the same step "
        "on a batch already on the device.",
        "",
    ]
    if s.get("isolate"):
        lines += [f"Each repeat ran in a fresh process, in a seeded interleaved order (seed "
                  f"{s.get('order_seed')}, listed under the table), so the ± is the spread "
                  "across processes.", ""]
    elif res.variants and (s.get("world_size") or 1) == 1:
        lines += ["Every repeat of a variant ran in one process, so the ± is the spread within "
                  "a process; it understates the difference between two runs (`--isolate` "
                  "measures across processes).", ""]
    if not res.complete:
        planned = len(s.get("variants") or ()) or "?"
        why = f" Stopped by: {s['error']}" if s.get("error") else ""
        lines += [f"**Partial results**: {len(res.variants)} of {planned} variants finished "
                  f"(`complete: false` in results.json).{why}", ""]
    lines += [md_table(COLUMNS, rows(res))]
    if world > 1:
        lines += ["**Per rank** (medians over repeats)", "", md_table(RANK_COLUMNS, rank_rows(res))]
    if details:
        lines += details_lines(res)
    if s.get("notes"):
        lines += ["**Notes**", ""] + [f"- {x}" for x in s["notes"]] + [""]
    if w:
        lines += ["**Warnings**", ""] + [f"- {x}" for x in w] + [""]
    return "\n".join(lines)


PROG = "python -m compare report"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m compare report``: the summary of a results.json, on stdout or ``--out``."""
    from .plot import read

    p = argparse.ArgumentParser(
        prog=PROG, description="Write the markdown summary of a suite results.json again, with "
                               "what this version of the report says.")
    p.add_argument("results", metavar="RESULTS.json",
                   help="a results.json written by python -m compare, or the folder holding it")
    p.add_argument("--out", metavar="FILE", default=None, help="write the summary here (default: print it)")
    p.add_argument("--details", action="store_true",
                   help="add the research sections (spreads, windows, the probes' sections)")
    a = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        src, res = read(a.results)
        text = markdown(res, a.details)
        if a.out is not None:  # never over the results it reads, nor a file of another's
            owned.check_out(Path(a.out).parent, "--out", [Path(a.out).name], [src], "summary.md")
    except ValueError as e:
        return cli.fail(PROG, e)
    if a.out is None:
        print(text)
        return 0
    try:
        Path(a.out).write_text(text + "\n")
    except OSError as e:
        return cli.fail(PROG, f"--out: cannot write {a.out!r} ({e.strerror or e})")
    print(a.out)
    return 0
