"""Your torchvision transforms, in every backend: accepted, checked, translated for DALI, run.

* :mod:`.forms`: what ``LoaderConfig(transform=...)`` accepts, stored as one flat v2 Compose.
* :mod:`.flow`: what the Compose does to the decoded uint8 image, worked out without running
  it; what torchvision itself would refuse (``InvalidTransformError``, every backend).
* :mod:`.translate`: ``from_torchvision`` -> ``TvPlan`` for DALI, exact or refused
  (``UnsupportedTransformError``); ``DALI_REFUSED`` is the table of refused parameter values.
* :mod:`.run`: how the torch backends run it (``split_compose`` for ``pinned``'s GPU tail, and
  ``TransformError`` naming the step that raised).

Example:
    >>> from torchvision.transforms import v2
    >>> plan = from_torchvision(v2.Compose([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(),
    ...                                     v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
    ...                                     v2.Normalize([0.5] * 3, [0.5] * 3)]))
    >>> [op.kind for op in plan.ops], plan.out_size
    (['random_resized_crop', 'hflip'], (224, 224))
"""
from __future__ import annotations

from pipelines.transforms.migrate.errors import (
    InvalidTransformError,
    Problem,
    TransformError,
    UnsupportedTransformError,
)
from pipelines.transforms.migrate.plan import Op, TvPlan, spec_ops
from pipelines.transforms.migrate.run import Steps, apply, split_compose
from pipelines.transforms.migrate.translate import DALI_REFUSED, SUPPORTED, from_torchvision


def check_transform(transform):
    """What ``LoaderConfig`` stores for ``transform``: a flat v2 Compose that torchvision can run.

    Raises:
        TypeError: not a torchvision transform (one line, naming ``transform``).
        InvalidTransformError: a step torchvision itself would refuse on the uint8 image.
    """
    from pipelines.transforms.migrate.flow import check
    from pipelines.transforms.migrate.forms import as_compose

    compose = as_compose(transform)
    check(compose)
    return compose


def check_output_dtype(transform, dtype) -> None:
    """Refuse a ``transform`` whose float output is not ``LoaderConfig.dtype`` (``dtype``).

    Every backend casts the Compose's output to ``LoaderConfig.dtype``. A Compose ending in
    float32 (the ``ToDtype(torch.float32, scale=True)`` of every recipe) is cast so; one ending
    in another float dtype (a ``ToDtype(torch.bfloat16)``, ``float16``, ``float64``) must end in
    ``LoaderConfig.dtype``, since the cast would silently drop what it asks for. With
    ``dtype="uint8"`` the Compose must end in an integer dtype: a float end is refused.

    Args:
        transform: the flat v2 Compose ``check_transform`` returned (or ``None``).
        dtype: ``LoaderConfig.dtype`` as a ``torch.dtype`` (or an object with ``.torch``).

    Raises:
        ValueError: one line naming the transform's dtype step and ``LoaderConfig.dtype``.
    """
    import torch

    from pipelines.transforms.migrate.flow import walk

    if transform is None:
        return
    want = getattr(dtype, "torch", dtype)
    steps, _ = walk(transform)
    end = steps[-1].after.dtype if steps else None
    if end is None or not end.is_floating_point or \
            want.is_floating_point and end in (torch.float32, want):
        return
    # the step that made the image ``end``: the last whose input was another dtype
    pos = next((st.pos for st in reversed(steps) if st.before.dtype != end), steps[-1].pos)
    name = str(end).replace("torch.", "")
    if want == torch.uint8:
        fix = "end the transform in uint8 (no float ToDtype or Normalize) or set a float dtype"
    elif end in (torch.bfloat16, torch.float16):
        fix = f"set dtype={name!r} or end the transform in that dtype or float32"
    else:
        fix = "end the transform in float32, bfloat16 or float16 (LoaderConfig.dtype's float choices)"
    raise ValueError(f"transform's #{pos} {steps[pos].name} gives {end} images but "
                     f"LoaderConfig.dtype={str(want).replace('torch.', '')!r}: {fix}")


__all__ = ["DALI_REFUSED", "InvalidTransformError", "Op", "Problem", "SUPPORTED", "Steps",
           "TransformError", "TvPlan", "UnsupportedTransformError", "apply", "check_output_dtype",
           "check_transform",
           "from_torchvision", "spec_ops", "split_compose"]
