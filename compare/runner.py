"""Runs every variant on the same files, augmentation, batch size, model, steps and warm-up."""
from __future__ import annotations

import gc
import itertools
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import torch

from pipelines import Backend, LoaderConfig, create_loader
from pipelines.indexing import list_samples

from .metrics import CpuUtil, NvmlSampler, loader_only, measure
from .models import TrainStep
from .results import Repeat, VariantResult


ALLOWED_OVERRIDES = {"num_workers", "prefetch", "streams", "persistent_workers", "pin_mode",
                     "dali_hw_decoder_load", "dali_preallocate_width_hint",
                     "dali_preallocate_height_hint", "dali_pipelines", "dali_use_mmap"}


@dataclass(frozen=True)
class Variant:
    """A backend plus loader-only overrides (never the data, augmentation, batch or model)."""

    label: str
    backend: Backend
    overrides: Dict[str, object] = field(default_factory=dict)

    def __post_init__(self):
        extra = sorted(set(self.overrides) - ALLOWED_OVERRIDES)
        if extra:  # apples to apples: a variant may only change how data is loaded
            raise ValueError(f"variant {self.label!r} overrides {extra}; only "
                             f"{sorted(ALLOWED_OVERRIDES)} may differ between variants")


PRESETS = ("seeds",)


def preset(name: str, available: Sequence[Backend]) -> List[Variant]:
    """``seeds``: the seeds' table (default, pin_memory only, pinned multi-stream) plus DALI."""
    if name != "seeds":
        raise ValueError(f"preset={name!r} is unknown; choose one of {', '.join(PRESETS)}")
    out = [Variant("pageable", Backend.PAGEABLE),
           Variant("pin-only", Backend.PINNED, {"streams": 0}),
           Variant("pinned", Backend.PINNED, {"streams": 2})]
    if Backend.DALI in available:
        out.append(Variant("dali", Backend.DALI))
    return out


def parse_sweep(spec: str, backends: Sequence[Backend]) -> List[Variant]:
    """``"workers=0,4,8 pin=on,off"`` -> one variant per combination.

    ``pin=on`` selects the ``pinned`` backend, ``pin=off`` the ``pageable`` one; without ``pin``
    every backend in ``backends`` is swept. Other keys: ``workers``, ``prefetch``, ``streams``,
    ``pinmode`` (``thread`` or ``ring``, the ``pinned`` backend's ``pin_mode``), ``hw``
    (DALI's ``hw_decoder_load``, a fraction), ``prealloc`` (DALI's decoder preallocation
    width and height hint, in pixels), ``pipes`` (DALI pipelines side by side) and ``mmap``
    (``on``/``off``: DALI reads files by mapping them).
    """
    keys = {"workers": "num_workers", "prefetch": "prefetch", "streams": "streams", "pin": "pin",
            "pinmode": "pin_mode", "hw": "dali_hw_decoder_load",
            "prealloc": "dali_preallocate_width_hint", "pipes": "dali_pipelines",
            "mmap": "dali_use_mmap"}
    axes: Dict[str, List[str]] = {}
    for part in spec.split():
        k, _, vals = part.partition("=")
        if k not in keys or not vals:
            raise ValueError(f"--sweep item {part!r} is not KEY=V1,V2 with KEY in {sorted(keys)}")
        axes[k] = vals.split(",")
    bad = [m for m in axes.get("pinmode", []) if m not in ("thread", "ring")]
    if bad:
        raise ValueError(f"--sweep pinmode={','.join(bad)} must be thread or ring")
    bad = [m for m in axes.get("mmap", []) if m not in ("on", "off")]
    if bad:
        raise ValueError(f"--sweep mmap={','.join(bad)} must be on or off")
    pins = axes.pop("pin", None)
    if pins is not None:
        bad = [p for p in pins if p not in ("on", "off")]
        if bad:
            raise ValueError(f"--sweep pin={','.join(bad)} must be on or off")
        backs = [Backend.PINNED if p == "on" else Backend.PAGEABLE for p in pins]
    else:
        backs = list(backends)
    out = []
    names = list(axes)
    for b in backs:
        for combo in itertools.product(*(axes[k] for k in names)):
            try:
                ov = {keys[k]: _sweep_value(k, v) for k, v in zip(names, combo)}
                if "prealloc" in names:
                    ov["dali_preallocate_height_hint"] = ov["dali_preallocate_width_hint"]
            except ValueError:
                raise ValueError(f"--sweep values must be numbers (or on/off for pin): {spec!r}") from None
            label = b.value + "".join(f" {k}={v}" for k, v in zip(names, combo))
            out.append(Variant(label, b, ov))
    return out


