"""Runs every variant on the same files, augmentation, batch size, model, steps and warm-up."""
from __future__ import annotations

import gc
import itertools
import os
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import replace

import torch

from pipelines import Backend, LoaderConfig, create_loader

from .metrics import CpuUtil, NvmlSampler, loader_only, measure
from .models import TrainStep
from .probes import Active
from .progress import bar
from .results import FIT_QUEUES, Repeat, VariantResult
from .variants import Variant

NONE = Active()  # no lab probe


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


def device_of(cfg: LoaderConfig) -> torch.device:
    """The device ``cfg``'s batches land on: its CUDA device, or the CPU without CUDA."""
    return cfg.resolved().torch_device if torch.cuda.is_available() else torch.device("cpu")


def open_loader(v: Variant, cfg: LoaderConfig):
    """The loader of variant ``v`` for ``cfg``: a backend, or a plain reference recipe."""
    if v.reference:
        from .reference import DaliFileReaderReference, ImageFolderReference

        if v.backend is Backend.DALI:
            return DaliFileReaderReference(cfg)
        return ImageFolderReference(cfg)
    return create_loader(v.backend, cfg, options=v.options_of())


def queue_depth(loader) -> int | None:
    """Batches ``loader`` holds ahead of the consumer once full (``None``: unknown kind)."""
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


def window(steps: int, queue: int | None, epoch_batches: int, fit: bool = False,
           probes: Active = NONE) -> int:
    """The timed window in batches: ``steps`` (with ``fit``, at least ``FIT_QUEUES`` queues),
    as a probe makes it, rounded up to whole epochs when an epoch is at most twice as long."""
    n = max(steps, FIT_QUEUES * (queue or 0)) if fit else steps
    n = probes.window(n, queue, epoch_batches)
    if 0 < epoch_batches <= 2 * n:
        n = -(-n // epoch_batches) * epoch_batches
    return n


# NOTE [settling] (docs/benchmarking.md, Steady state)
# Workers that run across epochs (``epoch_stream``) start in step and deliver in waves, a
# start-up transient: warm up ``num_workers`` batches at a time until ``metrics.out_of_step``,
# or ``SETTLE_CAP_QUEUES`` queues. Loaders that restart workers each epoch do not settle (that
# is their steady state). Under torchrun the ranks settle together (``Job.all_agree``).
SETTLE_CAP_QUEUES = 5

def settle_of(loader, queue: int | None, agreed: bool = False) -> tuple[int, int] | None:
    """``(period, cap)`` for ``metrics.measure``'s ``settle``, or ``None`` for a loader that
    does not settle (``agreed``: the ranks of a process group agree on when to stop)."""
    workers = getattr(loader, "num_workers", 0) or 0
    if not getattr(loader, "epoch_stream", False) or workers < 2:
        return None
    dist = torch.distributed
    if not agreed and dist.is_available() and dist.is_initialized() and \
            dist.get_world_size() > 1:
        return None
    return workers, SETTLE_CAP_QUEUES * max(queue or 0, workers)


def wave_period(loader) -> int | None:
    """``loader``'s DataLoader workers (from 2), whose waves a loader-only stretch holds whole;
    ``None`` for DALI."""
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
    """The first-epoch batches run before the first window: all when the epoch is at most twice
    the window, else none (NOTE [steady state] in compare.isolate)."""
    return epoch_batches if 0 < epoch_batches <= 2 * steps else 0


def time_repeat(it: Iterator, step: Callable, *, steps: int, warmup: int,
                device: torch.device, sync: Callable[[], None] = _nothing,
                queue: int | None = None, first: int = 0,
                settle: tuple[int, int] | None = None,
                agree: Callable[[bool], bool] | None = None,
                period: int | None = None, probes: Active = NONE, unit: str = "",
                first_repeat: bool = False) -> Repeat:
    """One repeat on a running loader: the step primed on one batch, then the loader-only and
    the training window, ``steps`` batches each after ``warmup``.

    The ``queue`` filled while the step was primed (or a probe acted) is drained first: it was
    made before the clock started. ``first``: ``first_epoch``'s batches, on the first repeat.
    ``settle``/``agree``: NOTE [settling]; ``period``: ``wave_period``; ``probes``: the lab
    probes' hooks around the windows.
    """
    x, y = next(it)  # the step's first calls (CUDA/cuDNN set-up) run before any window, so
    for _ in range(max(1, warmup)):  # the loader cannot fill its queue while they run
        step(x, y)  # (NOTE [steady state] in compare.isolate)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    del x, y
    drain(it, max(0, first - 1))  # the priming took the first epoch's first batch
    sync()
    probes.before_window()
    drain(it, queue or 0)  # the queue made while the step ran (or a probe acted)
    lo = loader_only(it, steps, warmup, device, period=period)
    sync()
    extra = probes.before_window()
    if extra is not None:
        drain(it, queue or 0)
    cpu = CpuUtil()
    cpu.start()
    with NvmlSampler(device.index or 0) if device.type == "cuda" else nullcontext() as nv:
        m = measure(it, step, steps, warmup, device, settle=settle, agree=agree)
    busy = cpu.stop()
    sync()
    extra = {**(extra or {}), **probes.after_windows(
        lambda: measure(it, step, steps, warmup, device, mark=True), unit, first_repeat)}
    return Repeat(
        samples_per_s=m.samples_per_s, loader_only_per_s=lo.rate, loader_only_halves=lo.halves,
        wait_p50_ms=m.wait_pct(50), wait_p95_ms=m.wait_pct(95), idle_pct=m.idle_pct,
        cpu_util_pct=busy, nvml_util_pct=getattr(nv, "mean_util", lambda: None)(),
        waits_ms=tuple(round(w, 3) for w in m.waits_ms), steps=steps,
        window_s=round(m.wall_s, 4), pid=os.getpid(), halves=m.halves(),
        settle_batches=m.settle_batches, settled=m.settled, probes=extra)


def say_repeat(log: Callable[[str], None], label: str, r: Repeat, where: str,
               gpu: bool = True) -> None:
    """One repeat's line (GPU idle % only with a GPU: on the CPU it is not measured)."""
    loader = (f"loader-only {r.loader_only_per_s:9.1f} img/s, wait p50 {r.wait_p50_ms:7.2f} ms"
              if r.loader_only_per_s == r.loader_only_per_s else "")  # NaN: the ceiling
    idle = f"GPU idle {r.idle_pct:5.1f}%" if gpu else ""
    cold = r.probes.get("cold_resident")
    cold = "" if cold is None else f"cold ({100 * cold:.1f}% still cached)"
    rest = ", ".join(x for x in (loader, idle, cold) if x)
    log(f"  {label:28s} {where}: {r.samples_per_s:9.1f} samples/s over {r.steps} steps"
        + (f", {rest}" if rest else ""))


def run_variant(v: Variant, base: LoaderConfig, step: Callable, *, steps: int, warmup: int,
                repeats: int, log: Callable[[str], None] = print,
                capture: list | None = None, sync: Callable[[], None] = _nothing,
                agree: Callable[[bool], bool] | None = None, fit: bool = False,
                probes: Active = NONE) -> VariantResult:
    """Loader-only and model runs of one variant, ``repeats`` times each, in this process.

    Args:
        capture: when given, one more batch (cloned) is appended to it, for the ceiling run.
        sync: called before each timed run (``Job.barrier`` under torchrun).
        agree: the job's verdict from this rank's (``Job.all_agree``; NOTE [settling]).
        fit: ``--steps`` was not given (``window``).
    """
    cfg = v.config_of(base)
    device = device_of(cfg)
    reps: list[Repeat] = []
    with open_loader(v, cfg) as loader:
        queue = queue_depth(loader)
        n = window(steps, queue, len(loader), fit, probes)
        settle = settle_of(loader, queue, agreed=agree is not None)
        it = endless(loader)
        progress = bar(repeats, f"compare {v.label}", "repeat")
        for r in range(repeats):
            got = time_repeat(it, step, steps=n, warmup=warmup, device=device, sync=sync,
                              queue=queue, first=first_epoch(len(loader), n) if r == 0 else 0,
                              settle=settle, agree=agree, period=wave_period(loader),
                              probes=probes, unit=v.label, first_repeat=r == 0)
            reps.append(with_decoder(got, loader))
            progress.update(1)
            say_repeat(log, v.label, reps[-1], f"repeat {r + 1}/{repeats}", gpu=device.type == "cuda")
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
                   probes: Active = NONE, first_repeat: bool = False) -> Repeat:
    """One repeat of the same step on one batch already on the device."""
    sync()
    m = measure(itertools.repeat(batch), step, steps, warmup, device)
    sync()
    extra = probes.after_windows(lambda: measure(itertools.repeat(batch), step, steps, warmup,
                                                 device, mark=True), "ceiling", first_repeat)
    return Repeat(m.samples_per_s, float("nan"), m.wait_pct(50), m.wait_pct(95), m.idle_pct,
                  steps=steps, window_s=round(m.wall_s, 4), pid=os.getpid(), probes=extra)


