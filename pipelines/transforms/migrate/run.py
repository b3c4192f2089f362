"""How the torch backends run the user's Compose: step by step, each error named by its step.

``pinned`` splits the Compose (:func:`split_compose`): the workers run the head on each uint8
image, the GPU runs the tail on the whole batch. The tail is the longest run of per-pixel
format steps at the end (``ToDtype``, ``ConvertImageDtype``, ``Normalize``, ``ToImage``...),
so the head always ends at a fixed size and a dict-form ``ToDtype`` sees the same tensor kind
on the batch as it would on one image.
"""
from __future__ import annotations

from typing import Any

from pipelines.transforms.migrate.errors import TransformError, transform_error

# steps that act on each pixel alike, so they give the same result on a batch
BATCHABLE = ("ToDtype", "ConvertImageDtype", "Normalize", "ToImage", "ToPureTensor", "Identity")


class Steps:
    """A callable run of Compose steps; an exception becomes a ``TransformError`` naming the
    step and its position in the whole Compose (``offset`` + index).

    Args:
        transforms: the steps.
        offset: position of the first step in the user's Compose.
        kind: ``"image"`` when the input must be a ``tv_tensors.Image`` (a tail after
            ``ToImage``); ``"tensor"`` for a plain tensor.
    """

    def __init__(self, transforms: list[Any], offset: int = 0, kind: str = "tensor"):
        self.transforms = list(transforms)
        self.offset = offset
        self.kind = kind

    def __call__(self, x, where: str = ""):
        if self.kind == "image" and self.transforms:
            from torchvision import tv_tensors

            x = tv_tensors.Image(x)
        for i, t in enumerate(self.transforms):
            try:
                x = t(x)
            except TransformError:
                raise
            except Exception as e:
                raise transform_error(self.offset + i, t, e, where) from e
        return x

    def __len__(self) -> int:
        return len(self.transforms)

    def __repr__(self) -> str:
        return f"Steps(#{self.offset}..#{self.offset + len(self) - 1}: {self.transforms})"


def as_steps(transform) -> Steps:
    """``transform`` (a Compose, one transform or ``Steps``) as ``Steps``."""
    if isinstance(transform, Steps):
        return transform
    return Steps(getattr(transform, "transforms", [transform]))


def apply(transform, x, where: str = ""):
    """``transform(x)``, with errors as ``TransformError`` naming the step (see :class:`Steps`)."""
    return as_steps(transform)(x, where)


def split_compose(compose) -> tuple[Steps, Steps]:
    """``(head, tail)`` of ``compose``: the tail is its longest batchable ending (module doc).

    The tail is empty when a step the model does not know comes before it (the kind of tensor
    the batch must be is then unknown).
    """
    from pipelines.transforms.migrate.flow import walk

    steps, _ = walk(compose)
    k = len(steps)
    while k > 0 and steps[k - 1].name in BATCHABLE:
        k -= 1
    kind: str | None = steps[k].before.kind if k < len(steps) else "tensor"
    if kind is None:
        k, kind = len(steps), "tensor"
    ts = [s.t for s in steps]
    return Steps(ts[:k], 0), Steps(ts[k:], k, kind)
