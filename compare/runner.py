"""Runs every variant (``compare.variants``) on the same files, augmentation, batch size,
model, steps and warm-up."""
from __future__ import annotations

import enum
import gc
import itertools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path

import torch

from pipelines import Backend, LoaderConfig, create_loader

from .cpuroles import RoleCpu
from .hostprobe import probe_ms
from .metrics import CpuUtil, NvmlSampler, loader_only, measure
from .models import TrainStep
from .progress import bar
from .results import FIT_QUEUES, Repeat, VariantResult
from .variants import Variant
from .waitsites import WaitSites


def endless(loader) -> Iterator:
    """Batches across epoch boundaries (``set_epoch`` at each), so runs need not align to epochs."""
    for epoch in itertools.count():
        loader.set_epoch(epoch)
        got = False
        for b in loader:
            got = True
            yield b
        if not got:
            raise RuntimeError("the loader yielded no batch in a whole epoch (dataset smaller than "
                               "batch_size with last_batch='drop'?)")


def _nothing() -> None:
    return None


class ComputeStream(str, enum.Enum):
    """The CUDA stream the model step (and the loader's hand-over) runs on (``--compute-stream``).

    * ``DEFAULT``: the default stream, as a plain training script has it. It is the legacy
      default stream, which waits for (and holds up) work on other blocking streams.
    * ``SIDE``: a new stream at normal priority (torch's streams do not block on others).
    * ``HIGH``: a new stream at the highest priority, so the GPU schedules the step's blocks
      before those of the loader's GPU work when both wait (DALI's decode and augmentation).
    """

    DEFAULT = "default"
    SIDE = "side"
    HIGH = "high"


def device_of(cfg: LoaderConfig) -> torch.device:
    """The device ``cfg``'s batches land on: its CUDA device, or the CPU without CUDA."""
    return cfg.resolved().torch_device if torch.cuda.is_available() else torch.device("cpu")


@contextmanager
def on_compute_stream(which: ComputeStream, device: torch.device):
    """Make ``which`` the current stream of ``device`` (nothing on the CPU or for ``DEFAULT``).
    Everything a run does runs in it, the loader's construction included, so the loader hands
    batches over to the stream the step runs on. The device is synchronised on entry (a new
    stream does not wait for the model's set-up on the default stream) and on exit."""
    if device.type != "cuda" or which is ComputeStream.DEFAULT:
        yield
        return
    top = min(torch.cuda.Stream.priority_range())  # a lower number is a higher priority
    s = torch.cuda.Stream(device, priority=top if which is ComputeStream.HIGH else 0)
    torch.cuda.synchronize(device)
    try:
        with torch.cuda.stream(s):
            yield
    finally:
        torch.cuda.synchronize(device)


def open_loader(v: Variant, cfg: LoaderConfig):
    """The loader of variant ``v`` for ``cfg``: a backend, or a plain reference recipe."""
    if v.reference:
        from .reference import DaliFileReaderReference, ImageFolderReference

        if v.backend is Backend.DALI:
            return DaliFileReaderReference(cfg)
        return ImageFolderReference(cfg)
    return create_loader(v.backend, cfg, options=v.options_of())


def queue_depth(loader) -> int | None:
    """Batches ``loader`` holds ahead of the consumer once it is full: the DataLoader's
    ``workers x prefetch_factor`` (plus the CUDA prefetch of ``pinned``), or DALI's
    ``queue_depth`` per pipeline; ``None`` for a loader of another kind."""
    opt = getattr(loader, "options", None)
    if getattr(loader, "queue_batches", None) is not None:  # compare.reference's DALI recipe
        return loader.queue_batches
    if hasattr(loader, "prefetch_factor"):  # the torch backends
        q = max(1, loader.num_workers) * (loader.prefetch_factor or 1)
        if getattr(loader, "_prefetcher", None) is not None:
            q += opt.queue_depth
        return q
    if opt is not None and hasattr(opt, "pipelines") and opt.pipelines:
        return opt.queue_depth * opt.pipelines
    return None


