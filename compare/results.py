"""Immutable result records with JSON dump/load (in the spirit of pyperf's Run/Benchmark)."""
from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "gpu-feed.compare/1"
# the default window (no --steps) holds at least this many times the loader's queue, long
# enough to average the workers' waves (docs/results/h200/seeds-reference/README.md, steady/:
# stretches of a --long window); runner.window applies it
FIT_QUEUES = 4
SPREAD_WARN = 0.10  # warn when (max - min) >= 10% of the median, as pyperf does with std/mean
OVER_CEILING = 105.0  # % of the ceiling above which a row is flagged (report.warnings_for)


def strict(obj):
    """``obj`` with every NaN or infinite float replaced by ``None`` (JSON's ``null``)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    return obj


@dataclass(frozen=True)
class Repeat:
    """One timed repeat of one variant."""

    samples_per_s: float
    loader_only_per_s: float
    wait_p50_ms: float
    wait_p95_ms: float
    idle_pct: float
    cpu_util_pct: float | None = None
    nvml_util_pct: float | None = None
    waits_ms: tuple[float, ...] = ()
    # under torchrun: each rank's own samples/s, loader-only img/s, waits and idle % (rank
    # order); the fields above are then the job's (compare.ddp.merge)
    ranks: tuple[dict[str, float], ...] = ()
    steps: int | None = None       # the timed window, in batches (training run)
    window_s: float | None = None  # the timed window, in seconds (training run)
    pid: int | None = None         # the process that ran this repeat (compare.isolate)
    # --cold: the share of the dataset's pages still cached after the eviction that preceded
    # the training run (compare.pagecache); None in a warm run
    cold_resident: float | None = None
    # samples/s over the training window's first and second halves (metrics.RunMeasure.halves)
    halves: tuple[float, float] | None = None
    # img/s over the loader-only window's first and last stretches of whole worker waves
    # (metrics.LoaderOnly, NOTE [waves and halves]); plain halves in runs before 8b2e2a8
    loader_only_halves: tuple[float, float] | None = None
    # warm-up batches run after --warmup until the workers were out of step, and whether they
    # were by the cap (NOTE [settling] in compare.runner); None: the loader does not settle
    settle_batches: int | None = None
    settled: bool | None = None
    # the torch backends' decoder (TorchOptions.decoder, or the one pinned chose from the data)
    decoder: str | None = None
    # DALI with hw_decoder_load=None: the calibration's decisions in this repeat's process,
    # oldest first (``Decision.describe``; NOTE [calibration] in pipelines.dali.calibrate)
    calibration: tuple[str, ...] = ()
    # the host's CPU speed in this repeat's process: ms for one core to decode a fixed JPEG
    # (compare.hostprobe NOTE [host speed]), taken before the loader; None in runs before the
    # probe, and for the repeats after the first of a variant whose repeats share a process
    cpu_probe_ms: float | None = None
    # the share of the CPU the hypervisor gave other guests during the training window, in %
    # (/proc/stat's steal; metrics.CpuUtil NOTE [steal]); None without it and in older runs
    cpu_steal_pct: float | None = None
    # --trace: the digest of one more training window traced after this repeat's windows
    # (compare.trace.digest; NOTE [trace]); None when not traced
    trace: dict[str, Any] | None = None
    # the CPU each window took, in cores, by role: {"training": {...}, "loader_only": {...}},
    # each {"main", "workers", "threads"}, with the workers' run queue, kernel time and page
    # faults and the process's memory where read (compare.cpuroles NOTE [cpu roles]); the training
    # window's includes its warm-up and settling; None without /proc and in older runs
    cpu_roles: dict[str, dict[str, float]] | None = None
    # --wait-sites: the training window's data waits by where the loop's thread waited, each
    # site's share of the samples (compare.waitsites NOTE [wait sites]); None when not sampled
    wait_sites: dict[str, float] | None = None
    # --paired-long: the long pair of windows timed beside this repeat's in its process
    # (compare.runner NOTE [paired long]): {"steps", "samples_per_s", "loader_only_per_s",
    # "settled", "cpu_roles", "after": the second default pair's {"samples_per_s",
    # "loader_only_per_s", "cpu_roles"}} (cpu_roles as this repeat's; under torchrun rank 0's)
    # (runs before 2026-12-02's bracket: "long_first" and no "after"); None when not asked for
    paired_long: dict[str, Any] | None = None


@dataclass(frozen=True)
class VariantResult:
    """All repeats of one backend variant (e.g. ``pinned`` with ``streams=0``)."""

    label: str
    backend: str
    overrides: dict[str, object]
    h2d_bytes_per_sample: float | None
    repeats: tuple[Repeat, ...]
    queue_batches: int | None = None  # batches the loader holds ahead (runner.queue_depth)

    def values(self, metric: str) -> list[float]:
        return [getattr(r, metric) for r in self.repeats if getattr(r, metric) is not None]

    def median(self, metric: str) -> float:
        v = self.values(metric)
        return statistics.median(v) if v else float("nan")

    def spread(self, metric: str) -> float:
        v = self.values(metric)
        return (max(v) - min(v)) if v else float("nan")

    def within_spread(self, field: str = "halves") -> float | None:
        """The median gap between the two halves of a repeat's training window (samples/s;
        ``field="loader_only_halves"``: the loader-only window's two stretches): the variation
        inside one process. ``spread`` is the one across repeats (across processes under
        ``--isolate``). ``None`` when no repeat has halves."""
        gaps = [abs(h[0] - h[1]) for r in self.repeats if (h := getattr(r, field))]
        return statistics.median(gaps) if gaps else None

    @property
    def world(self) -> int:
        """Ranks that ran this variant (1 outside torchrun)."""
        return max((len(r.ranks) for r in self.repeats), default=0) or 1

    def rank_median(self, rank: int, metric: str) -> float:
        """The median over repeats of one rank's ``metric`` (``RANK_FIELDS``)."""
        v = [r.ranks[rank][metric] for r in self.repeats if len(r.ranks) > rank]
        return statistics.median(v) if v else float("nan")

    def noisy(self, metric: str = "samples_per_s") -> bool:
        m = self.median(metric)
        return bool(m) and self.spread(metric) >= SPREAD_WARN * abs(m)


