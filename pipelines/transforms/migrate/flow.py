"""What torchvision does to the decoded image, step by step, worked out without running it.

The loaders hand the Compose a plain ``uint8`` ``3 x H x W`` tensor. :func:`walk` follows it
through the steps and records, between every two steps, a :class:`State`: the dtype, the tensor
kind (a plain tensor, or a ``tv_tensors.Image`` after ``ToImage``, which picks the entry of a
dict-form ``ToDtype``), the channels, the value map from the uint8 pixel ``x`` (``scale * x +
shift`` per channel, while it is affine) and the spatial size when an earlier step fixed it.
A step it does not model (``Lambda``, ``RandomApply``, a custom module) makes everything after
it unknown, and nothing after it is checked.

:func:`check` raises ``InvalidTransformError`` for every step that torchvision itself would
refuse on that input, e.g. ``Normalize`` on a uint8 image, a dict ``ToDtype`` with no entry
for the image's type, a zero ``std``, ``Resize`` with ``BOX`` on a tensor, a
``RandomResizedCrop`` with ``scale=(0.9, 0.1)``. The transform is never called.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from pipelines.transforms.migrate.errors import InvalidTransformError, Problem, refusal
from pipelines.transforms.migrate.forms import is_v1
from pipelines.transforms.migrate.params import (
    antialias,
    hw,
    interpolation,
    max_value,
    padding_lrtb,
    resize_refusal,
    resized,
    todtype_target,
)

Vec = tuple[float, ...]


@dataclass(frozen=True)
class State:
    """The image between two steps; ``None`` means not known without running the transform."""

    dtype: torch.dtype | None = torch.uint8
    kind: str | None = "tensor"            # "tensor" (plain) or "image" (tv_tensors.Image)
    channels: int | None = 3
    scale: Vec | None = (1.0, 1.0, 1.0)    # value = scale * x + shift, x the uint8 pixel
    shift: Vec | None = (0.0, 0.0, 0.0)
    size: tuple[int, int] | None = None    # (H, W), when an earlier step fixed it

    @property
    def is_float(self) -> bool:
        return self.dtype is not None and self.dtype.is_floating_point

    @property
    def affine(self) -> bool:
        return self.scale is not None and self.shift is not None


UNKNOWN = State(None, None, None, None, None, None)


@dataclass(frozen=True)
class Step:
    """One step of the Compose with the image before and after it."""

    pos: int
    t: Any
    name: str
    before: State
    after: State


# -- the steps -------------------------------------------------------------------------------------
Handler = Callable[[Any, State, list[str]], State]


def _resample(t, s: State, out: list[str]) -> None:
    mode = getattr(t, "interpolation", None)  # as given: torchvision 0.26 refuses strings
    why = resize_refusal(is_v1(t), mode if mode is not None else interpolation(t),
                         antialias(t), s.dtype)
    if why:
        out.append(f"interpolation={mode!r}, antialias={t.antialias}|torchvision "
                   f"refuses it on the decoded tensor ({why})")


def _resize(t, s: State, out: list[str]) -> State:
    _resample(t, s, out)
    size, max_size = t.size, getattr(t, "max_size", None)
    single = isinstance(size, int) or (size is not None and len(size) == 1)
    if max_size is not None and size is not None and not single:
        out.append(f"max_size={max_size}|torchvision refuses max_size with size=(h, w)")
    elif max_size is not None and single and max_size <= hw(size)[0]:
        out.append(f"max_size={max_size}|torchvision needs max_size > size={size}")
    if out:
        return replace(s, size=None)
    new = resized(s.size, size, max_size) if s.size else (None if single or size is None
                                                          else hw(size))
    return replace(s, size=new)


def _rrc(t, s: State, out: list[str]) -> State:
    _resample(t, s, out)
    (s0, s1), (r0, r1) = t.scale, t.ratio
    if s0 > s1:
        out.append(f"scale={tuple(t.scale)}|torchvision draws uniform(scale[0], scale[1]) and "
                   "raises when scale[0] > scale[1]")
    if r0 <= 0 or r0 > r1:
        out.append(f"ratio={tuple(t.ratio)}|torchvision draws exp(uniform(log ratio[0], log "
                   "ratio[1])) and raises unless 0 < ratio[0] <= ratio[1]")
    return replace(s, size=hw(t.size))


def _random_crop(t, s: State, out: list[str]) -> State:
    ch, cw = hw(t.size)
    if s.size and not t.pad_if_needed:
        l, r, top, b = padding_lrtb(t)
        if s.size[0] + top + b < ch or s.size[1] + l + r < cw:
            out.append(f"size={t.size}|torchvision raises: the crop is larger than the "
                       f"{s.size} image that reaches it")
    return replace(s, size=(ch, cw))


def _pad(t, s: State, out: list[str]) -> State:
    l, r, top, b = padding_lrtb(t)
    if s.size and t.padding_mode in ("reflect", "symmetric") and (
            max(top, b) >= s.size[0] or max(l, r) >= s.size[1]):
        out.append(f"padding={t.padding}|torchvision raises: {t.padding_mode} padding must be "
                   f"smaller than the {s.size} image it pads")
    return replace(s, size=(s.size[0] + top + b, s.size[1] + l + r) if s.size else None)


def _fills(t) -> list:
    """Every fill a warping step may use (``None``: no fill): v2 keeps them per type."""
    fill = getattr(t, "_fill", None)
    fill = fill if isinstance(fill, dict) else {"others": getattr(t, "fill", None)}
    return list(fill.values())


def _check_fill(t, s: State, out: list[str]) -> None:
    n = s.channels
    for v in _fills(t):
        k = len(v) if isinstance(v, (list, tuple)) else 1
        if n is not None and k not in (1, n):
            out.append(f"fill={v!r}|torchvision raises: {k} fill values for a {n}-channel "
                       "image (give 1 or one per channel)")
            return


def _check_range(name: str, lo_hi, out: list[str]) -> None:
    """A ``(min, max)`` that torchvision draws ``uniform_(min, max)`` from: it raises on a
    reversed or non-finite range."""
    lo, hi = (float(v) for v in lo_hi)
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        out.append(f"{name}={tuple(lo_hi)}|torchvision draws uniform({name}[0], {name}[1]) "
                   "and raises unless both are finite and min <= max")


def _auto_family(t, s: State, out: list[str]) -> State:
    """TrivialAugmentWide, RandAugment, AutoAugment: on uint8 they keep uint8 values; on float
    their result is no affine map of the pixels. torchvision refuses (at run time, when the op
    is drawn) fewer than 2 magnitude bins (its posterize table divides by bins - 1), a
    RandAugment ``magnitude`` that is no index of its ``num_magnitude_bins`` table, and a fill
    that does not broadcast to the channels."""
    bins: Any = getattr(t, "num_magnitude_bins", None)
    name = type(t).__name__
    if name in ("TrivialAugmentWide", "RandAugment") and bins is not None and (
            not isinstance(bins, int) or bins < 2):
        out.append(f"num_magnitude_bins={bins!r}|torchvision needs an int >= 2 (its posterize "
                   "table divides by bins - 1; it raises when that op is drawn)")
    elif name == "RandAugment" and (isinstance(t.magnitude, bool) or not isinstance(
            t.magnitude, int) or not -bins <= t.magnitude < bins):
        out.append(f"magnitude={t.magnitude!r}|torchvision indexes its table of "
                   f"num_magnitude_bins={bins} magnitudes with it and raises: give an int "
                   f"-{bins} <= magnitude < {bins}")
    if name in ("RandomRotation", "RandomAffine"):
        _check_range("degrees", t.degrees, out)
        if name == "RandomAffine" and t.scale is not None:
            _check_range("scale", t.scale, out)
        if name == "RandomAffine" and t.shear is not None:
            sh = list(t.shear)
            _check_range("shear", sh[:2], out)
            if len(sh) == 4:
                _check_range("shear[2:]", sh[2:], out)
    _check_fill(t, s, out)
    if name == "RandomRotation" and getattr(t, "expand", False):
        return _keeps_dtype(False)(t, s, out)
    return s if not s.is_float else _keeps_dtype(True)(t, s, out)


# steps that keep a uint8 image's size and values' space, so they may sit in a random branch
BRANCH_SAFE = ("RandomHorizontalFlip", "RandomVerticalFlip", "ColorJitter", "RandomGrayscale",
               "GaussianBlur", "RandomErasing", "TrivialAugmentWide", "RandAugment",
               "AutoAugment", "RandomRotation", "RandomAffine")


def _branches(t, s: State, out: list[str]) -> State:
    """RandomApply / RandomChoice: known when every branch keeps the size and, on uint8, the
    values' space (``BRANCH_SAFE``); unknown otherwise."""
    inner = list(getattr(t, "transforms", []))
    for u in inner:  # what torchvision refuses in a branch (raised when the branch is drawn)
        h = HANDLERS.get(type(u).__name__)
        more: list[str] = []
        if h is not None and s.dtype is not None:
            h(u, s, more)
        out += [f"{type(u).__name__}: {o}" for o in more]
    safe = all(type(u).__name__ in BRANCH_SAFE and not getattr(u, "expand", False)
               for u in inner)
    return s if safe and not s.is_float else UNKNOWN


