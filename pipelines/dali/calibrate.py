"""The tuner of ``DaliOptions(hw_decoder_load=None)`` (opt-in): the hardware decoder's share
and the pipeline count, chosen by timing the consumer's own loop.

NOTE [calibration]
No one setting of ``hw_decoder_load`` and ``pipelines`` serves every use: with the hardware
decoder on, a batch waits for the GPU work queued before it, the consumer's step included
(docs/investigations/dali-hardware-decoder.md), so a share that makes the loader alone fastest
slows a heavy model's training, and the pipeline count that suits a light model differs from
a heavy one's (docs/backends.md#dalioptions-dali). Only the consumer's loop shows which wins.
Every random draw is made on the host per sample (``pipelines.dali.loader`` NOTE [resume]), so
no setting changes a sample, a label, an index or a pixel: the loader can choose by measuring.
A ``Setting`` is one ``(hw_decoder_load, pipelines)`` pair; ``grid`` makes the candidates from
``GRID`` where the share is tuned (else the counts of ``COUNTS``), the first being the rules'
default (``DaliOptions.load_for``, ``lanes_for``), with an axis the user pinned held at its
value. The grid is small because every candidate costs a build and a trial: share 0 on one
pipeline (the rule, which heavy models train fastest with: the hardware decoder's queue waits
for their step), and shares 0.65 and 1 on two pipelines (light models and the loader alone);
the rows between them were never the fastest in either use
(docs/backends.md#the-tuner-opt-in).
The loader:

1. starts with the first candidate and times windows of ``WINDOW`` batches, from the
   consumer's side: the time from handing out one batch to handing out the next holds the
   consumer's work and any wait for data. On a GPU the window is read from CUDA events
   recorded on the consumer's stream as each batch is handed out (no host sync; the result is
   read a few batches later, when the GPU has passed the second event), so it is the GPU's
   own timeline: compute plus the idle gaps of waiting. Without a GPU it is the host clock.
2. A window in a new use starts a trial. A new use is the first window, or ``STRIKES``
   windows in a row whose period departs more than ``DRIFT`` from the chosen setting's, or one
   window ``JUMP`` times slower or faster (a model switch, evaluation after training). Once a
   use is decided its pace is watched in windows of half the size, so a change is seen
   sooner. Each other candidate in turn takes over the lanes, ``settle`` batches run untimed,
   then one window is timed. The fastest wins; the first candidate is kept unless another is
   more than ``MARGIN`` faster, so noise does not flip the choice.
   Only the running setting's pipelines exist when the loader is built. A candidate's are
   built when the tuner moves to it: the graph is traced on the consumer's thread (quick),
   and DALI's build and one warm-up batch (the last batch fed) run in a background thread on
   the loader's device, because a build, or a set's first use, costs seconds
   (docs/investigations/dali-hardware-decoder.md). Meanwhile the running setting serves and
   the calibrator is not ticked, so no timed window and no consumer step waits for a build.
   A switch stops the running pipelines, drains what they hold (those batches are made
   again), releases them, and hands the plan, from its first batch not yet handed out, to
   the new setting's pipelines; a new pipeline count re-deals the positions to its lanes
   (``PlanSource.start_epoch(lanes=...)``). So at most two settings' pipelines exist at
   once (the running one and the one being built), only the chosen one's after a decision,
   and a later trial builds again.
3. The choice is cached per machine (``CalibrationCache``: GPU, DALI version, data, recipe,
   batch and the candidates), with each candidate's period: the period at the running setting
   is the use's step-time band. A later job, or a later use in the same job, whose first
   window matches a cached period within ``DRIFT`` takes that entry's choice without a trial.

A switch changes no batch: the samples, their order, labels and pixels are an unswitched
run's, and a state saved after a switch resumes exactly, at any setting (the position is the
whole state). So the plan, and which batches each rank yields, never depend on timing: ranks of
a job tune alone and stay in step. The cost is the trial windows at slower settings and the
batches a switch drains. In epochs shorter than ``settle + WINDOW + 1`` batches the window is
what an epoch holds after ``settle`` (``window_for``); epochs shorter than
``settle + MIN_WINDOW + 1`` never complete one, and the loader stays at the first candidate.
Tuning runs on a GPU only (the loader's ``tuning`` says why it is off elsewhere);
``DaliLoader.calibrator.decisions`` records every decision, and ``DaliLoader.tune_with``
installs a calibrator with another clock (how the tests force switches on CPU operators).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol, cast

from pipelines.sources.cache import cache_base


class Setting(NamedTuple):
    """One candidate of the tuner: the hardware decoder's share and the pipeline count."""

    load: float
    pipelines: int

    @property
    def label(self) -> str:
        """``"hw 0.65 x2"``: share 0.65, two pipelines."""
        return f"hw {self.load:g} x{self.pipelines}"


# the settings tried where the share is tuned (the first is replaced by the rules' default:
# ``grid``), and the pipeline counts tried where it is held; why these: NOTE [calibration]
GRID: tuple[Setting, ...] = (Setting(0.0, 1), Setting(0.65, 2), Setting(1.0, 2))
COUNTS: tuple[int, ...] = (1, 2, 3)
WINDOW = 16    # batches per timed window
MARGIN = 0.03  # another candidate must be this much faster (period) to replace the first
DRIFT = 0.25   # a window this far from the chosen setting's period is a new use ...
STRIKES = 2    # ... when this many watched windows in a row are
JUMP = 2.0     # ... or at once when one is this many times slower or faster
MIN_WINDOW = 4  # the shortest window, in epochs too short for ``WINDOW`` (``window_for``)
VERSION = 2  # 2: a setting is (share, pipelines)
MAX_ENTRIES = 8  # cached uses per key; the oldest goes first


