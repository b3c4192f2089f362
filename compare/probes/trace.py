"""``--trace``: a torch.profiler timeline of one more training window after the first repeat of
each row, and the CUDA calls in flight during its longest waits (*stalls*).

NOTE [trace]: CUPTI does not see everything (a driver-API free, the hardware JPEG decoder).
Files in OUT/trace: ``<unit>.trace.json.gz`` (for Perfetto) and ``<unit>.summary.json``.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import statistics
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from . import Probe

T = TypeVar("T")

MARK_WAIT = "gpu_feed/wait"
MARK_STEP = "gpu_feed/step"
STALL_FLOOR_MS = 5.0
STALL_FACTOR = 3.0
TOP = 5  # calls listed per stall
HOST_CATS = ("cuda_runtime", "cuda_driver")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
DROPPED_CATS = ("cpu_op", "python_function", "cpu_instant_event")  # left out of the trace file


def slug(label: str) -> str:
    """A file name for a unit's label (``"dali hw_decoder_load=1"`` -> ``dali-hw_decoder_load-1``)."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", label).strip("-") or "unit"


def _config():
    """CUDA synchronisation events, where this torch has the switch (``None`` otherwise)."""
    import torch

    try:
        return torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True)
    except (AttributeError, TypeError):  # pragma: no cover - an older torch
        return None


def with_marks(trace: dict[str, Any], marks_ns) -> dict[str, Any]:
    """``trace`` with a ``MARK_WAIT`` and a ``MARK_STEP`` range for each of ``marks_ns``."""
    base = int(trace.get("baseTimeNanoseconds", 0))
    pid, tid = os.getpid(), threading.get_native_id()
    extra = []
    for a, b, c in marks_ns:
        for name, s, t in ((MARK_WAIT, a, b), (MARK_STEP, b, c)):
            extra.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": pid,
                          "tid": tid, "ts": (s - base) / 1e3, "dur": (t - s) / 1e3})
    return {**trace, "traceEvents": list(trace.get("traceEvents", [])) + extra}


def record(run: Callable[[], T], base: Path) -> tuple[T, dict[str, Any]]:
    """``run()`` under the profiler, its files written at ``base``: ``(run's result, summary)``.
    A profiler that fails gives a summary with its ``error``, never a failed run."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    acts = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    cfg = _config()
    kw = {"experimental_config": cfg} if cfg is not None and cuda else {}
    prof = profile(activities=acts, **kw)
    try:
        prof.start()
    except Exception as e:  # noqa: BLE001 - said in the summary and the report
        return run(), {"error": f"the profiler did not start: {type(e).__name__}: {e}"}
    try:
        got = run()
    finally:
        try:
            prof.stop()
        except Exception:  # noqa: BLE001 - a run that raised keeps its own error
            pass
    try:
        summary = _written(prof, got, base)
    except Exception as e:  # noqa: BLE001 - said in the summary and the report
        summary = {"error": f"the trace could not be written or read: {type(e).__name__}: {e}"}
    return got, summary


def _written(prof, got, base: Path) -> dict[str, Any]:
    """Export ``prof``'s trace with ``got``'s marks, analyse it, write both files."""
    base.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".json", dir=base.parent)
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        with open(tmp) as f:
            data = with_marks(json.load(f), getattr(got, "marks_ns", ()))
    finally:
        os.unlink(tmp)
    summary = analyse(data)
    slim = {**data, "traceEvents": [e for e in data.get("traceEvents", [])
                                    if e.get("cat") not in DROPPED_CATS]}
    with gzip.open(f"{base}.trace.json.gz", "wt") as f:
        json.dump(slim, f)
    Path(f"{base}.summary.json").write_text(json.dumps(summary, indent=1, allow_nan=False))
    return summary


def _span(e: dict) -> tuple[float, float]:
    s = float(e["ts"])
    return s, s + float(e.get("dur", 0.0))


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def analyse(trace: dict[str, Any]) -> dict[str, Any]:
    """The waits of a marked Chrome trace, and per stall the host CUDA calls in flight
    (``ValueError`` for a trace without marks)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    waits = sorted(_span(e) for e in events
                   if e.get("name") == MARK_WAIT and e.get("cat") == "user_annotation")
    if not waits:
        raise ValueError(f"the trace has no {MARK_WAIT!r} range: it is not a window that "
                         "compare.probes.trace recorded")
    t0 = waits[0][0]
    calls = [e for e in events if e.get("cat") in HOST_CATS]
    wait_ms = [(b - a) / 1e3 for a, b in waits]
    limit = max(STALL_FLOOR_MS, STALL_FACTOR * statistics.median(wait_ms))
    stalls = []
    for i, ((a, b), w) in enumerate(zip(waits, wait_ms)):
        if w < limit:
            continue
        flight: dict[str, float] = {}
        for e in calls:
            if (ov := _overlap(*_span(e), a, b)) > 0:
                flight[e["name"]] = flight.get(e["name"], 0.0) + ov
        top = sorted(flight.items(), key=lambda kv: -kv[1])[:TOP]
        stalls.append({"step": i, "at_ms": round((a - t0) / 1e3, 3), "wait_ms": round(w, 3),
                       "in_flight": [{"name": n, "overlap_ms": round(v / 1e3, 3)}
                                     for n, v in top]})
    return {"steps": len(waits), "waits_ms": [round(w, 3) for w in wait_ms],
            "wait_ms": {"median": round(statistics.median(wait_ms), 3),
                        "max": round(max(wait_ms), 3), "stall_limit": round(limit, 3)},
            "stalls": stalls,
            "cuda_activity": any(e.get("cat") in HOST_CATS + GPU_CATS for e in events)}


