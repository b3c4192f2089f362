"""Each timed repeat in a fresh process, in a seeded interleaved order (pyperf's way).

NOTE [isolation and order] (docs/benchmarking.md, Fresh processes)
Every (variant, repeat) and ceiling repeat is a *unit*, shuffled with ``random.Random(seed)``
and run in a new spawned process in a process group of its own, which the suite kills after
``TEARDOWN_S`` (and which kills itself when the suite dies: ``die_with_parent``).

NOTE [steady state] (docs/benchmarking.md, Steady state)
Every repeat primes the step and drains the queue before the loader-only window
(``runner.time_repeat``); a new loader first runs the rest of its first epoch when the epoch is
at most twice the window; a window is rounded up to whole epochs (``runner.window``).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from .probes import Active
from .results import Repeat, VariantResult


@dataclass(frozen=True)
class Unit:
    """One timed repeat: of variant ``index`` (``ceiling`` False) or of the ceiling."""

    index: int
    repeat: int
    ceiling: bool = False

    def name(self, labels: list[str]) -> str:
        return f"{'ceiling' if self.ceiling else labels[self.index]} #{self.repeat + 1}"


def order(variants: int, repeats: int, ceiling: bool, seed: int) -> list[Unit]:
    """Every unit, shuffled with ``seed`` (the same seed gives the same order)."""
    units = [Unit(i, r) for i in range(variants) for r in range(repeats)]
    units += [Unit(0, r, True) for r in range(repeats)] if ceiling else []
    random.Random(seed).shuffle(units)
    return units


@dataclass(frozen=True)
class Job:
    """What a unit's process needs to rebuild the suite's setup (all picklable)."""

    variants: tuple          # variants.Variant
    base: object             # LoaderConfig
    model: str
    classes: int
    steps: int
    warmup: int
    user_step: str | None = None  # --step MODULE:FUNCTION
    fit: bool = False             # --steps not given: runner.window's FIT_QUEUES x the queue
    probes: Active = Active()     # the lab probes the run turned on (compare.probes)


def _step(job: Job):
    from .runner import make_step

    if job.user_step:
        from .userstep import load_step

        return load_step(job.user_step)
    return make_step(job.model, job.base, job.classes)


TEARDOWN_S = 10.0  # how long a unit's loader may take to close after its timed run


@dataclass
class Phases:
    """Where a unit's wall time went, in seconds (logged per unit by ``run_all``)."""

    start: float = 0.0   # the process's start and imports, until the unit's code runs
    setup: float = 0.0   # the model step and the loader built
    timed: float = 0.0   # warm-up and the timed windows
    close: float = 0.0   # the loader closed and the process ended

    def __str__(self) -> str:
        return (f"{self.start + self.setup + self.timed + self.close:.0f} s: start {self.start:.1f}, "
                f"setup {self.setup:.1f}, timed {self.timed:.1f}, close {self.close:.1f}")


def timed_unit(job: Job, unit: Unit, phases: Phases | None = None):
    """Time ``unit`` here: ``(repeat, h2d bytes per sample, queue batches, open loader or None)``."""
    from . import runner as rn

    phases = phases if phases is not None else Phases()
    t = time.perf_counter()
    v = job.variants[unit.index]
    cfg = v.config_of(job.base)
    device = rn.device_of(cfg)
    step = _step(job)
    if unit.ceiling:
        with rn.open_loader(v, cfg) as loader:
            it = rn.endless(loader)
            x, y = next(it)
            batch = (x.clone(), y.clone())
            it.close()
        phases.setup = time.perf_counter() - t
        t = time.perf_counter()
        rep = rn.ceiling_repeat(batch, step, steps=job.steps, warmup=job.warmup,
                                device=device, probes=job.probes,
                                first_repeat=unit.repeat == 0)
        phases.timed = time.perf_counter() - t
        return rep, 0.0, None, None
    loader = rn.open_loader(v, cfg)
    try:
        queue = rn.queue_depth(loader)
        it = rn.endless(loader)
        n = rn.window(job.steps, queue, len(loader), job.fit, job.probes)
        phases.setup = time.perf_counter() - t
        t = time.perf_counter()
        got = rn.time_repeat(it, step, steps=n, warmup=job.warmup, device=device,
                             queue=queue, first=rn.first_epoch(len(loader), n),
                             settle=rn.settle_of(loader, queue), period=rn.wave_period(loader),
                             probes=job.probes, unit=v.label, first_repeat=unit.repeat == 0)
        rep = rn.with_decoder(got, loader)
        phases.timed = time.perf_counter() - t
        h2d = loader.h2d_bytes_per_sample()
        it.close()
    except BaseException:
        close_within(loader, TEARDOWN_S)
        raise
    return rep, h2d, queue, loader


def close_within(loader, seconds: float) -> str:
    """Close ``loader`` within ``seconds``: ``""``, or what went wrong."""
    if loader is None:
        return ""
    err: list[str] = []

    def close() -> None:
        try:
            loader.close()
        except Exception as e:  # noqa: BLE001 - returned, and said by run_all
            err.append(f"{type(e).__name__}: {e}")

    th = threading.Thread(target=close, name="compare-unit-close", daemon=True)
    th.start()
    th.join(seconds)
    if th.is_alive():
        return f"it did not close within {seconds:.0f} s"
    return err[0] if err else ""


def default_start_method() -> str:
    """Put back the platform's default start method in a spawned unit, so DataLoader workers
    start as in the user's job, not spawned."""
    method = mp.get_all_start_methods()[0]
    mp.set_start_method(method, force=True)
    return method