def _blur(t, s: State, out: list[str]) -> State:
    kw, kh = hw(t.kernel_size)  # torchvision's kernel_size is (x, y)
    if s.size and (kh // 2 >= s.size[0] or kw // 2 >= s.size[1]):
        out.append(f"kernel_size={t.kernel_size}|torchvision pads by reflection and raises "
                   f"when half the kernel is not smaller than the {s.size} image")
    return s


def _normalize(t, s: State, out: list[str]) -> State:
    mean, std = [float(m) for m in t.mean], [float(v) for v in t.std]
    if s.dtype is not None and not s.dtype.is_floating_point:
        out.append(f"input dtype={s.dtype}|Normalize needs a float image; put "
                   "ToDtype(torch.float32, scale=True) before it")
    n = s.channels
    if n is not None and (len(mean) not in (1, n) or len(std) not in (1, n)):
        out.append(f"mean/std of length {len(mean)}/{len(std)}|the image has {n} channels")
    if any(v == 0 for v in std):
        out.append(f"std={std}|torchvision refuses a zero std (division by zero)")
    elif s.is_float and bool((torch.tensor(std, dtype=s.dtype) == 0).any()):
        out.append(f"std={std}|it is zero in {s.dtype}, which torchvision refuses")
    if out or not s.affine:
        return replace(s, scale=None, shift=None)
    assert s.scale is not None and s.shift is not None  # s.affine
    k = len(s.scale)
    m = mean * k if len(mean) == 1 else mean
    d = std * k if len(std) == 1 else std
    return replace(s, scale=tuple(a / d[c] for c, a in enumerate(s.scale)),
                   shift=tuple((b - m[c]) / d[c] for c, b in enumerate(s.shift)))


def _to_dtype(t, s: State, out: list[str], scale: bool | None = None) -> State:
    scale = bool(t.scale) if scale is None else scale
    try:
        known, dt = todtype_target(t, s.kind)
    except KeyError as e:
        out.append(f"dtype={t.dtype}|no entry for {e.args[0]} (the image is a "
                   f"{'tv_tensors.Image after ToImage' if s.kind == 'image' else 'plain tensor'}); "
                   "add it or an 'others' entry")
        return replace(s, dtype=None, scale=None, shift=None)
    if not known or s.dtype is None:
        return replace(s, dtype=dt if known else None, scale=None, shift=None)
    if dt is None or dt == s.dtype:
        return s
    src, dst = s.dtype, dt
    if not s.affine:
        return replace(s, dtype=dst)
    assert s.scale is not None and s.shift is not None  # s.affine
    if dst.is_floating_point:
        k = 1.0 / max_value(src) if scale and not src.is_floating_point else 1.0
        return replace(s, dtype=dst, scale=tuple(a * k for a in s.scale),
                       shift=tuple(b * k for b in s.shift))
    keeps = (not src.is_floating_point and not scale and dst != torch.bool
             and src == torch.uint8 and s.scale == (1.0,) * len(s.scale)
             and not any(s.shift) and torch.iinfo(dst).max >= 255 and torch.iinfo(dst).min <= 0)
    return replace(s, dtype=dst) if keeps else replace(s, dtype=dst, scale=None, shift=None)


def _same(t, s: State, out: list[str]) -> State:
    return s


def _to_image(t, s: State, out: list[str]) -> State:
    return replace(s, kind="image" if s.kind is not None else None)


def _to_pure(t, s: State, out: list[str]) -> State:
    return replace(s, kind="tensor" if s.kind is not None else None)


def _fixed(t, s: State, out: list[str]) -> State:
    return replace(s, size=hw(t.size))


def _keeps_dtype(keep_size: bool) -> Handler:
    """Steps that DALI does not run but whose effect on dtype and kind is known."""
    def h(t, s: State, out: list[str]) -> State:
        if type(t).__name__ == "RandomRotation" and getattr(t, "expand", False):
            keep = False
        else:
            keep = keep_size
        ch = getattr(t, "num_output_channels", s.channels) if type(t).__name__ == "Grayscale" \
            else s.channels
        return replace(s, scale=None, shift=None, size=s.size if keep else None, channels=ch)
    return h


HANDLERS: dict[str, Handler] = {
    "Resize": _resize, "RandomResizedCrop": _rrc, "CenterCrop": _fixed,
    "RandomCrop": _random_crop, "GaussianBlur": _blur, "Normalize": _normalize,
    "ToDtype": _to_dtype,
    "ConvertImageDtype": lambda t, s, out: _to_dtype(t, s, out, scale=True),
    "ToImage": _to_image, "ToPureTensor": _to_pure,
    # on a tensor these pass it through (v1's PIL-only ones are replaced, see forms)
    "PILToTensor": _same, "ToTensor": _same, "Identity": _same,
    "RandomHorizontalFlip": _same, "RandomVerticalFlip": _same,
    "ColorJitter": _same, "RandomGrayscale": _same,
    # the erased box holds the fill, a value of the same space as the other pixels
    "RandomErasing": _same,
    "Pad": _pad,
    # on uint8 it keeps uint8 values (on float it is not an affine map of them)
    "TrivialAugmentWide": _auto_family, "RandAugment": _auto_family,
    "AutoAugment": _auto_family,
    "RandomApply": _branches, "RandomChoice": _branches,
    # on uint8 the warp keeps uint8 values and, without expand, the size
    "RandomAffine": _auto_family,
    "RandomRotation": _auto_family,  # with expand=True, the size is not known
}
for _n in ("RandomPerspective", "ElasticTransform",
           "RandomEqualize", "RandomAutocontrast", "RandomInvert",
           "RandomPosterize", "RandomSolarize", "RandomAdjustSharpness", "AugMix", "RandomPhotometricDistort",
           "RandomChannelPermutation", "Grayscale", "JPEG"):
    HANDLERS[_n] = _keeps_dtype(True)
for _n in ("RandomZoomOut", "ScaleJitter", "RandomShortestSize", "RandomResize",
           "RandomIoUCrop"):
    HANDLERS[_n] = _keeps_dtype(False)


def walk(compose) -> tuple[list[Step], list[Problem]]:
    """Every step of ``compose`` (a flat v2 Compose) with the image before and after it, and the
    steps torchvision would refuse."""
    steps, problems = [], []
    s = State()
    for pos, t in enumerate(compose.transforms):
        name = type(t).__name__
        h = HANDLERS.get(name)
        out: list[str] = []
        after = UNKNOWN if h is None or s.dtype is None else h(t, s, out)  # no checks after it
        for o in out:
            param, _, why = o.partition("|")
            problems.append(Problem(pos, name, param, why))
        steps.append(Step(pos, t, name, s, after))
        s = after
    return steps, problems


def check(compose) -> list[Step]:
    """``walk(compose)``'s steps, or ``InvalidTransformError`` listing what torchvision refuses."""
    steps, problems = walk(compose)
    if problems:
        raise refusal(InvalidTransformError, "transform: torchvision would refuse", problems,
                      "Fix the Compose; no backend can run it")
    return steps
