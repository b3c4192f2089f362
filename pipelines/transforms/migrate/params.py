"""Transform parameters, read the same way from v1 and v2 transforms (they share names and
attributes for the supported set; where their stored forms differ, as ``RandomCrop.padding``
or a v2 ``interpolation`` kept as a string, this module reads both)."""
from __future__ import annotations

from functools import cache

import torch

from pipelines.transforms.migrate.forms import is_v1


def interpolation(t):
    """``t.interpolation`` as an ``InterpolationMode`` (v2 keeps strings and ints as given)."""
    from torchvision.transforms import InterpolationMode

    mode = getattr(t, "interpolation", InterpolationMode.BILINEAR)
    if isinstance(mode, InterpolationMode):
        return mode
    if isinstance(mode, str):
        return InterpolationMode(mode)
    from torchvision.transforms.functional import _interpolation_modes_from_int

    return _interpolation_modes_from_int(int(mode))


def antialias(t) -> bool:
    """torchvision resizes tensors with ``antialias=None`` as ``False``."""
    return bool(getattr(t, "antialias", True))


def hw(size) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    size = [int(s) for s in size]
    return (size[0], size[0]) if len(size) == 1 else (size[0], size[1])


def resized(size_hw: tuple[int, int], size, max_size) -> tuple[int, int]:
    """torchvision's ``Resize`` output ``(H, W)`` for an input of ``size_hw``."""
    h, w = size_hw
    short, long = (w, h) if w <= h else (h, w)
    if size is None:
        new_short, new_long = int(max_size * short / long), max_size
    elif isinstance(size, int) or len(size) == 1:
        s = size if isinstance(size, int) else int(size[0])
        new_short, new_long = s, int(s * long / short)
        if max_size is not None and new_long > max_size:
            new_short, new_long = int(max_size * new_short / new_long), max_size
    else:
        return int(size[0]), int(size[1])
    return (new_long, new_short) if w <= h else (new_short, new_long)


def padding_lrtb(t) -> tuple[int, int, int, int]:
    """``RandomCrop``'s or ``Pad``'s padding as (left, right, top, bottom); v2's RandomCrop
    keeps it so, v1 and ``Pad`` keep the user's form (an int, ``[lr, tb]`` or ``[l, t, r, b]``)."""
    p = t.padding
    if p is None:
        return 0, 0, 0, 0
    if not is_v1(t) and type(t).__name__ != "Pad":
        return tuple(int(v) for v in p)  # type: ignore[return-value]
    if isinstance(p, int):
        return p, p, p, p
    p = [int(v) for v in p]
    if len(p) == 1:
        return p[0], p[0], p[0], p[0]
    if len(p) == 2:
        return p[0], p[0], p[1], p[1]
    return p[0], p[2], p[1], p[3]


def todtype_target(t, kind: str | None):
    """``(known, dtype)`` that ``ToDtype`` / ``ConvertImageDtype`` gives an input of ``kind``.

    ``dtype`` is ``None`` for "no conversion"; raises ``KeyError`` when a dict has no entry.
    """
    d = t.dtype
    if isinstance(d, torch.dtype):
        return True, d
    if kind is None:
        return False, None
    from torchvision import tv_tensors

    cls = tv_tensors.Image if kind == "image" else torch.Tensor
    if cls in d:
        return True, d[cls]
    if "others" in d:
        return True, d["others"]
    raise KeyError(cls.__name__)


def max_value(dtype: torch.dtype) -> float:
    return float(torch.iinfo(dtype).max)


@cache
def resize_refusal(v1: bool, mode, aa: bool, dtype: torch.dtype | None) -> str | None:
    """What torchvision says when it resizes a tensor with this mode, or ``None`` if it can.

    Asked of torchvision itself on a 4 x 4 tensor (its support differs between versions)."""
    if v1:
        from torchvision.transforms import functional as F
    else:
        from torchvision.transforms.v2 import functional as F
    x = torch.zeros(3, 4, 4, dtype=dtype or torch.uint8)
    try:
        F.resize(x, [2, 2], interpolation=mode, antialias=aa)
    except Exception as e:  # e.g. BOX: interpolate() lists the modes it has
        return f"it cannot resize a tensor with it: {type(e).__name__}"
    return None
