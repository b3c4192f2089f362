"""Measuring one run: data wait, step compute, GPU idle, throughput.

NOTE [how idle time is measured]
The host clock around ``next(loader)`` gives the data wait; CUDA events around the model step
on the compute stream give its compute time, so GPU idle % = 1 - sum(e1 - e0) / (end - start)
of the timed window. Throughput is samples over host wall time after a synchronize; on the CPU
all of it comes from the host clock.
"""
from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

# A data wait is *long* above max(LONG_WAIT_FLOOR_MS, LONG_WAIT_TIMES x the window's median).
LONG_WAIT_FLOOR_MS, LONG_WAIT_TIMES = 20.0, 4.0


def long_waits(waits_ms) -> list[int]:
    """The indices of a window's long waits (``LONG_WAIT_*``)."""
    w = list(waits_ms)
    if not w:
        return []
    floor = max(LONG_WAIT_FLOOR_MS, LONG_WAIT_TIMES * sorted(w)[len(w) // 2])
    return [i for i, x in enumerate(w) if x > floor]


def out_of_step(waits_ms, period: int) -> bool:
    """Whether the last ``3 x period`` waits hold fewer than three long ones (no waves of
    ``period`` workers in step; NOTE [settling] in compare.runner)."""
    w = list(waits_ms)[-3 * period:]
    return len(w) >= 3 * period and len(long_waits(w)) < 3


@dataclass(frozen=True)
class RunMeasure:
    """One timed run of ``steps`` steps."""

    samples: int
    wall_s: float
    waits_ms: list[float]
    compute_ms: list[float]
    timeline_ms: float
    starts_ms: list[float] = field(default_factory=list)  # each step's start in the window
    # extra warm-up batches, and whether the workers got out of step by the cap (None: no settling)
    settle_batches: int | None = None
    settled: bool | None = None
    # ``mark``: each step's (wait start, wait end, step launched), ``time.time_ns`` (probes.trace)
    marks_ns: list[tuple[int, int, int]] = field(default_factory=list)

    def halves(self) -> tuple[float, float] | None:
        """Samples/s over the window's first and second halves (``None`` under 4 steps)."""
        n, t = len(self.starts_ms), self.starts_ms
        if n < 4 or self.timeline_ms <= 0:
            return None
        m, per = n // 2, self.samples / n
        first, second = t[m] - t[0], self.timeline_ms - t[m]
        if first <= 0 or second <= 0:
            return None
        return round(1e3 * m * per / first, 2), round(1e3 * (n - m) * per / second, 2)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def idle_pct(self) -> float:
        if self.timeline_ms <= 0:
            return float("nan")
        return max(0.0, 100.0 * (1.0 - sum(self.compute_ms) / self.timeline_ms))

    def wait_pct(self, q: float) -> float:
        return percentile(self.waits_ms, q)


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def measure(batches: Iterator, step: Callable, steps: int, warmup: int,
            device: torch.device, settle: tuple[int, int] | None = None,
            agree: Callable[[bool], bool] | None = None, mark: bool = False) -> RunMeasure:
    """Run ``warmup`` untimed then ``steps`` timed steps of ``step(images, labels)``.

    Args:
        batches: endless ``(images, labels)`` (``runner.endless``).
        settle: ``(period, cap)``: warm up ``period`` batches at a time until ``out_of_step``
            or ``cap`` more (NOTE [settling] in compare.runner); ``agree`` makes it the job's.
        mark: keep ``RunMeasure.marks_ns`` for a profiler's trace.
    """
    cuda = device.type == "cuda"
    seen: list[float] = []  # the warm-up's data waits, which settling reads

    def untimed(n: int) -> None:
        for _ in range(n):
            t = time.perf_counter()
            x, y = next(batches)
            seen.append((time.perf_counter() - t) * 1e3)
            step(x, y)

    untimed(warmup)
    extra, settled = (0, False) if settle else (None, None)
    if settle:
        period, cap = settle
        job = agree or (lambda flag: flag)
        while not (settled := job(out_of_step(seen, period))) and extra < cap:
            untimed(period)
            extra += period
    if cuda:
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    waits: list[float] = []
    compute: list[float] = []
    events = []
    marks: list[tuple[int, int, int]] = []
    n = 0
    t0 = time.perf_counter()
    starts: list[float] = []
    for _ in range(steps):
        t = time.perf_counter()
        if not cuda:
            starts.append((t - t0) * 1e3)
        w0 = time.time_ns() if mark else 0
        x, y = next(batches)
        t1 = time.perf_counter()
        w1 = time.time_ns() if mark else 0
        waits.append((t1 - t) * 1e3)
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            step(x, y)
            e1.record()
            events.append((e0, e1))
        else:
            step(x, y)
            compute.append((time.perf_counter() - t1) * 1e3)
        if mark:
            marks.append((w0, w1, time.time_ns()))
        n += len(y)
    if cuda:
        end.record()
        torch.cuda.synchronize(device)
        wall = time.perf_counter() - t0
        compute = [a.elapsed_time(b) for a, b in events]
        starts = [start.elapsed_time(a) for a, _ in events]
        timeline = start.elapsed_time(end)
    else:
        wall = time.perf_counter() - t0
        timeline = wall * 1e3
    return RunMeasure(n, wall, waits, compute, timeline, starts, extra, settled, marks)


class LoaderOnly(NamedTuple):
    """A loader-only window's img/s, and over its first and last stretches (``None`` under 4)."""

    rate: float
    halves: tuple[float, float] | None


def stretch(steps: int, period: int | None) -> int:
    """The batches in each of a loader-only window's two rate stretches (``loader_only``):
    half the window, rounded down to a whole number of ``period`` batches when it holds one.

    NOTE [waves and halves]
    Workers in step deliver in waves of ``num_workers`` batches; plain halves cut the waves
    unevenly (62 batches in waves of 14: 5 and 4 arrivals) and showed a ramp that was not there
    (docs/benchmarking.md, Steady state). Whole waves fill any phase alike."""
    half = steps // 2
    if period and period > 1 and half >= period:
        return half - half % period
    return half


def loader_only(batches: Iterator, steps: int, warmup: int, device: torch.device,
                period: int | None = None) -> LoaderOnly:
    """The loader alone for ``steps`` batches after ``warmup``, synchronised at the end;
    ``period``: its workers, whose waves the stretches hold whole."""
    for _ in range(warmup):
        next(batches)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    length = stretch(steps, period)
    n, marks = 0, {}
    t0 = time.perf_counter()
    for i in range(steps):
        if i in (length, steps - length):
            marks[i] = (time.perf_counter(), n)
        x, y = next(batches)
        n += len(y)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t1 = time.perf_counter()
    halves = None
    if steps >= 4 and length in marks and steps - length in marks:
        (ta, na), (tb, nb) = marks[length], marks[steps - length]
        if ta > t0 and t1 > tb:
            halves = (round(na / (ta - t0), 2), round((n - nb) / (t1 - tb), 2))
    return LoaderOnly(n / (t1 - t0), halves)


class CpuUtil:
    """Whole-machine CPU utilisation between ``start()`` and ``stop()``, from ``/proc/stat``."""

    PATH = "/proc/stat"

    def __init__(self) -> None:
        self._a = None

    @classmethod
    def _read(cls) -> tuple[int, int] | None:
        """``(busy, total)`` jiffies of the ``cpu`` line (guest time is in user and nice)."""
        try:
            with open(cls.PATH) as f:
                v = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        if len(v) < 4:
            return None
        total = sum(v[:8])
        return total - v[3] - (v[4] if len(v) > 4 else 0), total

    def start(self) -> None:
        self._a = self._read()

    def stop(self) -> float | None:
        """The busy share of the CPU since ``start()``, in %."""
        b, a = self._read(), self._a
        if a is None or b is None or b[1] == a[1]:
            return None
        return 100.0 * (b[0] - a[0]) / (b[1] - a[1])


class NvmlSampler:
    """Samples NVML GPU utilisation in a thread (the cross-check for the event-based idle %)."""

    def __init__(self, device_index: int = 0, period_s: float = 0.02):
        self.samples: list[int] = []
        self.period = period_s
        self._stop = threading.Event()
        self._thread = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._h = pynvml.nvmlDeviceGetHandleByIndex(device_index)
            self._nv = pynvml
        except Exception:
            self._nv = None

    @property
    def available(self) -> bool:
        return self._nv is not None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self._nv.nvmlDeviceGetUtilizationRates(self._h).gpu)
            except Exception:
                return
            self._stop.wait(self.period)

    def __enter__(self):
        if self.available:
            self._thread = threading.Thread(target=self._run, daemon=True, name="nvml-sampler")
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def mean_util(self) -> float | None:
        return statistics.fmean(self.samples) if self.samples else None
