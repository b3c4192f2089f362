"""``--trace``: a profiler timeline of one more training window after the first repeat of each
row (and of the ceiling), and what was in flight while the step waited for data.

NOTE [trace]
The suite's numbers say how long the step waited, not why (a free of device or pinned memory
by the loader's threads that waits for the whole device, for one:
docs/investigations/dali-hardware-decoder.md). The window runs under ``torch.profiler`` with
CUDA activity only on a GPU (CUDA synchronisation events where this torch has them), CPU
activity without one; its numbers are not in the results, and the profiler slows a loader that
makes many CUDA calls. The steps are marked on the host's clock, the profiler's
(``RunMeasure.marks_ns``), as ``MARK_WAIT`` / ``MARK_STEP`` ranges, and ``analyse`` reads the
exported Chrome trace: the waits and the *stalls* among them (at least ``STALL_FLOOR_MS`` and
``STALL_FACTOR`` x the median); the CUDA runtime and driver calls by name, allocation calls
(``ALLOCATION``) apart; the synchronisation events; and per stall the host calls in flight,
each stream's busy time and the longest time no stream but the step's ran (``others_quiet_ms``).
CUPTI does not see everything (a driver-API free, the hardware JPEG decoder), so an empty stall
says only that nothing it sees was in flight. Files: ``<unit>.trace.json.gz`` (for Perfetto,
without CPU operators) and ``<unit>.summary.json``; each traced repeat keeps a digest
(``Repeat.probes["trace"]``).
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
LONG_CALL_MS = 1.0
TOP = 10  # calls listed per stall, and names in the by-name tables
HOST_CATS = ("cuda_runtime", "cuda_driver")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
SYNC_CAT = "cuda_sync"
DROPPED_CATS = ("cpu_op", "python_function", "cpu_instant_event")  # left out of the trace file
# calls that allocate or free device or pinned memory, or map it: the frees among them wait
# for all work on the device (CUDA runtime API, "implicit synchronization")
ALLOCATION = re.compile(r"^(cuda(Malloc|Free|HostAlloc|HostRegister|HostUnregister)"
                        r"|cuMem(Alloc|Free|HostAlloc|HostRegister|HostUnregister|Map|Unmap"
                        r"|Release|Create))")


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


def thread_names(ids=()) -> dict[int, str]:
    """``{thread id: name}`` of this process's threads, from ``/proc`` (empty elsewhere): by
    the kernel's thread id, and for each of ``ids`` that is none, as CUPTI gives the threads
    of CUDA calls (the low 32 bits of the thread's ``pthread_t``), the thread whose stack
    mapping holds it (glibc keeps a thread's ``pthread_t`` in its stack's mapping; the stack
    pointer of a waiting thread is in ``/proc/self/task/TID/syscall``)."""
    out: dict[int, str] = {}
    stacks: list[tuple[int, int, str]] = []
    try:
        tids = os.listdir("/proc/self/task")
        maps = [tuple(int(x, 16) for x in line.split()[0].split("-"))
                for line in Path("/proc/self/maps").read_text().splitlines()]
    except OSError:
        return out
    for t in tids:
        try:
            name = f"{Path(f'/proc/self/task/{t}/comm').read_text().strip()} ({t})"
            out[int(t)] = name
            sp = int(Path(f"/proc/self/task/{t}/syscall").read_text().split()[-2], 16)
        except (OSError, ValueError, IndexError):  # a running thread has no stack pointer
            continue
        stacks += [(lo, hi, name) for lo, hi in maps if lo <= sp < hi]
    low = 0xFFFFFFFF
    for i in ids:
        if i in out or not isinstance(i, int):
            continue
        for lo, hi, name in stacks:
            if (lo & low) <= i < (hi & low) and (hi - lo) <= low:
                out[i] = f"{name} [{i}]"
                break
    return out


def with_marks(trace: dict[str, Any], marks_ns) -> dict[str, Any]:
    """``trace`` with a ``MARK_WAIT`` and a ``MARK_STEP`` range for each ``(wait start, wait
    end, step launched)`` of ``marks_ns`` (ns since the epoch; the trace's times are µs after
    its ``baseTimeNanoseconds``)."""
    base = int(trace.get("baseTimeNanoseconds", 0))
    pid, tid = os.getpid(), threading.get_native_id()
    extra = []
    for a, b, c in marks_ns:
        for name, s, t in ((MARK_WAIT, a, b), (MARK_STEP, b, c)):
            extra.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": pid,
                          "tid": tid, "ts": (s - base) / 1e3, "dur": (t - s) / 1e3})
    return {**trace, "traceEvents": list(trace.get("traceEvents", [])) + extra}


def record(run: Callable[[], T], base: Path) -> tuple[T, dict[str, Any]]:
    """``run()`` (a ``measure`` with ``mark``) under the profiler; writes ``base`` +
    ``.trace.json.gz`` (the trace with the marks, without CPU operators) and ``.summary.json``
    (``analyse``), and returns ``(run's result, the summary)``. The trace is extra to the run's
    timed windows, so a profiler that fails to start, stop or export gives a summary with its
    ``error`` instead of failing the run; an error of ``run()`` itself is raised."""
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
    ids = {e.get("tid") for e in data["traceEvents"] if e.get("cat") in HOST_CATS + (SYNC_CAT,)}
    summary = analyse(data, thread_names(ids))
    slim = {**data, "traceEvents": [e for e in data.get("traceEvents", [])
                                    if e.get("cat") not in DROPPED_CATS]}
    with gzip.open(f"{base}.trace.json.gz", "wt") as f:
        json.dump(slim, f)
    Path(f"{base}.summary.json").write_text(json.dumps(summary, indent=1, allow_nan=False))
    return summary


def _spans(events: list[dict], name: str) -> list[tuple[float, float]]:
    return sorted(_span(e) for e in events
                  if e.get("name") == name and e.get("cat") == "user_annotation")


def _span(e: dict) -> tuple[float, float]:
    s = float(e["ts"])
    return s, s + float(e.get("dur", 0.0))


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _by_name(calls: list[dict], names: dict[int, str]) -> list[dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for e in calls:
        row = table.setdefault(e["name"], {"name": e["name"], "count": 0, "total_ms": 0.0,
                                           "max_ms": 0.0, "threads": set()})
        d = float(e.get("dur", 0.0)) / 1e3
        row["count"] += 1
        row["total_ms"] += d
        row["max_ms"] = max(row["max_ms"], d)
        row["threads"].add(_thread(e, names))
    rows = sorted(table.values(), key=lambda r: -r["total_ms"])[:TOP]
    return [{**r, "total_ms": round(r["total_ms"], 3), "max_ms": round(r["max_ms"], 3),
             "threads": sorted(r["threads"])} for r in rows]


def _thread(e: dict, names: dict[int, str]) -> str:
    tid = e.get("tid")
    try:
        tid = int(tid)
    except (TypeError, ValueError):
        return str(tid)
    return names.get(tid, str(tid))


def _stream(e: dict) -> str:
    args = e.get("args") or {}
    return f"{args.get('device', e.get('pid'))}:{args.get('stream', e.get('tid'))}"


def analyse(trace: dict[str, Any], names: dict[int, str] | None = None) -> dict[str, Any]:
    """What a Chrome trace of a marked window shows (NOTE [trace]). ``names``: thread names by
    id (``thread_names``), added to the trace's own.

    Raises:
        ValueError: the trace has no marked step (not a window this module recorded).
    """
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    names = dict(names or {})
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            try:
                tid = int(e["tid"])
                names.setdefault(tid, f"{(e.get('args') or {}).get('name', '')} ({tid})")
            except (KeyError, TypeError, ValueError):
                continue
    waits, steps = _spans(events, MARK_WAIT), _spans(events, MARK_STEP)
    if not waits:
        raise ValueError(f"the trace has no {MARK_WAIT!r} range: it is not a window that "
                         "compare.probes.trace recorded")
    t0, t1 = waits[0][0], max(max(b for _, b in waits), max((b for _, b in steps), default=0))
    inside = [e for e in events if _overlap(*_span(e), t0, t1) > 0 or t0 <= float(e["ts"]) <= t1]
    calls = [e for e in inside if e.get("cat") in HOST_CATS]
    gpu = [e for e in inside if e.get("cat") in GPU_CATS]
    syncs = [e for e in inside if e.get("cat") == SYNC_CAT]
    streams: dict[str, dict[str, float]] = {}
    for e in gpu:
        row = streams.setdefault(_stream(e), {"events": 0, "busy_ms": 0.0})
        row["events"] += 1
        row["busy_ms"] += float(e.get("dur", 0.0)) / 1e3
    compute = max(streams, key=lambda k: streams[k]["busy_ms"]) if streams else None
    wait_ms = [(b - a) / 1e3 for a, b in waits]
    med = statistics.median(wait_ms)
    limit = max(STALL_FLOOR_MS, STALL_FACTOR * med)
    stalls = [{"step": i, "at_ms": round((a - t0) / 1e3, 3), "wait_ms": round(w, 3),
               **_stall(a, b, calls, gpu, compute, names)}
              for i, ((a, b), w) in enumerate(zip(waits, wait_ms)) if w >= limit]
    alloc = [e for e in calls if ALLOCATION.match(e["name"])]
    long_calls = sorted((e for e in calls if float(e.get("dur", 0.0)) >= LONG_CALL_MS * 1e3),
                        key=lambda e: -float(e.get("dur", 0.0)))[:TOP]
    return {
        "steps": len(waits), "window_ms": round((t1 - t0) / 1e3, 3),
        "wait_ms": {"median": round(med, 3), "max": round(max(wait_ms), 3),
                    "stall_limit": round(limit, 3)},
        "waits_ms": [round(w, 3) for w in wait_ms],
        "stalls": stalls,
        "cuda_activity": bool(gpu or calls),
        "calls": _by_name(calls, names),
        "allocation_calls": _by_name(alloc, names),
        "long_calls": [{"name": e["name"], "thread": _thread(e, names),
                        "at_ms": round((float(e["ts"]) - t0) / 1e3, 3),
                        "ms": round(float(e.get("dur", 0.0)) / 1e3, 3)} for e in long_calls],
        "syncs": _by_name(syncs, names),
        "streams": {k: {"events": v["events"], "busy_ms": round(v["busy_ms"], 3)}
                    for k, v in sorted(streams.items())},
        "compute_stream": compute,
    }


def _stall(a: float, b: float, calls: list[dict], gpu: list[dict], compute: str | None,
           names: dict[int, str]) -> dict[str, Any]:
    """What ran during the wait ``[a, b]``: the host calls in flight (longest overlap first),
    each stream's busy time, and the longest time no stream but ``compute`` (the busiest: the
    step's) ran anything. A loader whose GPU work went quiet for most of the stall waited
    upstream of the GPU (its CPU work, or a host call that waited for the device)."""
    flight: dict[tuple[str, str], float] = {}
    for e in calls:
        ov = _overlap(*_span(e), a, b)
        if ov > 0:
            key = (e["name"], _thread(e, names))
            flight[key] = flight.get(key, 0.0) + ov
    busy: dict[str, float] = {}
    others: list[tuple[float, float]] = []
    for e in gpu:
        s, t = _span(e)
        ov = _overlap(s, t, a, b)
        if ov > 0:
            busy[_stream(e)] = busy.get(_stream(e), 0.0) + ov
            if _stream(e) != compute:
                others.append((max(s, a), min(t, b)))
    quiet, edge = 0.0, a
    for s, t in sorted(others):
        quiet, edge = max(quiet, s - edge), max(edge, t)
    quiet = max(quiet, b - edge)
    top = sorted(flight.items(), key=lambda kv: -kv[1])[:TOP]
    return {"in_flight": [{"name": n, "thread": th, "overlap_ms": round(v / 1e3, 3)}
                          for (n, th), v in top],
            "streams_busy_ms": {k: round(v / 1e3, 3) for k, v in sorted(busy.items())},
            "others_quiet_ms": round(quiet / 1e3, 3)}


def digest(summary: dict[str, Any], file: str) -> dict[str, Any]:
    """The few facts of ``summary`` a repeat's results keep (``Repeat.probes["trace"]``): the summary's
    file, the stalls and the host calls most in flight during them, summed over the stalls;
    or the summary's ``error``."""
    if "error" in summary:
        return {"file": None, "error": summary["error"]}
    total: dict[tuple[str, str], float] = {}
    for s in summary["stalls"]:
        for c in s["in_flight"]:
            key = (c["name"], c["thread"])
            total[key] = total.get(key, 0.0) + c["overlap_ms"]
    top = sorted(total.items(), key=lambda kv: -kv[1])[:3]
    return {"file": file, "steps": summary["steps"], "stalls": len(summary["stalls"]),
            "stall_ms": round(sum(s["wait_ms"] for s in summary["stalls"]), 3),
            "quiet_ms": round(sum(s["others_quiet_ms"] for s in summary["stalls"]), 3),
            "cuda_activity": summary["cuda_activity"],
            "allocation_calls": sum(r["count"] for r in summary["allocation_calls"]),
            "in_stalls": [[n, th, round(v, 3)] for (n, th), v in top]}


def describe(d: dict[str, Any]) -> str:
    """One line for a repeat's trace digest (``summary.md``)."""
    if d.get("error"):
        return f"no trace: {d['error']}"
    if d["stalls"] == 0:
        head = f"{d['steps']} steps, no stall"
    else:
        head = (f"{d['steps']} steps, {d['stalls']} stall{'s' if d['stalls'] > 1 else ''} "
                f"({d['stall_ms']:.1f} ms)")
    if not d["cuda_activity"]:
        return f"{head}; no CUDA activity recorded (`{d['file']}`)"
    top = "; ".join(f"{n} on {th}: {ms:.1f} ms" for n, th, ms in d["in_stalls"])
    during = f"; in flight during the stalls: {top}" if top else (
        "; nothing CUPTI sees in flight during the stalls" if d["stalls"] else "")
    quiet = (f"; no stream but the step's ran for {d['quiet_ms']:.1f} ms of them"
             if d["stalls"] else "")
    return f"{head}, {d['allocation_calls']} allocation calls{quiet}{during} (`{d['file']}`)"


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
                 "training window with torch.profiler into OUT/trace: the waits, the CUDA "
                 "calls and stream activity in flight during the long ones; its numbers are "
                 "not in the results (compare.probes.trace)")

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
                "torch.profiler; not in the figures above; NOTE [trace] in "
                "compare.probes.trace)", "", *got, ""]


PROBE = Trace()
