"""Runs every variant on the same files, augmentation, batch size, model, steps and warm-up."""
from __future__ import annotations

import gc
import itertools
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from pipelines import Backend, LoaderConfig, create_loader

from .cli import PRESETS
from .metrics import CpuUtil, NvmlSampler, loader_only, measure
from .models import TrainStep
from .results import Repeat, VariantResult


ALLOWED_OVERRIDES = {"num_workers", "prefetch", "streams", "persistent_workers", "pin_mode",
                     "dali_hw_decoder_load", "dali_preallocate_width_hint",
                     "dali_preallocate_height_hint", "dali_pipelines", "dali_use_mmap"}


@dataclass(frozen=True)
class Variant:
    """A backend plus loader-only overrides (never the data, augmentation, batch or model).

    ``options`` names, for each override, the command-line item that set it (e.g.
    ``{"num_workers": "--sweep workers=4"}``), so a value the config refuses is reported
    against what the user typed.
    """

    label: str
    backend: Backend
    overrides: Dict[str, object] = field(default_factory=dict)
    options: Dict[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self):
        extra = sorted(set(self.overrides) - ALLOWED_OVERRIDES)
        if extra:  # apples to apples: a variant may only change how data is loaded
            raise ValueError(f"variant {self.label!r} overrides {extra}; only "
                             f"{sorted(ALLOWED_OVERRIDES)} may differ between variants")


ORDER = (Backend.PAGEABLE, Backend.PINNED, Backend.DALI)


def preset(name: str, backends: Sequence[Backend]) -> List[Variant]:
    """``seeds``: the seeds' table (default, pin_memory only, pinned multi-stream) plus DALI,
    restricted to ``backends`` (e.g. ``--preset seeds --backends pinned`` -> pin-only, pinned)."""
    if name != "seeds":
        raise ValueError(f"--preset {name!r} is unknown; choose one of {', '.join(PRESETS)}")
    src = {"streams": f"--preset {name}"}
    out = [Variant("pageable", Backend.PAGEABLE),
           Variant("pin-only", Backend.PINNED, {"streams": 0}, src),
           Variant("pinned", Backend.PINNED, {"streams": 2}, src),
           Variant("dali", Backend.DALI)]
    return [v for v in out if v.backend in backends]


# NOTE [sweep keys and the backends they apply to]
# A sweep key sets a LoaderConfig field that only some backends honour. On any other backend it
# has no effect, so sweeping it there would time identical setups and report noise as a
# speed-up. The rule: each backend is swept over the keys it honours only, and runs once per
# combination of those (a one-line note says "no effect on <backend>"); a key that no backend of
# the run honours is refused. ``pin`` is not a knob but picks backends: on = pinned, off =
# pageable; without --backends it chooses them, with --backends it must agree with them.
_ALL = frozenset(Backend)
SWEEP_KEYS: Dict[str, Tuple[Tuple[str, ...], frozenset]] = {
    "workers": (("num_workers",), _ALL),
    "prefetch": (("prefetch",), _ALL),
    "streams": (("streams",), frozenset({Backend.PINNED})),
    "pinmode": (("pin_mode",), frozenset({Backend.PINNED})),
    "hw": (("dali_hw_decoder_load",), frozenset({Backend.DALI})),
    "pipes": (("dali_pipelines",), frozenset({Backend.DALI})),
    "mmap": (("dali_use_mmap",), frozenset({Backend.DALI})),
    "prealloc": (("dali_preallocate_width_hint", "dali_preallocate_height_hint"),
                 frozenset({Backend.DALI})),
}
PIN = {"on": Backend.PINNED, "off": Backend.PAGEABLE}


def _names(backs) -> str:
    return ",".join(b.value for b in backs)


def _sweep_value(key: str, raw: str):
    """One ``--sweep`` value, typed (ranges are checked by ``LoaderConfig`` later)."""
    word = {"pin": ("on", "off"), "mmap": ("on", "off"), "pinmode": ("thread", "ring")}
    if key in word:
        if raw not in word[key]:
            raise ValueError(f"--sweep {key}={raw} must be {' or '.join(word[key])}")
        return raw == "on" if key == "mmap" else raw
    try:
        return float(raw) if key == "hw" else int(raw)
    except ValueError:
        kind = "a number" if key == "hw" else "an int"
        raise ValueError(f"--sweep {key}={raw} must be {kind}") from None


