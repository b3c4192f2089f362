"""torchvision's ``RandomApply`` and ``RandomChoice`` over translated steps, as DALI conditionals.

Each image draws its own coin (``RandomApply``: the steps run with probability ``p``) or its own
branch (``RandomChoice``: one step, drawn with ``p``), as torchvision draws per call, that is
per image in the loaders. The inner steps are plan ops (``pipelines.transforms.migrate.translate``), run
by their registry builders inside the branch; the pipeline runs with conditional execution.
"""
from __future__ import annotations

from nvidia.dali.auto_aug.core import select

from pipelines.dali import draws
from pipelines.transforms.migrate import Op
from pipelines.transforms.migrate.ops import build


def _all(images, ops):
    for op in ops:
        images = build(images, op)
    return images


def random_apply(images, op: Op):
    """The inner ops with probability ``p``, else the image as it is."""
    if draws.coin(op["p"]) > 0.5:
        images = _all(images, op["ops"])
    return images


def random_choice(images, op: Op):
    """One inner op per image, drawn with the probabilities ``p``."""
    branches = op["ops"]
    k = draws.choice(list(op["p"]))
    fns = [lambda x, inner=(o,): _all(x, inner) for o in branches]
    # select calls each branch as branch(images); DALI types its list as Augmentation objects only
    return select(fns, k, images)  # type: ignore[arg-type]
