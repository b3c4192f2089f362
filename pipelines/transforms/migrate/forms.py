"""Accept what users pass as ``transform=`` and store it as one flat torchvision v2 ``Compose``.

Accepted: a v2 ``Compose``, a single v2 transform, an ``nn.Sequential`` of transforms, a v1
``torchvision.transforms.Compose``, a single v1 transform, and these nested in one another
(they are flattened, so a position in a message counts the flattened steps). v1 transforms are
kept as they are, since they run on tensors, except the two that take only PIL images:
``ToTensor`` becomes ``v2.ToDtype(torch.float32, scale=True)``, which is what it does to the
uint8 image, and ``PILToTensor`` becomes ``v2.Identity()``, because the loaders already hand
the Compose a uint8 ``3 x H x W`` tensor.

Example:
    >>> import torchvision.transforms as T
    >>> as_compose(T.Compose([T.CenterCrop(8), T.ToTensor()])).transforms
    [CenterCrop(size=(8, 8)), ToDtype(scale=True)]
"""
from __future__ import annotations

import torch

V1_MODULE = "torchvision.transforms.transforms"


def is_v1(t) -> bool:
    """True for a transform class of the v1 API (``torchvision.transforms``)."""
    return type(t).__module__ == V1_MODULE


def _short(x) -> str:
    r = repr(x).splitlines()[0] if repr(x) else type(x).__name__
    return r if len(r) <= 60 else r[:57] + "..."


def _is_transform(t) -> bool:
    from torchvision.transforms import v2

    return isinstance(t, (v2.Transform, torch.nn.Sequential)) or is_v1(t)


def _children(t):
    """The steps of a container (v2 / v1 Compose, nn.Sequential), or ``None``."""
    from torchvision.transforms import Compose as V1Compose
    from torchvision.transforms import v2

    if isinstance(t, (v2.Compose, V1Compose)):
        return list(t.transforms)
    if isinstance(t, torch.nn.Sequential):
        return list(t)
    return None


def _flatten(t, out: list) -> None:
    kids = _children(t)
    if kids is None:
        if not callable(t):
            raise TypeError(f"transform step #{len(out)} {_short(t)} is not callable; every step "
                            f"of transform must be a torchvision transform")
        out.append(_replace_pil_only(t))
        return
    for k in kids:
        _flatten(k, out)


def _replace_pil_only(t):
    from torchvision.transforms import v2

    if is_v1(t) and type(t).__name__ == "ToTensor":
        return v2.ToDtype(torch.float32, scale=True)
    if is_v1(t) and type(t).__name__ == "PILToTensor":
        return v2.Identity()
    return t


def as_compose(transform):
    """``transform`` as a flat ``torchvision.transforms.v2.Compose`` (itself if already one).

    Raises:
        TypeError: ``transform`` is not one of the accepted forms, or a step is not callable.
        ValueError: it has no steps.
    """
    from torchvision.transforms import v2

    if not _is_transform(transform):
        raise TypeError(
            f"transform={_short(transform)} must be a torchvision transform: a v2.Compose, an "
            f"nn.Sequential of transforms, a v1 transforms.Compose, or a single transform")
    steps: list = []
    _flatten(transform, steps)
    if not steps:
        raise ValueError(f"transform={_short(transform)} has no steps")
    if isinstance(transform, v2.Compose) and len(steps) == len(transform.transforms) \
            and all(a is b for a, b in zip(steps, transform.transforms)):
        return transform  # already flat: keep the user's object (and config equality)
    return v2.Compose(steps)