def window(steps: int, long: bool, queue: int | None, epoch_batches: int,
           fit: bool = False) -> int:
    """The timed window in batches: ``steps``; with ``fit`` (``--steps`` not given) at least
    ``FIT_QUEUES`` times the queue; with ``long`` at least 10x the queue and past an epoch
    boundary; each rounded up to whole epochs when an epoch is at most twice that long (NOTE
    [steady state] in compare.isolate)."""
    if long:
        n = max(steps, 10 * (queue or 0), epoch_batches + 1)
    else:
        n = max(steps, FIT_QUEUES * (queue or 0)) if fit else steps
    if 0 < epoch_batches <= 2 * n:
        n = -(-n // epoch_batches) * epoch_batches
    return n


# NOTE [settling]
# A DataLoader's workers start together, each makes a whole batch, and the batches are taken
# in order, so they arrive in waves of ``num_workers``. With one iterator across epochs
# (``pinned``'s ``epoch_stream``) the workers drift out of step over some hundreds of batches:
# the waves are a start-up transient, which a default window timed on the H200 and a ``--long``
# one mostly did not (docs/results/h200/seeds-reference). So before the training window of
# such a loader the warm-up goes on, ``num_workers`` batches at a time, until the last
# ``3 x num_workers`` waits hold fewer than three long ones (``waves.out_of_step``), or
# ``SETTLE_CAP_QUEUES`` times its queue more batches have run; each repeat records how many
# ran and whether it settled. Loaders that restart their workers every epoch (``pageable``,
# the plain recipe) are back in step after each epoch start: that is their steady state,
# which whole-epoch windows time, so they do not settle. Under torchrun every rank must run
# as many DDP steps, so the ranks settle together: a block runs until all of them are out of
# step (``Job.all_agree``); without such an agreement ranks of a process group do not settle.
SETTLE_CAP_QUEUES = 5

# NOTE [loader-only last]
# By default the loader-only window runs first, after the queue made while the step was primed
# is drained. That drain hands every idle DataLoader worker its next batch at once, so the
# window starts with the workers in step, and a consumer that takes each batch at once does not
# spread them out again; a training window after settling can run out of step. On the H200
# ``pinned``'s loader-only rate fell below its settled training rate
# (pinned-prefetch, in the git history of docs/results/h200), which fits. ``--loader-only-last`` times the
# model step first and the loader alone after it, with the workers as training left them: the
# test of that explanation. The queue is drained before each window either way.


def settle_of(loader, queue: int | None, agreed: bool = False) -> tuple[int, int] | None:
    """``(period, cap)`` for ``metrics.measure``'s ``settle`` (NOTE [settling]), or ``None``
    for a loader that does not settle. ``agreed``: the ranks of a process group agree on
    when to stop (else they do not settle)."""
    workers = getattr(loader, "num_workers", 0) or 0
    if not getattr(loader, "epoch_stream", False) or workers < 2:
        return None
    dist = torch.distributed
    if not agreed and dist.is_available() and dist.is_initialized() and \
            dist.get_world_size() > 1:
        return None
    return workers, SETTLE_CAP_QUEUES * max(queue or 0, workers)


def wave_period(loader) -> int | None:
    """The batches of one wave of ``loader``'s DataLoader workers (its ``num_workers``, from 2),
    which a loader-only window's stretches hold whole (NOTE [waves and halves] in
    compare.metrics); ``None`` for a loader without such workers (DALI)."""
    workers = getattr(loader, "num_workers", 0) or 0
    return workers if hasattr(loader, "prefetch_factor") and workers >= 2 else None


def with_decoder(rep: Repeat, loader) -> Repeat:
    """``rep`` with the decoder ``loader`` ran, and a calibrated DALI loader's decisions."""
    d = getattr(loader, "decoder", None)
    if d is not None:
        rep = replace(rep, decoder=getattr(d, "value", d))
    cal = getattr(loader, "calibrator", None)
    if cal is not None:
        rep = replace(rep, calibration=tuple(x.describe() for x in cal.decisions))
    return rep


def drain(it: Iterator, batches: int) -> None:
    """Take ``batches`` batches from ``it`` and drop them."""
    for _ in range(batches):
        next(it)


def first_epoch(epoch_batches: int, steps: int) -> int:
    """The batches of a new loader's first epoch that run before its loader-only window: all
    of them when the epoch is at most twice the window, else none (NOTE [steady state] in
    compare.isolate)."""
    return epoch_batches if 0 < epoch_batches <= 2 * steps else 0


def time_repeat(it: Iterator, step: Callable, *, steps: int, warmup: int,
                device: torch.device, sync: Callable[[], None] = _nothing,
                cold: Callable[[], object] | None = None,
                queue: int | None = None, first: int = 0,
                settle: tuple[int, int] | None = None,
                agree: Callable[[bool], bool] | None = None,
                period: int | None = None, loader_only_last: bool = False,
                trace: Path | None = None, wait_sites: bool = False) -> Repeat:
    """One repeat on a running loader: the step primed on one batch (``warmup`` calls, at
    least one), then loader-only, then the model step, both ``steps`` batches after
    ``warmup`` (``loader_only_last``: the model step first, NOTE [loader-only last]). The
    loader fills its ``queue`` (its depth in batches) while the step is primed, so that many
    batches are drained before the first window's warm-up, and before the loader-only one's:
    counted in the window, they were made before its clock started. ``first``: the batches of the loader's
    first epoch (``first_epoch``) when this is the loader's first repeat; the rest of that
    epoch runs before anything else, so its one-time work stays out of the windows (NOTE
    [steady state] in compare.isolate). ``cold`` (``--cold``: ``pagecache.evict`` of the
    dataset) runs before each of the two windows, and the queue is drained after it: the
    loader filled it while the eviction ran, from files read before it. ``settle``: the training
    run's warm-up goes on until the workers are out of step (NOTE [settling]), on every rank
    (``agree``). ``period``: the loader's ``wave_period``, for the loader-only stretches.
    ``trace``: after the windows, one more training window runs under the profiler, written
    to files that start with this path (NOTE [trace] in compare.trace); its digest is the
    repeat's ``trace``, its numbers are not in the repeat. ``wait_sites``: sample where the
    training window's loop waits for data (NOTE [wait sites] in compare.waitsites)."""
    x, y = next(it)  # the step's first calls (CUDA/cuDNN set-up) run before any window, so
    for _ in range(max(1, warmup)):  # the loader cannot fill its queue while they run
        step(x, y)  # (NOTE [steady state] in compare.isolate)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    del x, y
    drain(it, max(0, first - 1))  # the priming took the first epoch's first batch
    sync()

    roles: dict = {}

    def alone():
        if cold is not None:
            cold()
        drain(it, queue or 0)  # the queue made while the step ran (or the eviction ran)
        split = RoleCpu()
        split.start()
        got = loader_only(it, steps, warmup, device, period=period)
        roles["loader_only"] = split.stop()
        return got

    lo = None if loader_only_last else alone()
    if lo is not None:
        sync()
    evicted = cold() if cold is not None else None
    if cold is not None or lo is None:
        drain(it, queue or 0)
    cpu, split = CpuUtil(), RoleCpu()
    cpu.start()
    split.start()
    sites = WaitSites().start() if wait_sites else None
    try:
        with NvmlSampler(device.index or 0) if device.type == "cuda" else nullcontext() as nv:
            m = measure(it, step, steps, warmup, device, settle=settle, agree=agree,
                        sites=sites)
    finally:
        where = sites.stop() if sites is not None else None
    roles["training"] = split.stop()
    busy = cpu.stop()
    if lo is None:
        sync()
        lo = alone()
    traced = None
    if trace is not None:
        sync()
        traced = traced_window(trace, lambda: measure(it, step, steps, warmup, device,
                                                      mark=True))
    return Repeat(
        samples_per_s=m.samples_per_s, loader_only_per_s=lo.rate, loader_only_halves=lo.halves,
        wait_p50_ms=m.wait_pct(50), wait_p95_ms=m.wait_pct(95), idle_pct=m.idle_pct,
        cpu_util_pct=busy, nvml_util_pct=getattr(nv, "mean_util", lambda: None)(),
        cpu_steal_pct=None if cpu.steal_pct is None else round(cpu.steal_pct, 3),
        waits_ms=tuple(round(w, 3) for w in m.waits_ms), steps=steps,
        window_s=round(m.wall_s, 4), pid=os.getpid(),
        cold_resident=None if evicted is None else round(evicted.after, 4),
        halves=m.halves(), settle_batches=m.settle_batches, settled=m.settled, trace=traced,
        cpu_roles=({k: roles[k] for k in ("training", "loader_only")}
                   if roles.get("training") and roles.get("loader_only") else None),
        wait_sites=where,
    )


# NOTE [paired long]
# ``--long`` proves that the default window times the steady state by timing a window of at
# least 10x the queue, across an epoch boundary, in another run. On the H200 the torch rows'
# rates moved with the host's speed from process to process, by more than the 5% the two runs
# were to agree within (loader-only-last, in the git history of docs/results/h200), so two runs could
# not show it. ``--paired-long`` times both in the same process, on the same loader. A first
# H200 run (docs/results/h200/README.md, paired-long) timed one default and one long pair of
# windows (loader-only and training) per repeat, by turns in either order, and read the pairs
# as a crossover; there ``pageable``'s rate drifted within a process by more than 5%, and not
# alike in every process, so the crossover could not take the drift out. Each repeat now
# brackets the long pair between two default pairs: default, long, default. A drift that is
# linear over the three falls on the long pair as on the mean of the two defaults, so
# long / sqrt(default * default again) is the window's effect in each process on its own, and
# the second default over the first shows the drift. One long window cannot tell a linear
# drift from a step before or after it (one H200 ``pageable`` repeat's rate dropped only in its
# last window: docs/results/h200/README.md, paired-long), so where the two defaults differ by
# more than 5% the summary also gives long over each default alone: the readings if the drift
# was such a step (``compare.report``). The repeat's figures are the first
# default pair's; the long pair's, with the second default's as ``after``, go to
# ``Repeat.paired_long`` (``compare.report.paired_effect`` reads both kinds), each with its CPU
# by role, so that a drift can be told apart: fewer cores, or less made with each.
def paired_repeat(it: Iterator, step: Callable, *, steps: int, long_steps: int,
                  first: int = 0, trace: Path | None = None,
                  wait_sites: bool = False, **kw) -> Repeat:
    """Three ``time_repeat`` runs on one loader: ``steps``, ``long_steps`` and ``steps``
    batches (NOTE [paired long]); the first run's ``Repeat`` with the other two's rates in
    ``paired_long``. ``trace`` and ``wait_sites`` apply to the first run."""
    rep = time_repeat(it, step, steps=steps, first=first, trace=trace, wait_sites=wait_sites,
                      **kw)
    lg = time_repeat(it, step, steps=long_steps, **kw)
    again = time_repeat(it, step, steps=steps, **kw)
    return replace(rep, paired_long={
        "steps": long_steps, "samples_per_s": lg.samples_per_s,
        "loader_only_per_s": lg.loader_only_per_s, "settled": lg.settled,
        "cpu_roles": lg.cpu_roles,
        "after": {"samples_per_s": again.samples_per_s,
                  "loader_only_per_s": again.loader_only_per_s, "cpu_roles": again.cpu_roles}})


def one_repeat(it: Iterator, step: Callable, *, steps: int, long_steps: int | None,
               **kw) -> Repeat:
    """``time_repeat``, or ``paired_repeat`` with a long window of ``long_steps`` batches when
    it is given (``--paired-long``; NOTE [paired long])."""
    if long_steps is None:
        return time_repeat(it, step, steps=steps, **kw)
    return paired_repeat(it, step, steps=steps, long_steps=long_steps, **kw)


def traced_window(base: Path, run: Callable[[], object]) -> dict:
    """``run()`` (a marked ``measure``) under the profiler: the trace's digest
    (``compare.trace``), its summary named relative to the run's output directory."""
    from . import trace as tr

    _, summary = tr.record(run, base)
    return tr.digest(summary, f"{base.parent.name}/{base.name}.summary.json")


def trace_base(folder: Path | None, unit: str) -> Path | None:
    """Where ``unit``'s trace files go in ``folder`` (``None``: no trace); under torchrun each
    rank has its own."""
    if folder is None:
        return None
    from .trace import slug

    dist = torch.distributed
    rank = (f"-rank{dist.get_rank()}" if dist.is_available() and dist.is_initialized()
            and dist.get_world_size() > 1 else "")
    return Path(folder) / (slug(unit) + rank)


def say_repeat(log: Callable[[str], None], label: str, r: Repeat, where: str,
               gpu: bool = True) -> None:
    """One repeat's line. GPU idle % only with a GPU: on the CPU it is not measured (the
    report's table leaves it out too)."""
    loader = (f"loader-only {r.loader_only_per_s:9.1f} img/s, wait p50 {r.wait_p50_ms:7.2f} ms"
              if r.loader_only_per_s == r.loader_only_per_s else "")  # NaN: the ceiling
    idle = f"GPU idle {r.idle_pct:5.1f}%" if gpu else ""
    cold = ("" if r.cold_resident is None
            else f"cold ({100 * r.cold_resident:.1f}% still cached)")
    pl = r.paired_long
    paired = (f"long window {pl['samples_per_s']:.1f} samples/s, "
              f"{pl['loader_only_per_s']:.1f} img/s loader-only" if pl else "")
    if pl and "after" in pl:
        paired += (f"; default again {pl['after']['samples_per_s']:.1f} samples/s, "
                   f"{pl['after']['loader_only_per_s']:.1f} img/s loader-only")
    rest = ", ".join(x for x in (loader, idle, cold, paired) if x)
    log(f"  {label:28s} {where}: {r.samples_per_s:9.1f} samples/s" + (f", {rest}" if rest else ""))


def run_variant(v: Variant, base: LoaderConfig, step: Callable, *, steps: int, warmup: int,
                repeats: int, log: Callable[[str], None] = print,
                capture: list | None = None,
                sync: Callable[[], None] = _nothing, long: bool = False,
                cold: Callable[[], object] | None = None,
                agree: Callable[[bool], bool] | None = None,
                fit: bool = False, loader_only_last: bool = False, wait_sites: bool = False,
                paired_long: bool = False,
                trace: Path | None = None) -> VariantResult:
    """Loader-only and model runs of one variant, ``repeats`` times each, in this process.

    Args:
        capture: when given, one more batch (cloned) is appended to it, for the ceiling run.
        sync: called before each timed run (``Job.barrier`` under torchrun: ranks start
            together).
        long: time at least 10x the loader's queue, across an epoch boundary (``window``).
        fit: ``--steps`` was not given: time at least ``FIT_QUEUES`` x the queue (``window``).
        cold: evicts the dataset from the page cache (``--cold``; ``time_repeat``).
        agree: the job's verdict from this rank's (``Job.all_agree`` under torchrun), so that
            the ranks settle together (NOTE [settling]).
        loader_only_last: time the loader alone after the model step (NOTE [loader-only
            last]).
        trace: a folder: the first repeat also traces one more training window into it
            (NOTE [trace] in compare.trace).
        wait_sites: sample where each training window's loop waits for data
            (``--wait-sites``; NOTE [wait sites] in compare.waitsites).
        paired_long: time a ``--long`` pair of windows beside each repeat's, in this process
            (``--paired-long``; NOTE [paired long]).
    """
    cfg = v.config_of(base)
    device = device_of(cfg)
    reps: list[Repeat] = []
    probe = probe_ms()  # before the loader's workers start (compare.hostprobe)
    with open_loader(v, cfg) as loader:
        queue = queue_depth(loader)
        n = window(steps, long, queue, len(loader), fit)
        settle = settle_of(loader, queue, agreed=agree is not None)
        it = endless(loader)
        progress = bar(repeats, f"compare {v.label}", "repeat")
        for r in range(repeats):
            kw = dict(warmup=warmup, device=device, sync=sync, cold=cold, queue=queue,
                      first=first_epoch(len(loader), n) if r == 0 else 0, settle=settle,
                      agree=agree, period=wave_period(loader),
                      loader_only_last=loader_only_last, wait_sites=wait_sites,
                      trace=trace_base(trace, f"{v.label} #1") if r == 0 else None)
            got = one_repeat(it, step, steps=n, **kw, long_steps=(
                window(steps, True, queue, len(loader), fit) if paired_long else None))
            reps.append(with_decoder(got, loader))
            if r == 0:  # one probe per process: the repeats after it share the first's
                reps[-1] = replace(reps[-1], cpu_probe_ms=probe)
            progress.update(1)
            say_repeat(log, v.label, reps[-1], f"repeat {r + 1}/{repeats}",
                       gpu=device.type == "cuda")
        progress.close()
        h2d = loader.h2d_bytes_per_sample()
        if capture is not None:
            x, y = next(it)
            capture.append((x.clone(), y.clone()))
        it.close()
    gc.collect()
    return VariantResult(v.label, v.kind, dict(v.overrides), h2d, tuple(reps), queue)


def ceiling_repeat(batch, step: Callable, *, steps: int, warmup: int,
                   device: torch.device, sync: Callable[[], None] = _nothing,
                   trace: Path | None = None) -> Repeat:
    """One repeat of the same step on one batch already on the device (``trace``: as in
    ``time_repeat``)."""
    sync()
    m = measure(itertools.repeat(batch), step, steps, warmup, device)
    traced = None
    if trace is not None:
        sync()
        traced = traced_window(trace, lambda: measure(itertools.repeat(batch), step, steps,
                                                      warmup, device, mark=True))
    return Repeat(m.samples_per_s, float("nan"), m.wait_pct(50), m.wait_pct(95), m.idle_pct,
                  steps=steps, window_s=round(m.wall_s, 4), pid=os.getpid(), trace=traced)


def run_ceiling(batch, step: Callable, *, steps: int, warmup: int, repeats: int,
                device: torch.device, log: Callable[[str], None] = print,
                sync: Callable[[], None] = _nothing,
                trace: Path | None = None) -> VariantResult:
    """The same step on one batch already on the device: the model-only ceiling (``trace``:
    as in ``run_variant``)."""
    reps = []
    for r in range(repeats):
        reps.append(ceiling_repeat(batch, step, steps=steps, warmup=warmup, device=device,
                                   sync=sync,
                                   trace=trace_base(trace, "ceiling #1") if r == 0 else None))
        log(f"  {'ceiling (batch on device)':28s} repeat {r + 1}/{repeats}: "
            f"{reps[-1].samples_per_s:9.1f} samples/s"
            + (f", GPU idle {reps[-1].idle_pct:5.1f}%" if device.type == "cuda" else ""))
    return VariantResult("ceiling", "none", {}, 0.0, tuple(reps))


def make_step(model: str, cfg: LoaderConfig, classes: int,
              wrap: Callable | None = None) -> TrainStep:
    """The model step for ``cfg``'s device (``cuda:LOCAL_RANK`` under torchrun), with a
    ``classes``-wide head (at least 2); ``wrap`` is ``compare.ddp.wrap`` in a job."""
    cuda = cfg.wants_cuda and torch.cuda.is_available()
    amp = torch.bfloat16 if cuda else None
    return TrainStep(model, cfg.resolved().torch_device if cuda else torch.device("cpu"),
                     num_classes=max(2, classes), amp_dtype=amp,
                     channels_last=cfg.channels_last, wrap=wrap)
