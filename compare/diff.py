"""``python -m compare diff A B``: did B get faster or slower than A?

Rows are paired by their whole configuration; a verdict needs a change of at least 2% (5% when
a row's repeats shared one process), a 95% bootstrap interval of B/A that excludes 1, and a gap
of the medians above the noise floor. Exit status 0, or 2 for a usage error or incompatible
runs. The rules and why: docs/benchmarking.md, ``diff``.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Sequence
from typing import NamedTuple

from . import cli
from .plot import read
from .probes import PROBES
from .results import FIT_QUEUES, SuiteResult, strict

PROG = "python -m compare diff"
METRIC = "samples_per_s"
# --metric: (Repeat field, its unit, the field of its two within-window rates)
METRICS = {"samples": ("samples_per_s", "samples/s", "halves"),
           "loader-only": ("loader_only_per_s", "img/s", "loader_only_halves")}
HALVES = {field: halves for field, _, halves in METRICS.values()}
NO_DIFF = "no significant difference"
MIN_EFFECT = 0.02   # a change of B/A smaller than 2% is never called
# ... and 5% when a row's repeats shared one process: their spread says nothing of the next
# run's (two runs of one command on the 2-core CI machine came out "slower" under 2%)
ONE_PROCESS_MIN_EFFECT = 0.05
MIN_REPEATS = 2     # fewer repeats than this in either run: no verdict but NO_DIFF
LEVEL = 0.95        # the confidence level of the interval
RESAMPLES = 10_000  # bootstrap resamples per row
SEED = 0            # the bootstrap's seed: the same two files always give the same interval


def _facts(r: SuiteResult) -> dict[str, object]:
    """What has to match for two runs to be comparable."""
    s, e = r.setup, r.env
    stats = s.get("dataset")
    images = ({k: v for k, v in stats.items() if k != "shards"} if isinstance(stats, dict)
              else stats)
    return {"gpu": e.get("gpu"),
            "data": images or s.get("data"), "model": s.get("model"),
            "batch_size": s.get("batch_size"), "dtype": s.get("dtype"),
            "augment": s.get("augment"), "device": s.get("device"),
            "world_size": s.get("world_size") or 1}


# Facts that do not block a comparison but can explain a verdict (CPU-bound rows follow the host)
HOST = ("platform", "cpu_model", "cpu_count", "cpu_affinity", "torch", "torchvision", "dali",
        "pillow", "numpy", "driver", "cuda_runtime", "python")


def host_changes(a: SuiteResult, b: SuiteResult) -> list[str]:
    """``"key: A -> B"`` for each ``HOST`` fact both runs recorded that differs."""
    ea, eb = a.env or {}, b.env or {}
    return [f"{k}: {ea[k]!r} -> {eb[k]!r}" for k in HOST
            if ea.get(k) is not None and eb.get(k) is not None and ea[k] != eb[k]]


# How a run was timed (setup key, what it is, words without it, with it), the probes' included
MODES = (("fit_queue", "window length", "--steps batches",
          f"at least {FIT_QUEUES}x the queue (no --steps)"),
         *((p.name, *p.mode) for p in PROBES if p.mode))


def mode_changes(a: SuiteResult, b: SuiteResult) -> list[str]:
    """A note for each way of timing (``MODES``) that differs between the two runs."""
    out = []
    for key, what, *words in MODES:
        va, vb = words[bool(a.setup.get(key))], words[bool(b.setup.get(key))]
        if va != vb:
            out.append(f"{what}: {va} in A, {vb} in B")
    return out


def _short(x: object, n: int = 80) -> str:
    s = repr(x)
    return s if len(s) <= n else s[:n - 3] + "..."


def field_diffs(key: str, va: object, vb: object) -> list[str]:
    """``"key.sub: A -> B"`` for each differing field, dicts walked down (``missing``: absent)."""
    if va == vb:
        return []
    if isinstance(va, dict) and isinstance(vb, dict):
        out: list[str] = []
        for k in list(va) + [k for k in vb if k not in va]:
            sub = f"{key}.{k}"
            if k not in va or k not in vb:
                out.append(f"{sub}: {_short(va[k]) if k in va else 'missing'} -> "
                           f"{_short(vb[k]) if k in vb else 'missing'}")
            else:
                out += field_diffs(sub, va[k], vb[k])
        return out
    return [f"{key}: {_short(va)} -> {_short(vb)}"]


def incompatible(a: SuiteResult, b: SuiteResult) -> list[str]:
    """``"key: A -> B"`` for each fact that differs between the two runs (``field_diffs``)."""
    fa, fb = _facts(a), _facts(b)
    return [d for k in fa for d in field_diffs(k, fa[k], fb[k])]


SHOWN = 4  # the differing facts an error lists before "and N more"


def comparable(a: SuiteResult, b: SuiteResult, force: bool, ignore: tuple[str, ...] = (),
               why: str = "the runs are not comparable") -> list[str]:
    """The facts that differ between two runs (``key: A -> B``), apart from ``ignore``.

    Raises:
        ValueError: some differ and not ``force`` (``why``, then the facts and the way out).
    """
    diff = [d for d in incompatible(a, b)
            if d.split(":", 1)[0].split(".", 1)[0] not in ignore]
    if diff and not force:
        data = [d for d in diff if d.startswith("data")]
        if data:  # name the two datasets first: their statistics can differ in many fields
            why += (f": another dataset (A: {a.setup.get('data')}, B: {b.setup.get('data')}, "
                    f"{len(data)} of its facts differ)")
        shown = diff[:SHOWN] + ([f"and {len(diff) - SHOWN} more"] if len(diff) > SHOWN else [])
        raise ValueError(f"{why} ({'; '.join(shown)}); use --force to compare them anyway")
    return diff


def ratio_ci(a_values: Sequence[float], b_values: Sequence[float], level: float = LEVEL,
             resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float, float]:
    """``(ratio, lo, hi)``: median(B) / median(A) and its seeded percentile-bootstrap interval
    (NaN for all three when a side is empty or A's median is not positive)."""
    import numpy as np  # here, so that ``compare diff --help`` stays fast

    nan = float("nan")
    a = np.asarray(a_values, dtype=float)
    b = np.asarray(b_values, dtype=float)
    if a.size == 0 or b.size == 0 or not 0 < level < 1 or resamples < 1:
        return nan, nan, nan
    ma = statistics.median(a.tolist())
    if not ma > 0:
        return nan, nan, nan
    ratio = statistics.median(b.tolist()) / ma
    rng = np.random.default_rng(seed)
    med_a = np.median(a[rng.integers(0, a.size, size=(resamples, a.size))], axis=1)
    med_b = np.median(b[rng.integers(0, b.size, size=(resamples, b.size))], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = med_b / med_a
    r = r[np.isfinite(r)]
    if r.size == 0:
        return ratio, nan, nan
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(r, [tail, 100 - tail])
    return ratio, float(lo), float(hi)


class Judgement(NamedTuple):
    """B against A for one row: the ratio of medians, its interval, the verdict and why."""

    ratio: float
    lo: float
    hi: float
    verdict: str
    note: str  # why the verdict is NO_DIFF ("" for faster / slower)


# d2(n): the expected range of n draws of a unit normal (the control-chart constant)
D2 = {2: 1.128, 3: 1.693, 4: 2.059, 5: 2.326, 6: 2.534, 7: 2.704, 8: 2.847, 9: 2.970, 10: 3.078}


def _finite(xs) -> list[float]:
    return [x for x in xs if x is not None and math.isfinite(x)]


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def within_as_range(v, metric: str = METRIC) -> float:
    """``v``'s within-window spread as the range its repeats would show (0.0 without halves).

    The median gap of two halves is ``0.954 s`` and n whole windows span ``d2(n) s / sqrt 2``,
    so the range is ``d2(n) / 1.349`` times the gap.
    """
    gap = v.within_spread(HALVES[metric])
    n = len(_finite(v.values(metric)))
    if gap is None or n < 2:
        return 0.0
    return gap * D2[min(n, 10)] / 1.349  # beyond 10 repeats: d2(10), a slight underestimate


def judge(va, vb, metric: str = METRIC) -> Judgement:
    """The verdict of B's ``VariantResult`` against A's on ``metric`` (module docstring)."""
    min_effect = ONE_PROCESS_MIN_EFFECT if _in_one_process(va) or _in_one_process(vb) \
        else MIN_EFFECT
    a, b = _finite(va.values(metric)), _finite(vb.values(metric))
    nan = float("nan")
    ma, mb = _median(a), _median(b)
    if len(a) < MIN_REPEATS or len(b) < MIN_REPEATS:
        ratio = mb / ma if a and b and ma > 0 else nan
        return Judgement(ratio, nan, nan, NO_DIFF,
                         f"too few repeats (A {len(a)}, B {len(b)}; a verdict needs "
                         f"{MIN_REPEATS} or more in each)")
    ratio, lo, hi = ratio_ci(a, b)
    if not math.isfinite(ratio):
        return Judgement(ratio, lo, hi, NO_DIFF, f"A's median is {ma:g}: no ratio")
    noise = max(max(a) - min(a), max(b) - min(b), within_as_range(va, metric),
                within_as_range(vb, metric))
    change = ratio - 1
    if abs(change) < min_effect:
        why = " (repeats in one process)" if min_effect != MIN_EFFECT else ""
        return Judgement(ratio, lo, hi, NO_DIFF,
                         f"the change ({change:+.1%}) is under the {min_effect:.0%} minimum effect{why}")
    if not (hi < 1 or lo > 1):
        return Judgement(ratio, lo, hi, NO_DIFF,
                         f"the {LEVEL:.0%} interval [{lo:.3f}, {hi:.3f}] includes 1")
    if abs(mb - ma) <= noise:
        return Judgement(ratio, lo, hi, NO_DIFF,
                         f"the gap of the medians ({abs(mb - ma):.1f}) is within the largest "
                         f"spread ({noise:.1f}, across repeats or within a window)")
    return Judgement(ratio, lo, hi, "faster" if mb > ma else "slower", "")


class Row(NamedTuple):
    """One row of the table: a variant (or the ceiling) in both runs."""

    label: str
    a: float       # A's median of the metric (samples/s, or loader-only img/s)
    b: float       # B's median
    ratio: float   # b / a
    lo: float      # the interval of the ratio
    hi: float
    verdict: str
    note: str      # why NO_DIFF ("" for faster / slower)
    n_a: int       # repeats in A
    n_b: int       # repeats in B


def _plain(x: object) -> object:
    """An option's value as results.json holds it (an enum by its value)."""
    return getattr(x, "value", x)


def _option_defaults(backend: str) -> dict[str, object]:
    """Every option of ``backend`` at its default (``{}`` where unknown)."""
    try:
        import dataclasses

        from pipelines import Backend
        from pipelines.factory import options_for

        o = options_for(Backend(backend))()
        return {f.name: _plain(getattr(o, f.name)) for f in dataclasses.fields(o)}
    except Exception:  # noqa: BLE001 - then the overrides are compared as written
        return {}


def row_config(run: SuiteResult, v) -> dict[str, object]:
    """What decides row ``v``'s numbers beyond the setup: backend, options, workers, decoder."""
    cfg: dict[str, object] = {"backend": v.backend}
    over = {k: _plain(x) for k, x in v.overrides.items()}
    cfg["num_workers"] = over.pop("num_workers", run.setup.get("workers"))
    cfg.update(over)
    decoders = sorted({r.decoder for r in v.repeats if getattr(r, "decoder", None)})
    if decoders or over.get("decoder") is not None:  # unrecorded (an older run): left out
        cfg["decoder"] = ",".join(decoders) if decoders else over.get("decoder")
    return cfg


def config_diffs(a: SuiteResult, va, b: SuiteResult, vb) -> list[str]:
    """``"field: X in A, Y in B"`` for each field of ``row_config`` that differs."""
    ca, cb = row_config(a, va), row_config(b, vb)
    if ca == cb:
        return []
    fill_a = _option_defaults(va.backend) if va.backend == vb.backend else {}
    fill_b = _option_defaults(vb.backend) if va.backend == vb.backend else {}
    out = []
    for k in list(ca) + [k for k in cb if k not in ca]:  # an option not overridden: its default
        if k == "decoder" and (k not in ca or k not in cb):
            continue  # one run did not record which decoder ran: not a difference
        xa = ca[k] if k in ca else fill_a.get(k, "default")
        xb = cb[k] if k in cb else fill_b.get(k, "default")
        if xa != xb:
            out.append(f"{k}: {_short(xa, 40)} in A, {_short(xb, 40)} in B")
    return out


class Pairing(NamedTuple):
    """Rows compared (name, A's, B's), and labels refused for differing configurations."""

    pairs: list[tuple[str, object, object]]
    refused: list[tuple[str, list[str]]]


def pair_rows(a: SuiteResult, b: SuiteResult, force: bool = False) -> Pairing:
    """Pair A's and B's variants by ``row_config``: the same label first, else the same
    configuration under another label (``"A label (B: B label)"``); a label whose rows differ
    is refused (``force``: compared anyway, and still listed)."""
    pairs, refused = [], []
    left = list(b.variants)
    unmatched = []
    for va in a.variants:
        same = next((vb for vb in left if vb.label == va.label
                     and not config_diffs(a, va, b, vb)), None)
        if same is not None:
            pairs.append((va.label, va, same))
            left.remove(same)
        else:
            unmatched.append(va)
    for va in unmatched:
        twin = next((vb for vb in left if not config_diffs(a, va, b, vb)), None)
        if twin is not None:
            pairs.append((f"{va.label} (B: {twin.label})", va, twin))
            left.remove(twin)
            continue
        named = next((vb for vb in left if vb.label == va.label), None)
        if named is not None:
            refused.append((va.label, config_diffs(a, va, b, named)))
            if force:
                pairs.append((va.label, va, named))
                left.remove(named)
    order = {v.label: i for i, v in enumerate(a.variants)}
    pairs.sort(key=lambda p: order[p[1].label])
    return Pairing(pairs, refused)


def table_rows(a: SuiteResult, b: SuiteResult, metric: str = METRIC,
               force: bool = False) -> list[Row]:
    """A ``Row`` for the ceiling (samples/s only) and each pair of ``pair_rows``."""
    out = []
    both = a.ceiling and b.ceiling and metric == METRIC
    pairs = [("ceiling", a.ceiling, b.ceiling)] if both else []
    pairs += pair_rows(a, b, force).pairs
    for label, va, vb in pairs:
        j = judge(va, vb, metric)
        xa, xb = _finite(va.values(metric)), _finite(vb.values(metric))
        out.append(Row(label, _median(xa), _median(xb), j.ratio, j.lo, j.hi, j.verdict, j.note,
                       len(xa), len(xb)))
    return out


def _in_one_process(v) -> bool:
    """Whether ``v``'s repeats recorded their processes and all ran in one."""
    pids = [getattr(x, "pid", None) for x in v.repeats]
    return len(pids) >= 2 and None not in pids and len(set(pids)) == 1


def _one_process(r: SuiteResult) -> bool:
    """Whether some variant of the run ran all its repeats in one process."""
    return any(_in_one_process(v) for v in ([r.ceiling] if r.ceiling else []) + list(r.variants))


def _ci(r: Row) -> str:
    if not (math.isfinite(r.lo) and math.isfinite(r.hi)):
        return "-"
    return f"[{r.lo:.3f}, {r.hi:.3f}]"


def main(argv: list[str] | None = None) -> int:
    p = cli.Parser(prog=PROG, description=__doc__, formatter_class=cli.HelpFormatter)
    p.add_argument("a", metavar="A", help="the earlier results.json (or its folder)")
    p.add_argument("b", metavar="B", help="the later results.json (or its folder)")
    p.add_argument("--force", action="store_true",
                   help="compare runs whose setups differ, saying which facts differ")
    p.add_argument("--metric", choices=tuple(METRICS), default="samples",
                   help="what to judge: training samples/s (default), or the loader-only "
                        "rate, img/s (no ceiling row)")
    p.add_argument("--json", action="store_true",
                   help="print the rows (and the notes) as strict JSON instead of a table")
    args = p.parse_args(argv)
    try:
        a, b = read(args.a, "A")[1], read(args.b, "B")[1]
        diff = comparable(a, b, args.force)
    except ValueError as e:
        return cli.fail(PROG, e)
    notes = [f"differs: {d}" for d in diff]
    notes += [f"{name} is a partial run: {len(r.variants)} of {len(r.setup.get('variants') or ())} "
              f"variants finished, stopped by: {r.setup.get('error') or 'no error recorded'}"
              for name, r in (("A", a), ("B", b)) if not r.complete]
    host = host_changes(a, b)
    if host:
        notes.append(f"another host or software ({'; '.join(host)}): a verdict on a CPU-bound "
                     "row can be the machine's, not the code's")
    sa, sb = a.setup.get("source", "folder"), b.setup.get("source", "folder")
    if sa != sb:  # the same images (data_gen's statistics match) read from another source
        notes.append(f"the same images, read from a {sa} in A and from {sb} in B")
    notes += mode_changes(a, b)
    field, unit, _ = METRICS[args.metric]
    table = table_rows(a, b, field, args.force)
    paired = pair_rows(a, b, args.force)
    refused = [f"{label}: {'compared anyway (--force)' if args.force else 'not compared'}, "
               f"the rows differ in {'; '.join(why)}" for label, why in paired.refused]
    if not table:
        if refused:
            return cli.fail(PROG, "no row of A has the configuration of a row of B: "
                            + " | ".join(refused))
        return cli.fail(PROG, "the runs share no variant label")
    used_a = {va.label for _, va, _ in paired.pairs}
    used_b = {vb.label for _, _, vb in paired.pairs}
    gone = {x for x, _ in paired.refused} - used_a
    only = sorted(({v.label for v in a.variants} - used_a - gone)
                  | ({v.label for v in b.variants} - used_b - gone))
    if field == METRIC and bool(a.ceiling) != bool(b.ceiling):  # --no-ceiling in one run
        only.append(f"ceiling (only {'A' if a.ceiling else 'B'} timed it)")
    for name, run in (("A", a), ("B", b)):
        if _one_process(run):
            notes.append(f"{name} ran each variant's repeats in one process: its spread is "
                         f"within one process and understates the noise between runs, so a "
                         f"change under {ONE_PROCESS_MIN_EFFECT:.0%} is not called")
    if args.json:
        doc = {"level": LEVEL, "min_effect": MIN_EFFECT, "metric": field, "notes": notes,
               "rows": [r._asdict() for r in table], "not_in_both": only,
               "not_compared": [{"label": x, "differs": why} for x, why in paired.refused]}
        print(json.dumps(strict(doc), indent=1, allow_nan=False))
        return 0
    for n in notes:
        print(f"note: {n}")
    ci = f"{LEVEL:.0%} CI"
    print(f"{'variant':28s} {'A ' + unit:>12s} {'B ' + unit:>12s} {'B/A':>7s}  {ci:16s}  verdict")
    for r in table:
        print(f"{r.label:28s} {r.a:12.1f} {r.b:12.1f} {r.ratio:7.3f}  {_ci(r):16s}  {r.verdict}")
    for r in table:
        if r.note:
            print(f"note: {r.label}: {r.note}")
    for line in refused:
        print(f"note: {line}")
    if only:
        print(f"not in both runs: {', '.join(only)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
