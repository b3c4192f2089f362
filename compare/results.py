"""Immutable result records with JSON dump/load (in the spirit of pyperf's Run/Benchmark)."""
from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .probes import FIELDS

SCHEMA = "gpu-feed.compare/1"
# without --steps a window holds at least this many times the loader's queue (runner.window)
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
    # under torchrun: each rank's own figures; the fields above are the job's (ddp.merge)
    ranks: tuple[dict[str, float], ...] = ()
    steps: int | None = None       # the timed window, in batches (training run)
    window_s: float | None = None  # the timed window, in seconds (training run)
    pid: int | None = None         # the process that ran this repeat (compare.isolate)
    halves: tuple[float, float] | None = None  # samples/s, training window's two halves
    # img/s, the loader-only window's first and last whole waves (NOTE [waves and halves])
    loader_only_halves: tuple[float, float] | None = None
    settle_batches: int | None = None  # extra warm-up (NOTE [settling]); None: no settling
    settled: bool | None = None
    decoder: str | None = None  # the torch backends' decoder
    calibration: tuple[str, ...] = ()  # DALI's calibration decisions (pipelines.dali.calibrate)
    # the lab probes' fields, written beside the fields above in results.json
    probes: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        extra = d.pop("probes")
        return {**d, **extra}


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
        """The median gap between the two halves of a repeat's window (``field``): the variation
        inside one process (``None`` without halves); ``spread`` is the one across repeats."""
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
    """A whole comparison: environment, setup, ceiling and variants; ``complete`` is False while
    the suite runs and in a run that stopped early (``setup["error"]`` says why)."""

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
        """Whether the run timed a GPU (CUDA there and ``--device cuda``)."""
        cuda = self.env.get("cuda_available")
        if cuda is None:  # an environment recorded without the flag: a named GPU says it
            cuda = bool(self.env.get("gpu"))
        return bool(cuda) and str(self.setup.get("device") or "cuda").startswith("cuda")

    def row_label(self, v: VariantResult) -> str:
        """``v``'s name in tables and plots (a DALI row without a GPU: ``(CPU operators)``)."""
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

    def to_dict(self) -> dict[str, Any]:
        def row(v):
            return None if v is None else {**asdict(v), "repeats": [r.to_dict() for r in v.repeats]}

        return {**asdict(self), "ceiling": row(self.ceiling), "variants": [row(v) for v in self.variants]}

    def dump(self, path: str | Path) -> None:
        """Write strict JSON (NaN as ``null``) atomically, through a sibling file."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(strict(self.to_dict()), indent=1, default=str, allow_nan=False))
        os.replace(tmp, path)

    @classmethod
    def from_dict(cls, d: dict) -> SuiteResult:
        check_doc(d)  # unknown fields (of probes since removed) are ignored
        if d.get("schema") != SCHEMA:
            raise ValueError(f"schema={d.get('schema')!r} is not {SCHEMA!r}")

        def var(v):
            if v is None:
                return None
            reps = tuple(Repeat(**{**{k: x for k, x in r.items() if k in REPEAT_FIELDS},
                                   "waits_ms": tuple(r.get("waits_ms", ())),
                                   "ranks": tuple(r.get("ranks", ())),
                                   "calibration": tuple(r.get("calibration", ())),
                                   "halves": tuple(r["halves"]) if r.get("halves") else None,
                                   "loader_only_halves": (tuple(r["loader_only_halves"])
                                                          if r.get("loader_only_halves") else None),
                                   "probes": {k: x for k, x in r.items() if k in FIELDS}})
                         for r in v["repeats"])
            return VariantResult(v["label"], v["backend"], dict(v["overrides"]),
                                 v["h2d_bytes_per_sample"], reps, v.get("queue_batches"))

        return cls(d["env"], d["setup"], var(d["ceiling"]),
                   tuple(var(v) for v in d["variants"]), d["schema"],
                   bool(d.get("complete", True)))

    @classmethod
    def load(cls, path: str | Path) -> SuiteResult:
        """Read a ``results.json``: the one reader of ``plot``, ``report``, ``diff`` and
        ``--resume``; a one-line ``ValueError`` starting with "not" when it is not one."""
        try:
            d = json.loads(Path(path).read_text())
        except UnicodeDecodeError as e:
            raise ValueError("not a text file") from e
        except json.JSONDecodeError as e:
            raise ValueError(f"not JSON ({e.msg}, line {e.lineno})") from e
        except RecursionError as e:
            raise ValueError("not JSON (nested too deep)") from e
        if isinstance(d, dict) and d.get("schema") != SCHEMA:
            raise ValueError(f"not a compare results.json (schema {d.get('schema')!r}, expected {SCHEMA!r})")
        try:
            return cls.from_dict(d)
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise ValueError(f"not a compare results.json ({type(e).__name__}: {e})") from e


# Repeat fields by JSON type (each may be null or missing: older runs lack newer fields)
_NUMBERS = ("samples_per_s", "loader_only_per_s", "wait_p50_ms", "wait_p95_ms", "idle_pct",
            "cpu_util_pct", "nvml_util_pct", "steps", "window_s", "pid", "settle_batches")
_PAIRS = ("halves", "loader_only_halves")


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _type(x) -> str:
    return "null" if x is None else {dict: "an object", list: "a list", str: "a string",
                                     bool: "a boolean"}.get(type(x), type(x).__name__)


def check_doc(d) -> None:
    """Refuse a document not shaped as ``dump`` writes it: a ``ValueError`` naming the first
    malformed field (``variants[0].repeats[1].samples_per_s is a string ('fast'), ...``)."""
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
            if r.get("decoder") is not None and not isinstance(r["decoder"], str):
                raise bad(f"{at}.decoder", r["decoder"], "a string")


REPEAT_FIELDS = frozenset(f.name for f in fields(Repeat)) - {"probes"}
