"""Turn a ``SuiteResult`` into a terminal table, a markdown summary and PNG plots.

The plots are drawn by ``compare.plot`` (``python -m compare plot`` redraws them from a
``results.json``); ``plots`` is re-exported here for the suite. ``python -m compare report
RESULTS.json`` writes the summary again from a ``results.json``, with what this version of
the report says (``main``)."""
from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from .cpuroles import ROLES, RUNQ
from .pagecache import TOOK_THRESHOLD as COLD_TOOK
from .plot import plots as plots  # re-exported: compare.suite calls report.plots(suite, out)
from .results import (
    FIT_QUEUES,
    OVER_CEILING,
    SPREAD_WARN,
    STEAL_WARN_PCT,
    SuiteResult,
    VariantResult,
    per_worker_core,
    role_medians,
    steal_span,
    worker_kernel,
)
from .waves import LONG_WAIT_FLOOR_MS, LONG_WAIT_TIMES, in_step, long_waits

COLD_SHARE = 0.5  # a --cold row with less of its window read cold than this is warned about
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


CPU_ONLY = ("no GPU was timed: these are CPU numbers (DALI ran its CPU operators, GPU idle % is "
            "not measured), and they do not predict GPU ones")


def rows(res: SuiteResult) -> list[list[str]]:
    out = []
    gpu = res.on_gpu
    for v in res.variants:
        nv = v.median("nvml_util_pct")
        out.append([
            res.row_label(v) + cold_label(res, v), _pm(v, "samples_per_s"),
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


def is_cold(res: SuiteResult, v) -> bool:
    """Whether row ``v`` of a ``--cold`` run was timed cold: every repeat recorded an eviction
    that took (at most ``COLD_TOOK`` of the pages still cached after it)."""
    got = [r.cold_resident for r in v.repeats]
    return (bool(res.setup.get("cold")) and bool(got)
            and all(x is not None and x <= COLD_TOOK for x in got))


def cold_label(res: SuiteResult, v) -> str:
    """The row label's suffix in a ``--cold`` run: `` (cold)`` only where the eviction took."""
    if not res.setup.get("cold"):
        return ""
    return " (cold)" if is_cold(res, v) else " (NOT cold: the eviction did not take)"


def warnings_for(res: SuiteResult) -> list[str]:
    w = [] if res.on_gpu or not res.variants else [CPU_ONLY]
    for v in res.variants + ((res.ceiling,) if res.ceiling else ()):
        if v.noisy():
            w.append(f"{v.label}: samples/s spread {v.spread('samples_per_s'):.1f} is >= "
                     f"{SPREAD_WARN:.0%} of the median {v.median('samples_per_s'):.1f}; "
                     "differences of that size are noise")
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
        stale = [r.cold_resident for r in v.repeats
                 if r.cold_resident is not None and r.cold_resident > COLD_TOOK]
        if stale:
            w.append(f"{v.label}: the page-cache eviction did not take ({100 * max(stale):.1f}% "
                     "of the dataset still cached after it): this row is not a cold run")
        c = cold_share(res, v)
        if c is not None and c[0] < COLD_SHARE:
            w.append(f"{v.label}: at most {100 * c[0]:.0f}% of its window was read cold: the "
                     f"dataset is smaller than what the loader reads after the eviction. A cold "
                     f"window needs at least {c[2]} images")
    w += in_step_lines(res) + below_training_lines(res)
    probe = probe_span(res)
    if probe is not None and probe[2] > HOST_SPREAD_WARN:
        w.append(f"the host CPU probe varied by {probe[2]:.0%} across the run ("
                 f"{probe[0]:.2f}-{probe[1]:.2f} ms; compare.hostprobe): a noisy host, whose "
                 "noise the CPU-bound rows' spread holds as well as the loaders'")
    steal = steal_span(res)
    if steal is not None and steal[1] > STEAL_WARN_PCT:
        w.append(f"the hypervisor took up to {steal[1]:.1f}% of the CPU from this machine "
                 "during a training window (steal in /proc/stat): other tenants' load, which "
                 "moves the CPU-bound rows")
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
    """One to three lines that answer "which backend?", the summary's and the terminal's first.

    NOTE [verdict first]
    The fastest row by its median rate (samples/s, the table's first figure): in training, or
    of the loader alone under ``--model none``; the loader-only img/s only where no row has a
    training rate. The ``--reference`` rows are yardsticks,
    not backends, and are left out. The first line gives its rate, its % of the model-only
    ceiling and its speed-up over ``pageable``; the second the runner-up and whether the gap is
    inside the measured spread: the larger of the two rows' ranges across repeats and of their
    spreads within a window put on that scale (``compare.diff.within_as_range``), the noise
    floor ``compare diff`` uses; with one repeat there is no spread to judge by. A third line
    says what qualifies the whole run (partial results, CPU numbers)."""
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
        return ["Verdict: no backend row has a rate yet."] + (
            [f"({'; '.join(tail)}.)"] if tail else [])
    best = ranked[0]
    b = rate(best, metric)
    facts = [f"{b:.1f} {unit}"]
    pct = res.pct_of_ceiling(best) if metric == "samples_per_s" else None
    if pct is not None:
        facts.append(f"{pct:.1f}% of the model-only ceiling"
                     + (" (above what a loader can reach: see the warnings)"
                        if pct > OVER_CEILING else ""))
    else:
        facts[0] += " (no model-only ceiling was timed)"
    base = res.baseline()
    if base is not None and base is not best and metric == "samples_per_s":
        up = res.speedup(best)
        if up is not None and math.isfinite(up):
            facts.append(f"{up:.2f}x {base.label}")
    verb = "is the fastest" if len(ranked) > 1 else "is the only backend timed"
    lines = [f"Verdict: {res.row_label(best)} {verb} {where}: {', '.join(facts)}."]
    if len(ranked) > 1:
        ru = ranked[1]
        r = rate(ru, metric)
        gap = b - r
        head = (f"Runner-up {res.row_label(ru)}, {r:.1f} {unit}, is {100 * gap / b:.1f}% "
                "slower")
        if min(len(best.values(metric)), len(ru.values(metric))) < 2:
            lines.append(f"{head}; with one repeat there is no spread to tell noise by.")
        else:
            noise = max(best.spread(metric), ru.spread(metric),
                        within_as_range(best, metric), within_as_range(ru, metric))
            if gap <= noise:
                lines.append(f"{head}: within noise (the gap, {gap:.1f}, is inside the "
                             f"measured spread, {noise:.1f}).")
            else:
                lines.append(f"{head}: beyond noise (the gap, {gap:.1f}, is larger than the "
                             f"measured spread, {noise:.1f}).")
    if tail:
        lines.append(f"({'; '.join(tail)}.)")
    return lines


RANK_COLUMNS = ("backend", "rank", "samples/s", "loader img/s", "wait p50 ms", "wait p95 ms",
                "GPU idle %")


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


def table(res: SuiteResult, columns=COLUMNS, body=None) -> str:
    data = [list(columns)] + (rows(res) if body is None else body)
    widths = [max(len(r[i]) for r in data) for i in range(len(columns))]
    line = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    sep = "  ".join("-" * w for w in widths)
    text = "\n".join([line(data[0]), sep] + [line(r) for r in data[1:]])
    per_rank = rank_rows(res) if body is None else []
    if per_rank:
        text += "\n\nper rank (medians over repeats):\n" + table(res, RANK_COLUMNS, per_rank)
    return text


def in_step_lines(res: SuiteResult) -> list[str]:
    """The ``pinned`` rows (workers that run across epochs) whose windows were mostly
    ``in_step``: their rate is a start-up transient's, even after settling (NOTE [settling] in
    compare.runner).
    ``pageable`` and the plain recipe restart their workers every epoch, so for them the waves
    are the steady state, which whole-epoch windows time."""
    out = []
    if (res.setup.get("world_size") or 1) > 1:  # a job's waits are its ranks', end to end
        return out
    for v in res.variants:
        if v.backend != "pinned" or v.overrides.get("epoch_stream") is False:
            continue
        workers = v.overrides.get("num_workers", res.setup.get("workers")) or 0
        hit = sum(in_step(r.waits_ms, workers) for r in v.repeats)
        how = "a longer --warmup" if res.setup.get("long") else "--long or a longer --warmup"
        if v.repeats and 2 * hit >= len(v.repeats):
            out.append(f"{v.label}: in {hit} of {len(v.repeats)} repeats the data waits came "
                       f"every {workers} batches: the {workers} workers delivered in step, a "
                       "start-up transient that can outlast the window, so this rate can be "
                       f"below the steady state. Time past it with {how}")
    return out


BELOW_TRAINING = 0.95  # loader-only under this share of the training rate is reported


def below_training_lines(res: SuiteResult) -> list[str]:
    """The rows whose loader-only rate fell below their training rate in every repeat, by
    more than ``BELOW_TRAINING`` at the median. A loader cannot feed training faster than it
    runs alone, so one of the two windows missed the steady state: on the H200 DALI's first
    epoch fell in the loader-only window (docs/results/h200/README.md, dali-first-epoch), and
    the suite's windows did before their fixes (suite-steady-state)."""
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
            out.append(f"{v.label}: its loader-only rate was below its training rate in every "
                       f"repeat ({ratio:.2f}x at the median), which a steady loader cannot do: "
                       "one of the two windows missed the steady state (a start-up transient "
                       "in the loader-only window, or batches made before the training "
                       f"window's clock){ramp}")
    return out


HOST_SPREAD_WARN = 0.10  # a probe range wider than this share of its low end is reported


def probe_span(res: SuiteResult) -> tuple[float, float, float] | None:
    """``(fastest, slowest, slowest / fastest - 1)`` of the run's host CPU probes
    (``Repeat.cpu_probe_ms``), or ``None`` without any."""
    got = [r.cpu_probe_ms for v in res.variants for r in v.repeats if r.cpu_probe_ms]
    if not got:
        return None
    return min(got), max(got), max(got) / min(got) - 1


def _span(xs, fmt: str) -> str:
    """``"lo-hi"`` of ``xs`` in format ``fmt``, or one value when they agree."""
    lo, hi = format(min(xs), fmt), format(max(xs), fmt)
    return lo if lo == hi else f"{lo}-{hi}"


def window_lines(res: SuiteResult) -> list[str]:
    """Per variant: the timed window in batches and seconds against the loader's queue
    (compare.isolate NOTE [steady state]), the torch backends' decoder (``pinned`` picks one
    from the data: NOTE [the default decoder] in pipelines/torch_backend/decode.py), and the
    warm-up that ran until its workers were out of step (NOTE [settling] in compare.runner)."""
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
            line += "; calibration's last choice per repeat: " + " | ".join(cal)
        extra = [r.settle_batches for r in v.repeats if r.settle_batches is not None]
        if extra:
            stuck = sum(r.settled is False for r in v.repeats)
            line += (f"; after {_span(extra, 'd')} more warm-up batches until the workers "
                     "were out of step" + (f" (still in step at the cap in {stuck} of "
                                           f"{len(v.repeats)} repeats)" if stuck else ""))
        out.append(line)
    return out


def cold_share(res: SuiteResult, v) -> tuple[float, int, int] | None:
    """``(share, read first, images needed)`` for variant ``v`` of a ``--cold`` run: the
    largest share of its window that can have been read from disk, the samples the loader read
    between the eviction and the window (the drained queue and the warm-up, settling
    included), and the dataset size a wholly cold window needs (per rank: a rank reads
    ``num_images / world_size`` files). ``None`` when the run does not say."""
    s = res.setup
    data = s.get("dataset")
    images = data.get("num_images") if isinstance(data, dict) else None
    batch, warmup, world = s.get("batch_size") or 0, s.get("warmup") or 0, s.get("world_size") or 1
    steps = max((r.steps or 0 for r in v.repeats), default=0)
    if not (s.get("cold") and images and batch and steps):
        return None
    settle = max((r.settle_batches or 0 for r in v.repeats), default=0)
    first = ((v.queue_batches or 0) + warmup + settle) * batch
    share = (images / world - first) / (steps * batch)
    return min(1.0, max(0.0, share)), first, (first + steps * batch) * world


def cold_lines(res: SuiteResult) -> list[str]:
    """The ``cold_share`` of each variant, as the summary says it."""
    out = []
    for v in res.variants:
        c = cold_share(res, v)
        if c is not None:
            out.append(f"{v.label}: at most {100 * c[0]:.0f}% of the window read cold "
                       f"({c[1]} samples were read between the eviction and the window)")
    return out


def step_slowdown(res: SuiteResult, v: VariantResult) -> float | None:
    """How much longer ``v``'s model step took than the ceiling's, on a GPU: the busy share of
    its window, ``1 - idle``, over its rate, against the ceiling's time per sample. Above 0 the
    step itself ran slower beside the loader, with no wait for data to blame: the loader's own
    GPU work (decode, augmentation, copies) shared the device. ``None`` off the GPU (no idle
    from CUDA events) or without a ceiling."""
    if not res.on_gpu or res.ceiling is None:
        return None
    c, r, idle = (res.ceiling.median("samples_per_s"), v.median("samples_per_s"),
                  v.median("idle_pct"))
    if not (c > 0 and r > 0 and math.isfinite(idle)):
        return None
    return (1 - idle / 100) * c / r - 1


def contention_lines(res: SuiteResult) -> list[str]:
    """The rows whose step ran ``SLOWER_STEP`` or more slower than on resident batches."""
    out = []
    for v in res.variants:
        d = step_slowdown(res, v)
        if d is not None and d >= SLOWER_STEP:
            out.append(f"{res.row_label(v)}: the step took {100 * d:.1f}% longer than on "
                       "resident batches")
    return out


def long_wait_lines(res: SuiteResult) -> list[str]:
    """The rows whose training windows held ``LONG_WAITS_MIN`` or more long data waits
    (``waves.long_waits``) at the median: how many, how far apart, how long, and their share of
    the window's wait. A loader that stalls now and then on a step it keeps up with on average
    shows here; one that is simply too slow waits every batch and does not. Left out under
    torchrun, whose waits are the ranks' end to end."""
    out: list[str] = []
    if (res.setup.get("world_size") or 1) > 1:
        return out
    for v in res.variants:
        per = []
        for r in v.repeats:
            w = list(r.waits_ms)
            long = long_waits(w)
            if w and sum(w) > 0:
                per.append((len(long), len(w), statistics.median([w[i] for i in long])
                            if long else 0.0, sum(w[i] for i in long) / sum(w)))
        if not per:
            continue
        n, size, ms, share = (statistics.median(x) for x in zip(*per))
        if n >= LONG_WAITS_MIN:
            hw = hw_share(v)
            out.append(f"{res.row_label(v)}: {n:g} long waits in {size:g} batches (one every "
                       f"{size / n:.1f}), {ms:.0f} ms each, {100 * share:.0f}% of the window's "
                       "data wait (medians over the repeats)"
                       + (f". DALI's hardware decoder was on (hw {hw:g}): its batches wait for "
                          "the GPU work queued before them, the step's included; "
                          "hw_decoder_load=0 trains without that wait, None measures which "
                          "suits (docs/investigations/dali-hardware-decoder.md)" if hw else ""))
    return out


def hw_share(v: VariantResult) -> float:
    """The hardware decoder's largest share in ``v``'s repeats, from their decoder
    (``nvJPEG hw X``); 0.0 for other loaders and DALI's CPU operators."""
    shares = [float(m.group(1)) for r in v.repeats if r.decoder
              and (m := re.search(r"nvJPEG hw ([0-9.]+)", r.decoder))]
    return max(shares, default=0.0)


def wait_site_lines(res: SuiteResult, top: int = 3) -> list[str]:
    """Per row sampled with ``--wait-sites``: its ``top`` wait sites, each with its mean share
    of the samples over the repeats (``waitsites.merge``)."""
    from .waitsites import merge

    out: list[str] = []
    for v in res.variants:
        sites = merge(r.wait_sites for r in v.repeats)
        if sites:
            out.append(f"{res.row_label(v)}: " + "; ".join(
                f"{100 * share:.0f}% `{site}`" for site, share in list(sites.items())[:top]))
    return out


PAIRED_AGREE = 0.05  # --paired-long: long / default within this of 1 agrees (issue 19's 5%)


def paired_effect(pairs: Sequence[tuple[float, float, float | None, bool]]
                  ) -> tuple[float, float | None, float, float]:
    """The long window's effect on a rate, from one ``(default, long, default again or None,
    long_first)`` per repeat (compare.runner NOTE [paired long]): the effect, the drift (the
    later window's rate over the earlier's; ``None`` where it cannot be told) and the range of
    the repeats' figures. Bracketed repeats (a default again in every one): each repeat's
    long / sqrt(default * default again), their median, and the median of default again /
    default. Otherwise the pairs of the first H200 run, read as a crossover: a pair timed
    default first gives the effect times the drift, one timed long first the effect over it,
    so the effect is the geometric mean of the two orders' medians and the drift the square
    root of their quotient; with one order only, the median and no drift. The range is then
    the pairs' long / default."""
    if all(again is not None for _, _, again, _ in pairs):
        each = [lg / math.sqrt(d * again) for d, lg, again, _ in pairs]
        drift = statistics.median(again / d for d, _, again, _ in pairs)
        return statistics.median(each), drift, min(each), max(each)
    ratios = [(lg / d, long_first) for d, lg, _, long_first in pairs]
    ab = [x for x, long_first in ratios if not long_first]
    ba = [x for x, long_first in ratios if long_first]
    lo, hi = min(x for x, _ in ratios), max(x for x, _ in ratios)
    if not ab or not ba:
        return statistics.median(x for x, _ in ratios), None, lo, hi
    mab, mba = statistics.median(ab), statistics.median(ba)
    return math.sqrt(mab * mba), math.sqrt(mab / mba), lo, hi


def _paired_per_core(pairs, least: float = 0.5) -> tuple[float, float, float] | None:
    """The medians over bracketed repeats of the training rate over the workers' cores in the
    default, long and second default window (compare.cpuroles NOTE [cpu roles]): whether a
    drift was fewer cores or less made with each. ``None`` without the split or workers."""
    rows = []
    for p, r in pairs:
        got = [(rate, roles) for rate, roles in ((r.samples_per_s, r.cpu_roles),
                                                 (p["samples_per_s"], p.get("cpu_roles")),
                                                 (p["after"]["samples_per_s"],
                                                  p["after"].get("cpu_roles")))]
        if not all(roles and roles["training"]["workers"] >= least for _, roles in got):
            return None
        rows.append([rate / roles["training"]["workers"] for rate, roles in got])
    return tuple(statistics.median(x[i] for x in rows) for i in range(3)) if rows else None


def _paired_rss(pairs) -> tuple[float, float] | None:
    """The medians over bracketed repeats of the process's resident memory at the end of the
    first and the second default training window (compare.cpuroles NOTE [cpu roles]): whether
    the process that forks a loader's workers grew. ``None`` where it was not recorded."""
    from .cpuroles import MEMORY

    key = MEMORY["VmRSS"]
    got = [((r.cpu_roles or {}).get("training", {}).get(key),
            ((p["after"].get("cpu_roles") or {}).get("training", {})).get(key)) for p, r in pairs]
    if not got or any(a is None or b is None for a, b in got):
        return None
    return statistics.median(a for a, _ in got), statistics.median(b for _, b in got)


def _one_sided(sides: list[tuple[str, float, float]], moved: float) -> str:
    """A bracketed row whose rate moved more than ``PAIRED_AGREE`` between its default
    windows: the bracket's reading assumes the move was linear (compare.runner NOTE [paired
    long]), which one long window cannot check, so the line gives long over each default window
    alone too: the readings if the move was a step after or before the long window. Empty
    otherwise."""
    if not sides or moved <= PAIRED_AGREE:
        return ""
    said = "; ".join(f"{x:.3f} and {y:.3f} {what}" for what, x, y in sides)
    both = all(abs(v - 1) <= PAIRED_AGREE for _, x, y in sides for v in (x, y))
    return (f"; the rate moved {100 * moved:.0f}% between the default windows, and the bracket "
            f"assumes it moved linearly: long over the first default window alone and over "
            f"the second read {said}"
            + (f" (within {100 * PAIRED_AGREE:g}% either way)" if both else ""))


def paired_long_lines(res: SuiteResult) -> list[str]:
    """Per row timed with ``--paired-long`` (compare.runner NOTE [paired long]): the long
    window's effect on the rate with the drift within each process taken out
    (``paired_effect``), the repeats' range and the drift, in training and loader-only, and
    whether both effects are within ``PAIRED_AGREE`` of 1."""
    def usable(x) -> bool:
        return bool(x) and not math.isnan(x)

    out: list[str] = []
    for v in res.variants:
        pairs = [(r.paired_long, r) for r in v.repeats if r.paired_long]
        if not pairs:
            continue
        bracketed = all("after" in p for p, _ in pairs)
        parts, ok, moved, sides = [], True, [0.0], []
        for what, key, of in (("in training", "samples_per_s", lambda r: r.samples_per_s),
                              ("loader-only", "loader_only_per_s",
                               lambda r: r.loader_only_per_s)):
            xs = [(of(r), p[key], p["after"][key] if bracketed else None,
                   bool(p.get("long_first"))) for p, r in pairs]
            xs = [x for x in xs if all(usable(y) for y in x[:3] if y is not None)]
            if not xs:
                continue
            effect, drift, lo, hi = paired_effect(xs)
            ok = ok and abs(effect - 1) <= PAIRED_AGREE
            if bracketed:  # each default window alone, for a drift that was not linear
                sides.append((what, statistics.median(lg / d for d, lg, _, _ in xs),
                              statistics.median(lg / again for _, lg, again, _ in xs)))
            moved.append(abs(drift - 1) if drift is not None else 0.0)
            later = ("one order only, no drift estimate" if drift is None
                     else f"default again {drift:.3f}x the first" if bracketed
                     else f"later window {drift:.3f}x the earlier")
            parts.append(f"{effect:.3f} {what} ({'repeats' if bracketed else 'pairs'} "
                         f"{lo:.3f}-{hi:.3f}; {later})")
        if not parts:
            continue
        steps = sorted({p["steps"] for p, _ in pairs})
        cores = _paired_per_core(pairs) if bracketed else None
        rss = _paired_rss(pairs) if bracketed else None
        if bracketed:
            how = "each a default, a long and a default window again"
        else:
            first = sum(1 for p, _ in pairs if p.get("long_first"))
            how = f"{len(pairs) - first} default first, {first} long first"
        out.append(f"{res.row_label(v)}: long / default {', '.join(parts)} over {len(pairs)} "
                   f"repeat{'s' if len(pairs) != 1 else ''} ({how}), long windows of "
                   f"{'/'.join(map(str, steps))} batches: "
                   + (f"within {100 * PAIRED_AGREE:g}%" if ok
                      else f"not within {100 * PAIRED_AGREE:g}%")
                   + ("" if ok or max(moved) <= PAIRED_AGREE else
                      f", with the rate moving {100 * max(moved):.0f}% from a process's earlier "
                      f"window to its later one: more than the {100 * PAIRED_AGREE:g}% to be "
                      f"shown, which the verdict cannot tell from the window's effect")
                   + _one_sided(sides, max(moved))
                   + ("" if not cores else "; training samples per worker core: default "
                      "{:.0f}, long {:.0f}, default again {:.0f}".format(*cores))
                   + ("" if not rss else "; the process's memory at the end of training: "
                      "default {:.0f} MiB, default again {:.0f} MiB".format(*rss)))
    return out


LONG_WAITS_MIN = 3  # long data waits in a window (at the median) from which a row is listed


def _block(heading: str, items: list[str]) -> list[str]:
    """A summary block: ``heading``, then one bullet per item; nothing without items."""
    return [heading, ""] + [f"- {x}" for x in items] + [""] if items else []


def _md(columns, body) -> str:
    head = "| " + " | ".join(columns) + " |\n|" + "|".join("---" for _ in columns) + "|\n"
    return head + "".join("| " + " | ".join(r) + " |\n" for r in body)


def trace_lines(res: SuiteResult) -> list[str]:
    """One line per traced repeat (``Repeat.trace``), the ceiling's first."""
    from .trace import describe

    rows = ([res.ceiling] if res.ceiling is not None else []) + list(res.variants)
    return [f"{v.label}: {describe(r.trace)}" for v in rows for r in v.repeats
            if r.trace is not None]


def research_lines(res: SuiteResult) -> list[str]:
    """The summary's sections on how the numbers were measured (the order of the isolated
    repeats, spreads, the host CPU probe, CPU steal, CPU by role, the cold page cache): after
    the main table (NOTE [verdict
    first] in ``verdict_lines``)."""
    s = res.setup
    lines: list[str] = []
    if s.get("isolate") and s.get("order"):
        lines += [f"**Order of the repeats** (seed {s.get('order_seed')}): "
                  f"{', '.join(s['order'])}.", ""]
    within = [(v.label, v.spread("samples_per_s"), gap) for v in res.variants
              if (gap := v.within_spread()) is not None]
    if within:
        lines += ["**Spreads of samples/s**: across repeats (max - min), and within one process "
                  "(the median gap between the two halves of a repeat's window). `compare diff` "
                  "and the verdict take the larger as their noise floor, the gap first scaled "
                  "to a range over the repeats.", "",
                  "| backend | across repeats | within a window |", "|---|---|---|"]
        lines += [f"| {label} | {a:.1f} | {w:.1f} |" for label, a, w in within]
        lines += [""]
    probe = probe_span(res)
    if probe is not None:
        lines += [f"**Host CPU probe** (one core decoding a fixed JPEG with PIL, before each "
                  f"loader is built; compare.hostprobe): {probe[0]:.2f}-{probe[1]:.2f} ms "
                  f"across the run. `compare diff` tells two runs' hosts apart by them.", ""]
    steal = steal_span(res)
    if steal is not None:
        lines += [f"**CPU steal** (the share of the CPU the hypervisor gave other guests during "
                  f"each training window, from /proc/stat; compare.metrics NOTE [steal]): "
                  f"{steal[0]:.2f}-{steal[1]:.2f}% across the repeats.", ""]
    roles = [(res.row_label(v), m) for v in res.variants if (m := role_medians(v))]
    if roles:
        lines += ["**CPU by role**, in cores (CPU seconds over the window's seconds; medians over "
                  "the repeats; compare.cpuroles NOTE [cpu roles]): the loop's thread, the "
                  "loader's worker processes, and the process's other threads; the time the "
                  "workers were ready and waited for a core (run queue); then the window's "
                  "rate over its workers' cores, which falls when a CPU second makes fewer "
                  "samples (a slower host, or more kernel work); and the workers' kernel time, "
                  "as a % of their CPU time, and their minor page faults per sample, which "
                  "grow with kernel work (page faults after a fork, new memory).", "",
                  "| backend | training: loop / workers / threads | "
                  "loader-only: loop / workers / threads | workers' run queue: training / "
                  "loader-only | samples per worker core: training / loader-only | workers' "
                  "kernel % / faults per sample: training; loader-only |",
                  "|---|---|---|---|---|---|"]

        def cell(m):
            return " / ".join(f"{m[k]:.2f}" for k in ROLES)

        def runq(m):
            got = [m[w].get(RUNQ) for w in ("training", "loader_only")]
            return "-" if None in got else " / ".join(f"{x:.2f}" for x in got)

        def kernel(k):
            return "-" if not k else "; ".join(
                f"{k[w][0]:.1f}% / {k[w][1]:.0f}" for w in ("training", "loader_only"))

        per = {res.row_label(v): per_worker_core(v) for v in res.variants}
        kern = {res.row_label(v): worker_kernel(v) for v in res.variants}
        lines += [f"| {label} | {cell(m['training'])} | {cell(m['loader_only'])} | {runq(m)} | "
                  + (" / ".join(f"{x:.0f}" for x in per[label]) if per.get(label) else "-")
                  + f" | {kernel(kern.get(label))} |" for label, m in roles]
        lines += [""]
    if s.get("cold"):
        lines += ["**Cold page cache**: the dataset's files were evicted before each timed run "
                  "(`--cold`; compare.pagecache), then the loader's queue, filled from files "
                  "read before, was drained. A window that reads more than the dataset reads "
                  "its files again, from the page cache:", ""]
        lines += [f"- {x}" for x in cold_lines(res)] + [""]
    return lines


def markdown(res: SuiteResult) -> str:
    s = res.setup
    e = res.env
    w = warnings_for(res)
    world = s.get("world_size") or 1
    job = (f"- torchrun job: {world} ranks on {s.get('nodes', 1)} node(s), "
           f"{s.get('local_world_size', 1)} per node; DDP model step; batch and workers are per "
           "rank; samples/s and loader img/s are the job's (sum over ranks), waits and idle % "
           "the ranks' mean" if world > 1 else None)
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
        + (f" (at least {FIT_QUEUES}x each loader's queue)" if s.get("fit_queue") else "")
        + " after "
        f"{s.get('warmup')} warm-up, {s.get('repeats')} repeats, dtype {s.get('dtype')}, "
        f"channels_last {s.get('channels_last')}, workers {s.get('workers')}",
        f"- augmentation: {s.get('augment')}",
        *([f"- model step on the {s['compute_stream']} stream (--compute-stream)"]
          if s.get("compute_stream", "default") != "default" else []),
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
    lines += [_md(COLUMNS, rows(res))]
    if world > 1:
        lines += ["**Per rank** (medians over repeats)", "", _md(RANK_COLUMNS, rank_rows(res))]
    lines += research_lines(res)
    lines += _block("**The step ran slower beside the loader** (busy time per sample against "
                    "the ceiling's; not data waits: the loader's own GPU work shared the device)",
                    contention_lines(res))
    lines += _block(f"**Long data waits** in the training window (above {LONG_WAIT_FLOOR_MS:g} "
                    f"ms and {LONG_WAIT_TIMES:g}x the window's median wait; compare.waves)",
                    long_wait_lines(res))
    lines += _block("**Default and long windows, paired** (`--paired-long`: each repeat timed a "
                    "long pair of windows in the same process, between two default pairs (runs "
                    "before 2026-12-02: before or after one, by turns); long / default with "
                    "the drift within each process taken out, the repeats' range and that "
                    "drift; compare.runner NOTE [paired long])",
                    paired_long_lines(res))
    lines += _block("**Where the loop waited for data** (`--wait-sites`: the loop thread's "
                    "Python stack, innermost first, sampled while it was inside the loader's "
                    "`next()` in the training window, the loader's own work on that thread "
                    "included; shares of the samples; compare.waitsites NOTE [wait sites])",
                    wait_site_lines(res))
    lines += _block("**Timed windows** (training run; without `--steps` at least "
                    f"{FIT_QUEUES}x the queue; whole epochs when an epoch is at most twice the "
                    "window; `--long` makes them at least 10x the queue)", window_lines(res))
    if s.get("loader_only_last"):
        lines += ["**Loader-only window after training** (`--loader-only-last`): each repeat "
                  "timed the model step first and the loader alone after it (compare.runner "
                  "NOTE [loader-only last]).", ""]
    lines += _block("**Traces** (`--trace`: one more training window after the first repeat, "
                    "under torch.profiler; not in the figures above; compare.trace NOTE [trace])",
                    trace_lines(res))
    if s.get("notes"):
        lines += ["**Notes**", ""] + [f"- {x}" for x in s["notes"]] + [""]
    if w:
        lines += ["**Warnings**", ""] + [f"- {x}" for x in w] + [""]
    return "\n".join(lines)


PROG = "python -m compare report"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m compare report``: the markdown summary of a results.json, on
    stdout or into ``--out``."""
    from .plot import load

    p = argparse.ArgumentParser(
        prog=PROG, description="Write the markdown summary of a suite results.json again, with "
                               "what this version of the report says.")
    p.add_argument("results", metavar="RESULTS.json",
                   help="a results.json written by python -m compare, or the folder holding it")
    p.add_argument("--out", metavar="FILE", default=None,
                   help="write the summary here (default: print it)")
    a = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    src = Path(a.results)
    if src.is_dir():
        src = src / "results.json"
    try:
        text = markdown(load(src))
    except ValueError as e:
        print(f"{PROG}: error: RESULTS.json: {str(src)!r} is {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"{PROG}: error: RESULTS.json: cannot read {str(src)!r} ({e.strerror or e})",
              file=sys.stderr)
        return 2
    if a.out is None:
        print(text)
        return 0
    try:
        Path(a.out).write_text(text + "\n")
    except OSError as e:
        print(f"{PROG}: error: --out: cannot write {a.out!r} ({e.strerror or e})", file=sys.stderr)
        return 2
    print(a.out)
    return 0
