"""Translate a torchvision v2 ``Compose`` into a plan that the DALI backend runs on the GPU.

``from_torchvision(compose)`` returns a :class:`TvPlan`: the ordered, DALI-translatable ops
(crop, resize, flips, colour jitter, grayscale, blur), the normalisation, and the output size.
The torch backends keep running the user's own Compose (``pinned`` runs its uint8 part in the
workers and its ``ToDtype``/``Normalize`` tail on the GPU); the DALI backend builds its graph
from the plan (``pipelines.dali.graph``). Nothing here imports DALI.

Example:
    >>> from torchvision.transforms import v2
    >>> plan = from_torchvision(v2.Compose([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(),
    ...                                     v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
    ...                                     v2.Normalize([0.5] * 3, [0.5] * 3)]))
    >>> [op.kind for op in plan.ops], plan.out_size
    (['random_resized_crop', 'hflip'], (224, 224))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch

SUPPORTED = ("RandomResizedCrop", "Resize", "CenterCrop", "RandomCrop", "RandomHorizontalFlip",
             "RandomVerticalFlip", "Normalize", "ToImage", "PILToTensor", "ToDtype",
             "ColorJitter", "RandomGrayscale", "GaussianBlur")
FORMAT_OPS = ("ToImage", "PILToTensor", "ToDtype", "Normalize")


class UnsupportedTransformError(ValueError):
    """Raised with every unsupported transform of a Compose and its position."""


@dataclass(frozen=True)
class Op:
    """One translated step. ``kind`` names it; ``args`` holds its parameters."""

    kind: str
    args: Tuple[Tuple[str, Any], ...] = ()

    def __getitem__(self, key: str) -> Any:
        return dict(self.args)[key]


@dataclass(frozen=True)
class TvPlan:
    """What the DALI backend needs to reproduce a torchvision Compose.

    Attributes:
        ops: geometric and colour ops, in the Compose's order.
        mean, std: normalisation on the 0..255 scale (``(0,0,0)`` / ``(1,1,1)`` when absent).
        out_size: ``(H, W)`` of every output image.
    """

    ops: Tuple[Op, ...]
    mean: Tuple[float, float, float]
    std: Tuple[float, float, float]
    out_size: Tuple[int, int]


def _hw(size) -> Tuple[int, int]:
    if isinstance(size, int):
        return size, size
    size = list(size)
    return (size[0], size[0]) if len(size) == 1 else (int(size[0]), int(size[1]))


def _interp(t) -> str:
    mode = getattr(getattr(t, "interpolation", None), "value", "bilinear")
    return {"bilinear": "linear", "nearest": "nn", "nearest-exact": "nn", "bicubic": "cubic"}.get(
        str(mode), "unsupported")


def _range(v, center: float = 1.0, lo: float = 0.0) -> Optional[Tuple[float, float]]:
    if v is None:
        return None
    if isinstance(v, (int, float)):
        return (max(lo, center - v), center + v) if v else None
    return float(v[0]), float(v[1])


def from_torchvision(compose) -> TvPlan:
    """Translate ``compose`` (a ``torchvision.transforms.v2.Compose``, or a list of transforms).

    Raises:
        UnsupportedTransformError: lists each unsupported transform with its position.
        TypeError: ``compose`` is not a Compose or a sequence of transforms.
    """
    from torchvision.transforms import v2

    if isinstance(compose, (list, tuple)):
        compose = v2.Compose(list(compose))
    if not isinstance(compose, v2.Compose):
        raise TypeError(f"transform={compose!r} must be a torchvision.transforms.v2.Compose")
    ops: List[Op] = []
    bad: List[str] = []
    mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    scaled = normalized = False
    split = None
    size: Optional[Tuple[int, int]] = None
    for pos, t in enumerate(compose.transforms):
        name = type(t).__name__
        problem = None
        if name not in SUPPORTED:
            problem = "not supported"
        elif name in FORMAT_OPS:
            if name in ("ToDtype", "Normalize") and split is None:
                split = pos
            if name == "ToDtype":
                dt = t.dtype.get(torch.Tensor, t.dtype.get("others")) if isinstance(t.dtype, dict) else t.dtype
                if dt is not None and not getattr(dt, "is_floating_point", False):
                    problem = f"dtype={dt} (only float dtypes)"
                scaled = bool(t.scale)
            elif name == "Normalize":
                normalized = True
                k = 255.0 if scaled else 1.0
                mean = tuple(float(m) * k for m in t.mean)
                std = tuple(float(s) * k for s in t.std)
                if len(mean) != 3:
                    problem = "needs 3 channels"
            elif split is not None:
                problem = f"{name} after ToDtype/Normalize"
        elif split is not None:
            problem = "after ToDtype/Normalize (augment uint8 images first)"
        elif _interp(t) == "unsupported" and hasattr(t, "interpolation"):
            problem = f"interpolation={t.interpolation}"
        elif name == "RandomResizedCrop":
            size = _hw(t.size)
            ops.append(Op("random_resized_crop", (("size", size), ("scale", tuple(t.scale)),
                                                  ("ratio", tuple(t.ratio)), ("interp", _interp(t)))))
        elif name == "Resize":
            if t.size is None:
                problem = "size=None"
            elif t.max_size is not None:
                problem = "max_size"
            elif isinstance(t.size, int) or len(t.size) == 1:
                ops.append(Op("resize_shorter", (("size", _hw(t.size)[0]), ("max_size", t.max_size),
                                                 ("interp", _interp(t)))))
                size = None
            else:
                size = _hw(t.size)
                ops.append(Op("resize", (("size", size), ("interp", _interp(t)))))
        elif name == "CenterCrop":
            size = _hw(t.size)
            ops.append(Op("center_crop", (("size", size),)))
        elif name == "RandomCrop":
            if t.padding is not None or t.pad_if_needed:
                problem = "padding / pad_if_needed"
            else:
                size = _hw(t.size)
                ops.append(Op("random_crop", (("size", size),)))
        elif name in ("RandomHorizontalFlip", "RandomVerticalFlip"):
            ops.append(Op("hflip" if "Horizontal" in name else "vflip", (("p", float(t.p)),)))
        elif name == "ColorJitter":
            ops.append(Op("color_jitter", (
                ("brightness", _range(t.brightness)), ("contrast", _range(t.contrast)),
                ("saturation", _range(t.saturation)), ("hue", _range(t.hue, center=0.0, lo=-0.5)))))
        elif name == "RandomGrayscale":
            ops.append(Op("grayscale", (("p", float(t.p)),)))
        elif name == "GaussianBlur":
            ks = _hw(t.kernel_size)
            if ks[0] != ks[1]:
                problem = f"kernel_size={t.kernel_size} (square kernels only)"
            ops.append(Op("gaussian_blur", (("kernel", ks), ("sigma", tuple(float(s) for s in t.sigma)))))
        if problem:
            bad.append(f"#{pos} {name} ({problem})")
    if bad:
        raise UnsupportedTransformError(
            "from_torchvision cannot translate: " + "; ".join(bad)
            + f". Supported: {', '.join(SUPPORTED)}")
    if scaled and not normalized:  # ToDtype(scale=True) alone: 0..255 -> 0..1
        std = (255.0, 255.0, 255.0)
    if size is None:
        raise UnsupportedTransformError(
            "from_torchvision: the Compose must end with a fixed output size (a crop, or Resize "
            "with (h, w)) so that images can be batched")
    return TvPlan(tuple(ops), mean, std, size)


def split_compose(compose):
    """``(uint8_part, float_part)`` of a Compose: before / from its first ``ToDtype``/``Normalize``.

    The ``pinned`` backend runs the first part in its workers (uint8 crosses PCIe) and the second
    on the GPU; any transform works there, translatable by DALI or not.
    """
    from torchvision.transforms import v2

    ts = list(compose.transforms)
    k = next((i for i, t in enumerate(ts) if type(t).__name__ in ("ToDtype", "Normalize")), len(ts))
    return v2.Compose(ts[:k]), v2.Compose(ts[k:])


def spec_ops(spec) -> TvPlan:
    """The ``AugmentSpec`` as a plan (the built-in recipe, without a user Compose)."""
    from .augment import Mode

    if spec.mode is Mode.TRAIN:
        ops = (Op("random_resized_crop", (("size", (spec.size, spec.size)), ("scale", spec.scale),
                                          ("ratio", spec.ratio), ("interp", "linear"))),
               Op("hflip", (("p", spec.flip_p),)))
    else:
        ops = (Op("resize_shorter", (("size", spec.resize_size), ("max_size", None),
                                     ("interp", "linear"))),
               Op("center_crop", (("size", (spec.size, spec.size)),)))
    return TvPlan(ops, spec.mean_255, spec.std_255, (spec.size, spec.size))