@dataclass(frozen=True)
class SuiteResult:
    """A whole comparison: environment, the shared setup, the ceiling and every variant.

    ``complete`` is False while the suite runs (``results.json`` is rewritten after each
    variant) and in a run that stopped early; ``setup["error"]`` then says why.
    """

    env: dict[str, object]
    setup: dict[str, object]
    ceiling: VariantResult | None
    variants: tuple[VariantResult, ...] = field(default_factory=tuple)
    schema: str = SCHEMA
    complete: bool = True

    def variant(self, label: str) -> VariantResult:
        for v in self.variants:
            if v.label == label:
                return v
        raise KeyError(label)

    @property
    def on_gpu(self) -> bool:
        """Whether the run timed a GPU (CUDA there and ``--device cuda``): GPU idle % and the
        DALI GPU operators mean something only then."""
        cuda = self.env.get("cuda_available")
        if cuda is None:  # an environment recorded without the flag: a named GPU says it
            cuda = bool(self.env.get("gpu"))
        return bool(cuda) and str(self.setup.get("device") or "cuda").startswith("cuda")

    def row_label(self, v: VariantResult) -> str:
        """``v``'s name in tables and plots: a DALI row timed without a GPU says that it ran
        DALI's CPU operators."""
        return f"{v.label} (CPU operators)" if v.backend == "dali" and not self.on_gpu else v.label

    def baseline(self) -> VariantResult | None:
        for v in self.variants:
            if v.backend == "pageable" and not v.overrides.get("pin"):
                return v
        return None

    def pct_of_ceiling(self, v: VariantResult) -> float | None:
        if self.ceiling is None:
            return None
        c = self.ceiling.median("samples_per_s")
        return 100.0 * v.median("samples_per_s") / c if c else None

    def speedup(self, v: VariantResult) -> float | None:
        b = self.baseline()
        if b is None:
            return None
        return v.median("samples_per_s") / b.median("samples_per_s")

    def dump(self, path: str | Path) -> None:
        """Write strict JSON (a metric that is not a number, NaN or infinite, is ``null``)
        atomically (a sibling file renamed over ``path``): a reader or a crash mid-write
        never sees half a file."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(strict(asdict(self)), indent=1, default=str, allow_nan=False))
        os.replace(tmp, path)

    @classmethod
    def from_dict(cls, d: dict) -> SuiteResult:
        check_doc(d)  # a ValueError naming the first malformed field
        if d.get("schema") != SCHEMA:
            raise ValueError(f"schema={d.get('schema')!r} is not {SCHEMA!r}")

        def var(v):
            if v is None:
                return None
            reps = tuple(Repeat(**{**r, "waits_ms": tuple(r.get("waits_ms", ())),
                                   "ranks": tuple(r.get("ranks", ())),
                                   "calibration": tuple(r.get("calibration", ())),
                                   "halves": tuple(r["halves"]) if r.get("halves") else None,
                                   "loader_only_halves": (tuple(r["loader_only_halves"])
                                                          if r.get("loader_only_halves") else None)})
                         for r in v["repeats"])
            return VariantResult(v["label"], v["backend"], dict(v["overrides"]),
                                 v["h2d_bytes_per_sample"], reps, v.get("queue_batches"))

        return cls(d["env"], d["setup"], var(d["ceiling"]),
                   tuple(var(v) for v in d["variants"]), d["schema"],
                   bool(d.get("complete", True)))

    @classmethod
    def load(cls, path: str | Path) -> SuiteResult:
        return cls.from_dict(json.loads(Path(path).read_text()))


# Repeat fields by the JSON type they hold (``null`` is allowed for each: a number that was not
# finite is written as null, and older runs lack the newer fields)
_NUMBERS = ("samples_per_s", "loader_only_per_s", "wait_p50_ms", "wait_p95_ms", "idle_pct",
            "cpu_util_pct", "nvml_util_pct", "steps", "window_s", "pid", "cold_resident",
            "settle_batches", "cpu_probe_ms", "cpu_steal_pct")
_PAIRS = ("halves", "loader_only_halves")
_DICTS = ("trace", "cpu_roles", "wait_sites", "paired_long")


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _type(x) -> str:
    return "null" if x is None else {dict: "an object", list: "a list", str: "a string",
                                     bool: "a boolean"}.get(type(x), type(x).__name__)


def check_doc(d) -> None:
    """Refuse a ``results.json`` document that is not shaped as ``SuiteResult.dump`` writes it.

    Raises:
        ValueError: naming the first malformed field by its path (``variants[0].repeats[1].
            samples_per_s is a string ('fast'), not a number``).
    """
    def bad(where: str, x, want: str) -> ValueError:
        shown = f" ({x!r})" if isinstance(x, (str, int, float)) and not isinstance(x, bool) else ""
        return ValueError(f"{where} is {_type(x)}{shown}, not {want}")

    if not isinstance(d, dict):
        raise bad("the document", d, "an object")
    for k in ("env", "setup"):
        if not isinstance(d.get(k), dict):
            raise bad(k, d.get(k), "an object")
    if not isinstance(d.get("variants"), list):
        raise bad("variants", d.get("variants"), "a list")
    rows = [("ceiling", d.get("ceiling"))] if d.get("ceiling") is not None else []
    rows += [(f"variants[{i}]", v) for i, v in enumerate(d["variants"])]
    for where, v in rows:
        if not isinstance(v, dict):
            raise bad(where, v, "an object")
        for k in ("label", "backend"):
            if not isinstance(v.get(k), str):
                raise bad(f"{where}.{k}", v.get(k), "a string")
        if not isinstance(v.get("overrides"), dict):
            raise bad(f"{where}.overrides", v.get("overrides"), "an object")
        for k in ("h2d_bytes_per_sample", "queue_batches"):
            if v.get(k) is not None and not _is_number(v[k]):
                raise bad(f"{where}.{k}", v[k], "a number")
        if not isinstance(v.get("repeats"), list):
            raise bad(f"{where}.repeats", v.get("repeats"), "a list")
        for j, r in enumerate(v["repeats"]):
            at = f"{where}.repeats[{j}]"
            if not isinstance(r, dict):
                raise bad(at, r, "an object")
            for k in _NUMBERS:
                if r.get(k) is not None and not _is_number(r[k]):
                    raise bad(f"{at}.{k}", r[k], "a number")
            for k in _PAIRS:
                x = r.get(k)
                if x is not None and not (isinstance(x, list) and len(x) == 2 and all(
                        y is None or _is_number(y) for y in x)):
                    raise bad(f"{at}.{k}", x, "a pair of numbers")
            for k in ("waits_ms", "ranks", "calibration"):
                if r.get(k) is not None and not isinstance(r[k], list):
                    raise bad(f"{at}.{k}", r[k], "a list")
            if not all(y is None or _is_number(y) for y in r.get("waits_ms") or ()):
                raise ValueError(f"{at}.waits_ms holds a value that is not a number")
            for n, rk in enumerate(r.get("ranks") or ()):
                if not isinstance(rk, dict) or not all(y is None or _is_number(y)
                                                       for y in rk.values()):
                    raise bad(f"{at}.ranks[{n}]", rk, "an object of numbers")
            for k in _DICTS:
                if r.get(k) is not None and not isinstance(r[k], dict):
                    raise bad(f"{at}.{k}", r[k], "an object")
            if r.get("decoder") is not None and not isinstance(r["decoder"], str):
                raise bad(f"{at}.decoder", r["decoder"], "a string")


STEAL_WARN_PCT = 3.0  # CPU steal in a training window above this (% of the CPU) is reported


def role_means(splits) -> dict[str, dict[str, float]] | None:
    """The mean of several ``Repeat.cpu_roles`` (ranks' or repeats'), role by role; ``None``
    unless every one has them."""
    if not splits or any(not s for s in splits):
        return None
    return {w: {k: round(statistics.fmean(s[w][k] for s in splits), 3)
                for k in _common(s[w] for s in splits)} for w in splits[0]}


def _common(dicts) -> list[str]:
    """The keys every one of ``dicts`` has, in the first one's order (a window without
    workers has no ``workers_runq``: compare.cpuroles)."""
    ds = list(dicts)
    return [k for k in ds[0] if all(k in d for d in ds[1:])]


def role_medians(v: VariantResult) -> dict[str, dict[str, float]] | None:
    """The median over ``v``'s repeats of each window's CPU by role (compare.cpuroles NOTE
    [cpu roles]), ``None`` when no repeat has them."""
    got = [r.cpu_roles for r in v.repeats if r.cpu_roles]
    if not got:
        return None
    return {w: {k: round(statistics.median(s[w][k] for s in got), 2)
                for k in _common(s[w] for s in got)} for w in got[0]}


def per_worker_core(v: VariantResult, least: float = 0.5) -> tuple[float, float] | None:
    """The median over ``v``'s repeats of each window's rate over the cores its workers used:
    ``(training, loader-only)`` samples per worker-core second (compare.cpuroles NOTE [cpu
    roles]). Two windows whose workers had as many cores and made unequal rates did unequal
    work per CPU second: the host's speed, not the loader's share of it. ``None`` without the
    split, or when the workers used under ``least`` cores in a window (DALI has none)."""
    pairs = []
    for r in v.repeats:
        roles = r.cpu_roles
        if not roles:
            continue
        tw, lw = roles["training"]["workers"], roles["loader_only"]["workers"]
        if tw < least or lw < least or math.isnan(r.loader_only_per_s):
            return None
        pairs.append((r.samples_per_s / tw, r.loader_only_per_s / lw))
    if not pairs:
        return None
    return (round(statistics.median(p[0] for p in pairs), 1),
            round(statistics.median(p[1] for p in pairs), 1))


def worker_kernel(v: VariantResult, least: float = 0.5
                  ) -> dict[str, tuple[float, float]] | None:
    """The median over ``v``'s repeats of each window's workers' kernel time, as a % of their
    CPU time, and their minor page faults per sample: ``{"training": (%, faults),
    "loader_only": (%, faults)}`` (compare.cpuroles NOTE [cpu roles]). ``None`` without them
    (runs before these fields), or when the workers used under ``least`` cores in a window."""
    from .cpuroles import FAULTS, SYS

    rows = {"training": [], "loader_only": []}
    for r in v.repeats:
        roles = r.cpu_roles
        if not roles:
            continue
        for w, rate in (("training", r.samples_per_s), ("loader_only", r.loader_only_per_s)):
            m = roles[w]
            if SYS not in m or FAULTS not in m or m["workers"] < least or not rate > 0:
                return None
            rows[w].append((100 * m[SYS] / m["workers"], m[FAULTS] / rate))
    if not rows["training"]:
        return None
    return {w: (round(statistics.median(x for x, _ in xs), 1),
                round(statistics.median(f for _, f in xs), 1)) for w, xs in rows.items()}


def steal_span(res: SuiteResult) -> tuple[float, float] | None:
    """``(lowest, highest)`` CPU steal of the run's training windows, in % of the CPU
    (``Repeat.cpu_steal_pct``; compare.metrics NOTE [steal]), or ``None`` without any."""
    got = [r.cpu_steal_pct for v in res.variants for r in v.repeats
           if r.cpu_steal_pct is not None]
    return (min(got), max(got)) if got else None