def _axes(spec: str, note: Callable[[str], None]) -> Dict[str, List[Tuple[str, object]]]:
    """``"workers=0,4 pin=on"`` -> ``{key: [(raw, value), ...]}``, duplicates merged."""
    axes: Dict[str, List[Tuple[str, object]]] = {}
    keys = sorted([*SWEEP_KEYS, "pin"])
    for part in spec.split():
        k, eq, vals = part.partition("=")
        if k not in keys or not eq or not vals:
            raise ValueError(f"--sweep item {part!r} is not KEY=V1,V2 with KEY in {keys}")
        if k in axes:
            note(f"--sweep {k} is given twice; its values are merged")
        for raw in vals.split(","):
            if not raw:
                raise ValueError(f"--sweep item {part!r} has an empty value")
            v = _sweep_value(k, raw)
            seen = axes.setdefault(k, [])
            if any(v == w for _, w in seen):
                note(f"--sweep {k} lists {raw} more than once; it runs once")
                continue
            seen.append((raw, v))
    if not axes:
        raise ValueError(f"--sweep {spec!r} names no KEY=V1,V2 item")
    return axes


def parse_sweep(spec: str, backends: Sequence[Backend], *, chosen: bool = False,
                note: Callable[[str], None] = lambda s: None) -> List[Variant]:
    """``"workers=0,4,8 pin=on,off"`` -> one variant per combination (see the NOTE above).

    Keys: ``workers``, ``prefetch`` (every backend); ``streams``, ``pinmode`` (``thread`` or
    ``ring``, the ``pinned`` backend's ``pin_mode``) for ``pinned``; ``hw`` (DALI's
    ``hw_decoder_load``, a fraction), ``prealloc`` (DALI's decoder preallocation width and
    height hint, in pixels), ``pipes`` (DALI pipelines side by side) and ``mmap`` (``on``/``off``:
    DALI reads files by mapping them) for ``dali``. ``pin=on`` picks the ``pinned`` backend,
    ``pin=off`` the ``pageable`` one.

    Example: backends pageable,dali and ``"workers=2,4 hw=0,1"`` -> ``pageable workers=2``,
    ``pageable workers=4`` and four ``dali`` variants; a note says hw has no effect on pageable.

    Args:
        backends: the backends to sweep (``--backends``, or every one available).
        chosen: the user listed ``backends`` (``--backends``): ``pin`` must agree with them.
        note: receives one-line notes (merged duplicates, keys with no effect on a backend).

    Raises:
        ValueError: naming the ``--sweep`` item (bad key or value, or a key no backend honours).
    """
    axes = _axes(spec, note)
    pins = axes.pop("pin", None)
    backs = list(backends)
    if pins is not None:
        picked = [PIN[raw] for raw, _ in pins]
        torch_backs = [b for b in backs if b in PIN.values()]
        if not chosen:
            backs = picked
        elif set(picked) != set(torch_backs):
            raise ValueError(
                f"--sweep pin={','.join(r for r, _ in pins)} runs {_names(picked)} but "
                f"--backends is {_names(backs)}; pin only picks between pinned (on) and "
                "pageable (off): drop it or list the same backends")
    names = list(axes)
    for k in names:
        if not any(b in SWEEP_KEYS[k][1] for b in backs):
            owners = _names(b for b in ORDER if b in SWEEP_KEYS[k][1])
            raise ValueError(f"--sweep {k} sets {owners} only and has no effect on "
                             f"{_names(backs)}; add {owners} to --backends or drop {k}=")
    out = []
    for b in backs:
        mine = [k for k in names if b in SWEEP_KEYS[k][1]]
        idle = [k for k in names if k not in mine] + (["pin"] if pins and b not in PIN.values()
                                                       else [])
        if idle:
            note(f"--sweep {', '.join(idle)}: no effect on {b.value}; it runs once")
        for combo in itertools.product(*(axes[k] for k in mine)):
            ov, opts = {}, {}
            for k, (raw, v) in zip(mine, combo):
                for f in SWEEP_KEYS[k][0]:
                    ov[f], opts[f] = v, f"--sweep {k}={raw}"
            label = b.value + "".join(f" {k}={raw}" for k, (raw, _) in zip(mine, combo))
            out.append(Variant(label, b, ov, opts))
    return out


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


def make_step(model: str, cfg: LoaderConfig, classes: int) -> TrainStep:
    """The model step for ``cfg``'s device, with a ``classes``-wide head (at least 2)."""
    cuda = cfg.wants_cuda and torch.cuda.is_available()
    amp = torch.bfloat16 if cuda else None
    return TrainStep(model, cfg.torch_device if cuda else torch.device("cpu"),
                     num_classes=max(2, classes), amp_dtype=amp,
                     channels_last=cfg.channels_last)
