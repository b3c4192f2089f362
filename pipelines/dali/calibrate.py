"""Choosing the hardware decoder's share by measurement (``DaliOptions.hw_decoder_load=None``).

NOTE [calibration]
On the H200 no one ``hw_decoder_load`` serves every use: 0.0 trains ResNet-50 closest to the
ceiling, 1.0 decodes fastest when nothing else runs on the GPU (docs/results/h200/README.md:
dali-hw-table-train, dali-hw-table-loader). With the hardware decoder on, a batch waits for the
GPU work queued before it, the consumer's included
(docs/investigations/dali-hardware-decoder.md). Which one wins depends on how much GPU work the
consumer queues ahead, and only the consumer's loop shows that. So with ``None`` the
loader measures it on the job's own batches:

1. It starts with ``CANDIDATES[0]`` and times windows of ``WINDOW`` batches, from the consumer's
   side: the time from handing out one batch to handing out the next holds the consumer's work
   and any wait for data. On a GPU the window is read from CUDA events recorded on the
   consumer's stream as each batch is handed out (no host sync; the result is read a few
   batches later, when the GPU has passed the second event), so it is the GPU's own timeline:
   compute plus the idle gaps of waiting. Without a GPU it is the host clock.
2. A window in a new use starts a calibration. A new use is the first window, or ``STRIKES``
   windows in a row whose period departs more than ``DRIFT`` from the chosen setting's, or one
   window ``JUMP`` times slower or faster. Once a use is decided its pace is watched in windows
   of half the size, so a change is seen sooner: on the H200 two watched windows and an epoch
   start kept a training window at the loader-only setting for its first half
   (docs/investigations/dali-hardware-decoder.md). Each candidate in turn takes over the
   lanes, ``settle`` batches run untimed, then one window is timed. The fastest candidate
   wins; ``CANDIDATES[0]`` is kept unless another is more than ``MARGIN`` faster, so noise
   does not flip the choice.
   Every candidate's pipelines are built with the loader (memory for each: the nvJPEG
   paddings of ``DaliOptions``), because a rebuild costs seconds: a first version that rebuilt
   on every switch spent them inside the timed windows on the H200, and a second one's spare
   pipelines paid their first use there instead, so each spare set decodes one batch when the
   loader is built (docs/investigations/dali-hardware-decoder.md). A switch
   stops the running pipelines,
   drains what they hold (those batches are made again) and hands each lane, from its first
   batch not yet handed out, to the other candidate's pipelines, reset.
3. The choice is cached per machine (``CalibrationCache``: GPU, DALI version, data, recipe and
   batch), with each candidate's period. A later job, or a later use in the same job, whose
   first window at the running setting matches a cached period within ``DRIFT`` takes that
   entry's choice without calibrating again.

The cost counts wherever the loader runs: the candidates' windows (one at the slower setting)
and the batches a switch drains. After a switch the crops come from the other pipelines'
random generators, so they differ from an uninterrupted run's; the samples and their order do
not.
In epochs shorter than ``settle + WINDOW + 1`` batches the window is what an epoch holds
after ``settle`` (``window_for``; on the H200 16-batch epochs of large photos never decided);
epochs shorter than ``settle + MIN_WINDOW + 1`` never complete one, and the loader stays at
``CANDIDATES[0]``. ``DaliLoader.calibrator.decisions`` records every decision.
On the H200 the choices were right in both uses and cost a few percent inside the suite's
short windows (docs/investigations/dali-hardware-decoder.md). ``None`` is an option and
0.0 the default: a switch changes which pipelines' generators draw the crops, so a resumed
run draws the saved run's crops only until either run switches (``pipelines.dali.loader``
NOTE [resume]).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from pipelines.sources.cache import cache_base

CANDIDATES: tuple[float, ...] = (0.0, 1.0)  # the first is kept on a tie: the training default
WINDOW = 16    # batches per timed window
MARGIN = 0.03  # another candidate must be this much faster (period) to replace the first
DRIFT = 0.25   # a window this far from the chosen setting's period is a new use ...
STRIKES = 2    # ... when this many watched windows in a row are
JUMP = 2.0     # ... or at once when one is this many times slower or faster
MIN_WINDOW = 4  # the shortest window, in epochs too short for ``WINDOW`` (``window_for``)
VERSION = 1
MAX_ENTRIES = 8  # cached uses per key; the oldest goes first


@dataclass(frozen=True)
class Decision:
    """One choice: the setting, each candidate's period in ms per batch, and whether it was
    measured now (``"measured"``) or taken from the cache (``"cached"``)."""

    load: float
    periods_ms: dict[str, float]
    how: str

    def describe(self) -> str:
        per = ", ".join(f"{k}: {v:.1f}" for k, v in self.periods_ms.items())
        return f"hw_decoder_load {self.load:g} ({self.how}; ms per batch {per})"


class CalibrationCache:
    """Calibrated choices on this machine: ``<cache>/dali-calibration.json``, the cache folder
    being ``$GPU_FEED_CACHE``, else ``$XDG_CACHE_HOME/gpu-feed`` (``~/.cache``);
    ``GPU_FEED_CALIBRATION_CACHE=off`` turns it off and a path there replaces the file. A file
    that cannot be read or written costs a calibration, nothing else."""

    def __init__(self, path: Path | None):
        self.path = path

    @classmethod
    def default(cls) -> CalibrationCache:
        env = os.environ.get("GPU_FEED_CALIBRATION_CACHE")
        if env is not None and env.strip().lower() in ("off", "0", "no", "false"):
            return cls(None)
        if env:
            return cls(Path(env))
        return cls(cache_base() / "dali-calibration.json")

    def _read(self) -> dict:
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) and data.get("version") == VERSION else {}

    def lookup(self, key: str, load: float, period_ms: float) -> Decision | None:
        """The cached decision of a use whose period at ``load`` is within ``DRIFT`` of
        ``period_ms``, or ``None``."""
        for e in reversed(self._read().get("entries", {}).get(key, [])):
            try:
                got = float(e["periods_ms"][f"{load:g}"])
                if abs(period_ms / got - 1.0) <= DRIFT:
                    return Decision(float(e["load"]), dict(e["periods_ms"]), "cached")
            except (KeyError, TypeError, ValueError, ZeroDivisionError):
                continue
        return None

    def add(self, key: str, decision: Decision) -> None:
        if self.path is None:
            return
        data = self._read() or {"version": VERSION, "entries": {}}
        entries = data.setdefault("entries", {}).setdefault(key, [])
        entries.append({"load": decision.load, "periods_ms": decision.periods_ms,
                        "at": time.strftime("%Y-%m-%dT%H:%M:%S")})
        del entries[:-MAX_ENTRIES]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError:
            pass


def cache_key(*parts: object) -> str:
    """The cache key of a machine, data and recipe, from ``parts`` (their ``repr``)."""
    raw = "\0".join(repr(p) for p in (VERSION, *parts))
    return hashlib.sha256(raw.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def window_for(epoch_batches: int, settle: int) -> int:
    """The window for epochs of ``epoch_batches`` batches: ``WINDOW``, or what is left of an
    epoch after ``settle`` and the batch that opens the window when that is less (a window
    restarts at every epoch start), but at least ``MIN_WINDOW``."""
    return max(MIN_WINDOW, min(WINDOW, epoch_batches - settle - 1))


class _Timer(Protocol):
    """What ``Calibrator.timer`` is: ``HostTimer`` or ``EventTimer``."""

    def mark(self) -> Any: ...

    def seconds(self, a: Any, b: Any) -> float | None: ...


class HostTimer:
    """Windows on the host clock (CPU operators)."""

    def mark(self):
        return time.perf_counter()

    def seconds(self, a, b) -> float | None:
        return b - a


class EventTimer:
    """Windows on the consumer's CUDA stream: an event per mark, read once the GPU passed it."""

    def __init__(self, device):
        import torch
        self._torch = torch
        self.device = device

    def mark(self):
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record(self._torch.cuda.current_stream(self.device))
        return ev

    def seconds(self, a, b) -> float | None:
        if not b.query():
            return None
        return a.elapsed_time(b) / 1000.0