def digest(summary: dict[str, Any], file: str) -> dict[str, Any]:
    """What a repeat keeps of ``summary``: its file, the stalls and the calls most in flight."""
    if "error" in summary:
        return {"file": None, "error": summary["error"]}
    total: dict[str, float] = {}
    for s in summary["stalls"]:
        for c in s["in_flight"]:
            total[c["name"]] = total.get(c["name"], 0.0) + c["overlap_ms"]
    top = sorted(total.items(), key=lambda kv: -kv[1])[:3]
    return {"file": file, "steps": summary["steps"], "stalls": len(summary["stalls"]),
            "stall_ms": round(sum(s["wait_ms"] for s in summary["stalls"]), 3),
            "cuda_activity": summary["cuda_activity"],
            "in_stalls": [[n, round(v, 3)] for n, v in top]}


def describe(d: dict[str, Any]) -> str:
    """One line for a repeat's trace digest (``summary.md``)."""
    if d.get("error"):
        return f"no trace: {d['error']}"
    n = d["stalls"]
    head = (f"{d['steps']} steps, " + (f"{n} stall{'s' if n > 1 else ''} ({d['stall_ms']:.1f} ms)"
                                       if n else "no stall"))
    if not d["cuda_activity"]:
        return f"{head}; no CUDA activity recorded (`{d['file']}`)"
    top = "; ".join(f"{name}: {ms:.1f} ms" for name, ms in d["in_stalls"])
    return f"{head}{'; in flight during the stalls: ' + top if top else ''} (`{d['file']}`)"


def unit_base(folder: str, unit: str) -> Path:
    """Where ``unit``'s trace files go in ``folder``; under torchrun each rank has its own."""
    import torch

    dist = torch.distributed
    rank = (f"-rank{dist.get_rank()}" if dist.is_available() and dist.is_initialized()
            and dist.get_world_size() > 1 else "")
    return Path(folder) / (slug(unit) + rank)


class Trace(Probe):
    name = "trace"
    fields = ("trace",)  # digest(): the summary's file, the stalls, what was in flight

    def add_arguments(self, add) -> None:
        add("--trace", action="store_true", lab=True,
            help="after the first repeat of each variant (and of the ceiling), trace one more "
                 "training window with torch.profiler into OUT/trace, with the CUDA calls in "
                 "flight during its longest waits; not in the results (compare.probes.trace)")

    def setting(self, a, out):
        return str(Path(out) / "trace") if getattr(a, "trace", False) else None

    def after_windows(self, setting, rerun, unit, first) -> dict[str, Any]:
        if not first:
            return {}
        base = unit_base(setting, f"{unit} #1")
        _, summary = record(rerun, base)
        return {"trace": digest(summary, f"{base.parent.name}/{base.name}.summary.json")}

    def summary_lines(self, res) -> list[str]:
        rows = ([res.ceiling] if res.ceiling is not None else []) + list(res.variants)
        got = [f"- {v.label}: {describe(r.probes['trace'])}" for v in rows for r in v.repeats
               if r.probes.get("trace")]
        if not got:
            return []
        return ["**Traces** (`--trace`: one more training window after the first repeat, under "
                "torch.profiler; not in the figures above)", "", *got, ""]


PROBE = Trace()