def die_with_parent(parent: int, every: float = 0.5) -> threading.Thread:
    """Kill this process's group as soon as ``parent`` is gone (a suite killed by a signal
    cannot end it, and an orphan would decode beside whatever runs next)."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        os.killpg(0, signal.SIGKILL)

    th = threading.Thread(target=watch, name="compare-unit-watchdog", daemon=True)
    th.start()
    return th


def _child(conn, job: Job, unit: Unit, spawned_at: float, parent: int) -> None:
    """A unit's process (NOTE [isolation and order])."""
    os.setpgrp()  # the unit and its loader's workers: one group, which the suite ends
    die_with_parent(parent)
    default_start_method()
    stacks = os.environ.get("GPU_FEED_UNIT_STACKS")
    if stacks:  # a unit that seems stuck: its threads' stacks on stderr after that many s
        import faulthandler

        faulthandler.dump_traceback_later(float(stacks), repeat=True)
    phases = Phases(start=time.time() - spawned_at)
    code = 0
    try:
        rep, h2d, queue, loader = timed_unit(job, unit, phases)
        conn.send(("ok", (rep, h2d, queue), phases))
        t = time.perf_counter()
        conn.send(("closed", close_within(loader, TEARDOWN_S), time.perf_counter() - t))
    except BaseException as e:  # noqa: BLE001 - sent to the parent, which raises it
        code = 1
        try:
            conn.send(("error", f"{type(e).__name__}: {e}", traceback.format_exc()))
        except Exception:  # noqa: BLE001 - the parent sees the exit code instead
            pass
    finally:
        conn.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # no interpreter teardown: the suite ends what is left of the group


class UnitError(RuntimeError):
    """A unit failed in its process; ``child_traceback`` holds the child's traceback."""

    def __init__(self, msg: str, child_traceback: str = ""):
        super().__init__(msg)
        self.child_traceback = child_traceback


def _end(p) -> None:
    """End unit process ``p`` and every process left in its group (its loader's workers)."""
    p.join(5.0)
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    p.join()


def spawn(job: Job, unit: Unit, name: str
          ) -> tuple[Repeat, float | None, int | None, str, Phases]:
    """``timed_unit`` in a fresh process: ``(repeat, h2d, queue, teardown error, phases)``."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(child, job, unit, time.time(), os.getpid()),
                    name=f"compare-unit-{name}")
    p.start()
    child.close()
    try:
        while not parent.poll(0.5):
            if not p.is_alive() and not parent.poll(0.1):
                raise UnitError(f"{name}: its process exited with code {p.exitcode} before sending a result")
        msg = parent.recv()
        if msg[0] == "error":
            raise UnitError(f"{name}: {msg[1]}", msg[2])
        (rep, h2d, queue), phases = msg[1], msg[2]
        t = time.perf_counter()
        teardown = f"it did not close within {TEARDOWN_S:.0f} s"
        try:
            if parent.poll(TEARDOWN_S + 5.0):
                teardown = parent.recv()[1]
        except EOFError:
            teardown = "its process ended while closing the loader"
    except EOFError:
        raise UnitError(f"{name}: its process exited with code {p.exitcode} "
                        "before sending a result") from None
    finally:
        _end(p)
        parent.close()
    phases.close = time.perf_counter() - t
    return rep, h2d, queue, teardown, phases


def run_all(job: Job, units: list[Unit], log: Callable[[str], None] = print,
            done: Callable[[dict[int, VariantResult], VariantResult | None], None]
            = lambda v, c: None, resumed: tuple | None = None
            ) -> tuple[dict[int, VariantResult], VariantResult | None]:
    """Every unit in order, each in its own process: ``({variant index: result}, ceiling)``;
    ``done`` sees the results after each unit. ``resumed``: ``compare.resume.done_units``'s
    ``(N, repeats, meta)``, the first N units already run (NOTE [resume])."""
    from .runner import say_repeat

    labels = [v.label for v in job.variants]
    skip, reps, meta = resumed or (0, {}, {})

    def results():
        out = {}
        for i, v in enumerate(job.variants):
            got = reps.get((i, False))
            if got:
                h2d, queue = meta[i]
                out[i] = VariantResult(v.label, v.kind, dict(v.overrides), h2d,
                                       tuple(got[r] for r in sorted(got)), queue)
        c = reps.get((0, True))
        ceiling = (VariantResult("ceiling", "none", {}, 0.0, tuple(c[r] for r in sorted(c))) if c else None)
        return out, ceiling

    from .progress import bar

    progress = bar(len(units) - skip, "compare (isolated repeats)", "repeat")
    for k, u in enumerate(units[skip:], start=skip):
        name = u.name(labels)
        rep, h2d, queue, teardown, phases = spawn(job, u, name)
        progress.update(1)
        if teardown:
            log(f"warning: {name}: its loader failed while shutting down after the timed run "
                f"({teardown}); the measurement stands")
        reps.setdefault((u.index, u.ceiling), {})[u.repeat] = rep
        if not u.ceiling:
            meta[u.index] = (h2d, queue)
        say_repeat(log, "ceiling (batch on device)" if u.ceiling else labels[u.index], rep,
                   f"[{k + 1}/{len(units)}] repeat {u.repeat + 1}, pid {rep.pid}, {phases}",
                   gpu=str(job.base.device).startswith("cuda"))
        done(*results())
    progress.close()
    return results()