@dataclass(frozen=True)
class Decision:
    """One choice: the setting, each candidate's period in ms per batch (by ``Setting.label``),
    and whether it was measured now (``"measured"``) or taken from the cache (``"cached"``)."""

    setting: Setting
    periods_ms: dict[str, float]
    how: str

    def describe(self) -> str:
        """``"hw 0 x2 (measured; ms per batch hw 0 x1: 34.8, hw 0 x2: 30.1, ...)"``."""
        per = ", ".join(f"{k}: {v:.1f}" for k, v in self.periods_ms.items())
        return f"{self.setting.label} ({self.how}; ms per batch {per})"


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

    def lookup(self, key: str, setting: Setting, period_ms: float) -> Decision | None:
        """The cached decision of a use whose period at ``setting`` is within ``DRIFT`` of
        ``period_ms``, or ``None``."""
        for e in reversed(self._read().get("entries", {}).get(key, [])):
            try:
                got = float(e["periods_ms"][setting.label])
                if abs(period_ms / got - 1.0) <= DRIFT:
                    chosen = Setting(float(e["load"]), int(e["pipelines"]))
                    return Decision(chosen, dict(e["periods_ms"]), "cached")
            except (KeyError, TypeError, ValueError, ZeroDivisionError):
                continue
        return None

    def add(self, key: str, decision: Decision) -> None:
        if self.path is None:
            return
        data = self._read() or {"version": VERSION, "entries": {}}
        entries = data.setdefault("entries", {}).setdefault(key, [])
        entries.append({"load": decision.setting.load, "pipelines": decision.setting.pipelines,
                        "periods_ms": decision.periods_ms,
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


def grid(first: Setting, *, loads: bool, lanes: bool, max_lanes: int) -> tuple[Setting, ...]:
    """The tuner's candidates: ``first`` (the rules' default), then ``GRID``'s settings when
    the share is tuned (``loads``), else ``COUNTS`` at ``first``'s share; the count is held
    at ``first``'s unless ``lanes`` (it is tuned), at most ``max_lanes`` pipelines, without
    repeats. One candidate: nothing to tune.

    Example: ``first = hw 0 x1``, the share pinned (``loads=False``), ``max_lanes=2`` ->
    ``(hw 0 x1, hw 0 x2)``.
    """
    rows = GRID if loads else tuple(Setting(first.load, n) for n in COUNTS)
    out = [first]
    for g in rows:
        s = Setting(g.load, max(1, min(g.pipelines, max_lanes)) if lanes else first.pipelines)
        if s not in out:
            out.append(s)
    return tuple(out)


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
    the ``Setting`` to switch to, or ``None``.

    Args:
        settle: batches after a break before a window starts (the rebuilt queue fills).
        timer: ``HostTimer``, ``EventTimer``, or a test's fake clock (``mark`` and
            ``seconds``).
        cache, key: where decisions are kept (``CalibrationCache``, ``cache_key``).
        candidates: the settings (``grid``); the first is where the loader starts.
        window: batches per timed window (``window_for``).
    """

    settle: int
    timer: _Timer = field(default_factory=HostTimer)
    cache: CalibrationCache = field(default_factory=lambda: CalibrationCache(None))
    key: str = ""
    candidates: tuple[Setting, ...] = GRID
    window: int = WINDOW
    setting: Setting = field(init=False)
    decisions: list[Decision] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ValueError("candidates=() must hold at least one Setting")
        self.setting = self.candidates[0]
        self._ref: float | None = None          # the chosen setting's period, s per batch
        self._trial: dict[Setting, float] | None = None
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

    def tick(self) -> Setting | None:
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
    def _measured(self, period: float) -> Setting | None:
        if self._trial is not None:
            self._trial[self.setting] = period
            rest = [c for c in self.candidates if c not in self._trial]
            if rest:
                return self._switch(rest[0])
            first = self.candidates[0]
            best = min(self._trial, key=cast("Callable[[Setting], float]", self._trial.get))
            choice = best if self._trial[best] < (1.0 - MARGIN) * self._trial[first] else first
            d = Decision(choice, {c.label: round(p * 1e3, 3) for c, p in self._trial.items()},
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
        hit = self.cache.lookup(self.key, self.setting, period * 1e3)
        if hit is not None and hit.setting in self.candidates:
            self.decisions.append(hit)
            self._ref = hit.periods_ms.get(hit.setting.label, period * 1e3) / 1e3
            return self._switch(hit.setting)
        if len(self.candidates) == 1:
            return None  # nothing to try
        self._trial = {self.setting: period}
        return self._switch(next(c for c in self.candidates if c != self.setting))

    def _switch(self, setting: Setting) -> Setting | None:
        if setting == self.setting:
            return None
        self.setting = setting
        self.restart()
        return setting


__all__ = ["COUNTS", "GRID", "CalibrationCache", "Calibrator", "Decision", "EventTimer", "HostTimer",
           "Setting", "cache_key", "grid", "window_for"]