def _sweep_value(key: str, v: str):
    if key == "hw":
        return float(v)
    if key == "pinmode":
        return v
    if key == "mmap":
        return v == "on"
    return int(v)


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


def h2d_bytes_per_sample(backend: Backend, cfg: LoaderConfig, loader) -> Optional[float]:
    """Bytes that cross PCIe per sample (images + int64 label)."""
    if not cfg.wants_cuda or not torch.cuda.is_available():
        return 0.0
    px = 3 * cfg.augment.size ** 2
    if backend is Backend.PAGEABLE:
        return px * 4 + 8.0
    if backend is Backend.PINNED:
        return px * 1 + 8.0
    src = getattr(loader, "source", None)  # DALI: the encoded JPEG bytes go to the GPU decoder
    if src is None or not src.samples_read:
        return None
    return src.bytes_read / src.samples_read + 8.0


def run_variant(v: Variant, base: LoaderConfig, step: Callable, *, steps: int, warmup: int,
                repeats: int, log: Callable[[str], None] = print,
                capture: Optional[list] = None) -> VariantResult:
    """Loader-only and model runs of one variant, ``repeats`` times each.

    Args:
        capture: when given, one more batch (cloned) is appended to it, for the ceiling run.
    """
    cfg = base.replace(**v.overrides)
    device = cfg.torch_device if torch.cuda.is_available() else torch.device("cpu")
    reps: List[Repeat] = []
    with create_loader(v.backend, cfg) as loader:
        it = endless(loader)
        for r in range(repeats):
            lo = loader_only(it, steps, warmup, device)
            cpu = CpuUtil()
            cpu.start()
            with NvmlSampler(device.index or 0) if device.type == "cuda" else _Null() as nv:
                m = measure(it, step, steps, warmup, device)
            reps.append(Repeat(
                samples_per_s=m.samples_per_s, loader_only_per_s=lo,
                wait_p50_ms=m.wait_pct(50), wait_p95_ms=m.wait_pct(95), idle_pct=m.idle_pct,
                cpu_util_pct=cpu.stop(), nvml_util_pct=getattr(nv, "mean_util", lambda: None)(),
                waits_ms=tuple(round(w, 3) for w in m.waits_ms),
            ))
            log(f"  {v.label:28s} repeat {r + 1}/{repeats}: {m.samples_per_s:9.1f} samples/s, "
                f"loader-only {lo:9.1f} img/s, wait p50 {m.wait_pct(50):7.2f} ms, "
                f"idle {m.idle_pct:5.1f}%")
        h2d = h2d_bytes_per_sample(v.backend, cfg, loader)
        if capture is not None:
            x, y = next(it)
            capture.append((x.clone(), y.clone()))
        it.close()
    gc.collect()
    return VariantResult(v.label, v.backend.value, dict(v.overrides), h2d, tuple(reps))


def run_ceiling(batch, step: Callable, *, steps: int, warmup: int, repeats: int,
                device: torch.device, log: Callable[[str], None] = print) -> VariantResult:
    """The same step on one batch already on the device: the model-only ceiling."""
    x, y = batch
    same = itertools.repeat((x, y))
    reps = []
    for r in range(repeats):
        m = measure(same, step, steps, warmup, device)
        reps.append(Repeat(m.samples_per_s, float("nan"), m.wait_pct(50), m.wait_pct(95),
                           m.idle_pct))
        log(f"  {'ceiling (batch on device)':28s} repeat {r + 1}/{repeats}: "
            f"{m.samples_per_s:9.1f} samples/s, idle {m.idle_pct:5.1f}%")
    return VariantResult("ceiling", "none", {}, 0.0, tuple(reps))


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return None


def num_classes(root) -> int:
    return len(list_samples(root)[2])


def make_step(model: str, cfg: LoaderConfig, root) -> TrainStep:
    cuda = cfg.wants_cuda and torch.cuda.is_available()
    amp = torch.bfloat16 if cuda else None
    return TrainStep(model, cfg.torch_device if cuda else torch.device("cpu"),
                     num_classes=max(2, num_classes(root)), amp_dtype=amp,
                     channels_last=cfg.channels_last)
