"""Each timed repeat in a fresh process, in a seeded interleaved order (pyperf's way).

NOTE [isolation and order]
Run in one process, every repeat of a variant shares that process's warm state: its CUDA
context and allocator, its DataLoader workers and their queues, DALI's pipeline and its
buffers. Run in a fixed order, a variant always follows the same other one, and anything that
drifts over a run (clocks, the page cache, another tenant on the host) lands on the same
variant every time. Either way the repeats agree with each other more than two runs agree,
and the spread understates the real uncertainty. Here every (variant, repeat) and every
ceiling repeat is one *unit*; the units are shuffled with ``random.Random(seed)`` and each one
runs in a new process (``multiprocessing`` spawn: nothing inherited), which builds the model
step and the loader from nothing, warms up, and times one repeat. The order, the seed and
each repeat's process id are kept in ``results.json`` (``setup["order"]``,
``setup["order_seed"]``, ``Repeat.pid``), so the spread over repeats is the spread across
processes. A unit's error is raised in the suite with the unit's name; a unit whose process
dies is reported with its exit code. Under torchrun the ranks are the job's processes, and
the suite runs in them (isolation is off there).

NOTE [unit processes]
A unit's process puts itself and its loader's workers in a process group of its own. It
sends its measurement as soon as the timed run ends, then closes the loader for at most
``TEARDOWN_S`` and exits with ``os._exit`` (no interpreter teardown). The suite then kills
whatever is left of the group, so no worker of one unit decodes during the next one's window.
A loader that fails or hangs while closing keeps the measurement and is reported in a
warning. Each unit's log line says where its time went (``Phases``). A unit whose suite dies
(killed by ``timeout``, say, which cannot reach a group of its own) kills its group within
half a second (``die_with_parent``): on the H200 an orphaned unit's workers once decoded
through the next run's windows (docs/results/h200/seeds-reference).

NOTE [steady state]
A loader fills its queue whenever the consumer pauses: ``queue_depth`` batches (DataLoader
workers x prefetch factor, plus the CUDA prefetch of ``pinned``; DALI's queue per pipeline). A
window that starts on a full queue counts those batches as if they were made at the steady
rate, which a loader-only window (the consumer never waits for a step) never is. Every repeat
primes the step before its windows, so the loader-only window drains a whole queue before its
warm-up (``runner.time_repeat``). Before that drain, the loader-only rates of the default
windows of ``pageable`` and ``pinned`` ran above ``--long`` ones on the H200, as a queue counted
in a shorter window would (docs/results/h200/seeds-reference/README.md, steady/). The training
window needs no drain: it follows the loader-only window, which leaves the queue empty, and in
training a queue is full in steady state only when the loader outruns the step.
A loader's first epoch also does one-time work: ``dali`` checks each file's bytes in Python the
first time it reaches it (pipelines.dali.source NOTE [validated once]). The loader-only window
timed that on the H200: with ``--model none`` a DALI row's loader-only rate, taken first,
ran well below its training window's, taken later in the same process, and matched it once
the warm-up passed the first epoch (docs/results/h200/README.md, dali-first-epoch). So a new
loader first runs the rest of its first epoch when the epoch is at most twice the window
(``runner.first_epoch``); a longer first epoch holds the windows, as it would a job's first
hours. Each repeat records its window in batches and seconds
(``Repeat.steps``, ``Repeat.window_s``) and each variant its queue (``VariantResult.
queue_batches``); ``--long`` times at least 10x the queue, across an epoch boundary
(``runner.window``).
An epoch boundary costs something (a loader that restarts its workers each epoch, as the
plain DataLoader and ``pageable`` do, stalls there), and a window of a fixed number of batches
holds a number of boundaries that depends on how it falls, not on its share of the run, and
``pageable`` then disagreed with a ``--long`` window on the H200
(docs/results/h200/seeds-reference). So a window is rounded up to whole
epochs when an epoch is at most twice its length: any k x E consecutive batches hold exactly k
epoch starts. Longer epochs are left alone, as their boundaries are rare in training too.
Without ``--steps`` a window also holds at least ``FIT_QUEUES`` times its loader's queue: a
CPU-bound loader's batches come in waves of its workers, and a window of about two queues
swings with where it falls among them (docs/results/h200/seeds-reference/README.md, steady/).
The step's first calls set up CUDA and cuDNN and take seconds; run inside the training
warm-up, they let the loader fill its whole queue, and a window that then starts counts those
batches. So every repeat first primes the step on one batch, before any window
(``runner.time_repeat``). docs/results/h200/suite-steady-state shows the effect on the H200.
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
        return (f"{self.start + self.setup + self.timed + self.close:.0f} s: start "
                f"{self.start:.1f}, setup {self.setup:.1f}, timed {self.timed:.1f}, close "
                f"{self.close:.1f}")


def timed_unit(job: Job, unit: Unit, phases: Phases | None = None):
    """Time ``unit`` in this process: ``(repeat, h2d bytes per sample, queue batches, loader)``;
    the loader is still open (``None`` for a ceiling unit, which takes one batch and closes
    its loader before the clock starts). On an error the loader is closed, then it raises."""
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
    """Close ``loader`` in a daemon thread, waiting at most ``seconds``: ``""`` when it closed,
    else what went wrong (its error, or that it did not finish in time)."""
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
    """Put back the platform's default multiprocessing start method in a spawned unit: spawn
    hands its own on, and DataLoader workers would then each be spawned and import torch
    again instead of starting as in the user's job (docs/results/h200/suite-steady-state)."""
    method = mp.get_all_start_methods()[0]
    mp.set_start_method(method, force=True)
    return method