@dataclass
class Calibrator:
    """The state of NOTE [calibration]. The loader calls ``tick()`` as it hands out each batch
    and ``restart()`` at every break in the flow (an epoch start, a rebuild); ``tick`` returns
    the load to switch to, or ``None``.

    Args:
        settle: batches after a break before a window starts (the rebuilt queue fills).
        timer: ``HostTimer`` or ``EventTimer``.
        cache, key: where decisions are kept (``CalibrationCache``, ``cache_key``).
    """

    settle: int
    timer: _Timer = field(default_factory=HostTimer)
    cache: CalibrationCache = field(default_factory=lambda: CalibrationCache(None))
    key: str = ""
    candidates: tuple[float, ...] = CANDIDATES
    window: int = WINDOW
    load: float = field(init=False)
    decisions: list[Decision] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.load = self.candidates[0]
        self._ref: float | None = None          # the chosen setting's period, s per batch
        self._trial: dict[float, float] | None = None
        self._strikes = 0  # watched windows in a row off the chosen setting's pace
        self._start = self._end = None
        self._closed = 0  # the size of the window awaiting its result
        self.restart()

    def restart(self) -> None:
        """A break in the flow: the window under way is dropped and the next one waits
        ``settle`` batches. A window that closed before the break keeps its result, which a
        CUDA event gives only some batches later: a window that ends an epoch counts."""
        self._n = -self.settle
        if self._end is None:
            self._start = None

    def tick(self) -> float | None:
        if self._end is not None:  # a window closed: wait for its result
            s = self.timer.seconds(self._start, self._end)
            if s is None:
                return None
            size = self._closed
            self._start, self._end, self._n = None, None, min(self._n, 0)
            return self._measured(s / size)
        self._n += 1
        if self._n <= 0:
            return None
        if self._start is None:
            self._start, self._n = self.timer.mark(), 0
            return None
        if self._n == self._size():
            self._end, self._closed = self.timer.mark(), self._n
            return self.tick()  # already passed on the host clock
        return None

    def _size(self) -> int:
        """Batches in this window: ``window`` while deciding, half that while watching the
        pace of a decided use (a change of use is then seen sooner)."""
        return self.window if self._ref is None or self._trial is not None \
            else max(2, self.window // 2)

    # -- decisions ------------------------------------------------------------------------
    def _measured(self, period: float) -> float | None:
        if self._trial is not None:
            self._trial[self.load] = period
            rest = [c for c in self.candidates if c not in self._trial]
            if rest:
                return self._switch(rest[0])
            first = self.candidates[0]
            best = min(self._trial, key=cast("Callable[[float], float]", self._trial.get))
            choice = best if self._trial[best] < (1.0 - MARGIN) * self._trial[first] else first
            d = Decision(choice, {f"{c:g}": round(p * 1e3, 3) for c, p in self._trial.items()},
                         "measured")
            self.decisions.append(d)
            self.cache.add(self.key, d)
            self._ref, self._trial = self._trial[choice], None
            return self._switch(choice)
        if self._ref is not None:
            if abs(period / self._ref - 1.0) <= DRIFT:
                self._strikes = 0
                return None  # the same use
            self._strikes += 1
            if self._strikes < STRIKES and max(period / self._ref, self._ref / period) < JUMP:
                return None  # one window off the pace: a hiccup, or a new use? wait for one more
        self._strikes = 0
        hit = self.cache.lookup(self.key, self.load, period * 1e3)
        if hit is not None and hit.load in self.candidates:
            self.decisions.append(hit)
            self._ref = hit.periods_ms.get(f"{hit.load:g}", period * 1e3) / 1e3
            return self._switch(hit.load)
        self._trial = {self.load: period}
        return self._switch(next(c for c in self.candidates if c != self.load))

    def _switch(self, load: float) -> float | None:
        if load == self.load:
            return None
        self.load = load
        self.restart()
        return load


__all__ = ["CANDIDATES", "CalibrationCache", "Calibrator", "Decision", "EventTimer",
           "HostTimer", "cache_key", "window_for"]