def run_ceiling(batch, step: Callable, *, steps: int, warmup: int, repeats: int,
                device: torch.device, log: Callable[[str], None] = print,
                sync: Callable[[], None] = _nothing, probes: Active = NONE) -> VariantResult:
    """The same step on one batch already on the device: the model-only ceiling."""
    reps = []
    for r in range(repeats):
        reps.append(ceiling_repeat(batch, step, steps=steps, warmup=warmup, device=device,
                                   sync=sync, probes=probes, first_repeat=r == 0))
        log(f"  {'ceiling (batch on device)':28s} repeat {r + 1}/{repeats}: "
            f"{reps[-1].samples_per_s:9.1f} samples/s"
            + (f", GPU idle {reps[-1].idle_pct:5.1f}%" if device.type == "cuda" else ""))
    return VariantResult("ceiling", "none", {}, 0.0, tuple(reps))


def make_step(model: str, cfg: LoaderConfig, classes: int,
              wrap: Callable | None = None) -> TrainStep:
    """The model step for ``cfg``'s device, with a ``classes``-wide head (at least 2)."""
    cuda = cfg.wants_cuda and torch.cuda.is_available()
    amp = torch.bfloat16 if cuda else None
    return TrainStep(model, cfg.resolved().torch_device if cuda else torch.device("cpu"),
                     num_classes=max(2, classes), amp_dtype=amp,
                     channels_last=cfg.channels_last, wrap=wrap)