def die_with_parent(parent: int, every: float = 0.5) -> threading.Thread:
    """Kill this process's group (the unit and its loader's workers) as soon as ``parent`` is
    no longer its parent: a suite killed by a signal (``timeout``, a scheduler) cannot end the
    group itself, and an orphaned unit would decode beside whatever runs next."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        os.killpg(0, signal.SIGKILL)

    th = threading.Thread(target=watch, name="compare-unit-watchdog", daemon=True)
    th.start()
    return th


def _child(conn, job: Job, unit: Unit, spawned_at: float, parent: int) -> None:
    """A unit's process (NOTE [unit processes])."""
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
    """``timed_unit`` in a fresh spawned process: ``(repeat, h2d, queue, teardown error,
    phases)``; its error is raised here as ``UnitError``."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(child, job, unit, time.time(), os.getpid()),
                    name=f"compare-unit-{name}")
    p.start()
    child.close()
    try:
        while not parent.poll(0.5):
            if not p.is_alive() and not parent.poll(0.1):
                raise UnitError(f"{name}: its process exited with code {p.exitcode} "
                                "before sending a result")
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
            = lambda v, c: None) -> tuple[dict[int, VariantResult], VariantResult | None]:
    """Every unit in ``units``' order, each in its own process; ``({variant index: result},
    ceiling or None)``, repeats in repeat order. ``done`` sees the results after each unit."""
    from .runner import say_repeat

    labels = [v.label for v in job.variants]
    reps: dict[tuple[int, bool], dict[int, Repeat]] = {}
    meta: dict[int, tuple[float | None, int | None]] = {}

    def results():
        out = {}
        for i, v in enumerate(job.variants):
            got = reps.get((i, False))
            if got:
                h2d, queue = meta[i]
                out[i] = VariantResult(v.label, v.kind, dict(v.overrides), h2d,
                                       tuple(got[r] for r in sorted(got)), queue)
        c = reps.get((0, True))
        ceiling = (VariantResult("ceiling", "none", {}, 0.0, tuple(c[r] for r in sorted(c)))
                   if c else None)
        return out, ceiling

    from .progress import bar

    progress = bar(len(units), "compare (isolated repeats)", "repeat")
    for k, u in enumerate(units):
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
