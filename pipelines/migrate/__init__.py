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

from .errors import InvalidTransformError, Problem, TransformError, UnsupportedTransformError
from .plan import Op, TvPlan, spec_ops
from .run import Steps, apply, split_compose
from .translate import DALI_REFUSED, SUPPORTED, from_torchvision


def check_transform(transform):
    """What ``LoaderConfig`` stores for ``transform``: a flat v2 Compose that torchvision can run.

    Raises:
        TypeError: not a torchvision transform (one line, naming ``transform``).
        InvalidTransformError: a step torchvision itself would refuse on the uint8 image.
    """
    from .flow import check
    from .forms import as_compose

    compose = as_compose(transform)
    check(compose)
    return compose


__all__ = ["DALI_REFUSED", "InvalidTransformError", "Op", "Problem", "SUPPORTED", "Steps",
           "TransformError", "TvPlan", "UnsupportedTransformError", "apply", "check_transform",
           "from_torchvision", "spec_ops", "split_compose"]
