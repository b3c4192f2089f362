"""``TvPlan``: what the DALI graph runs, from a translated Compose or from ``AugmentSpec``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# how ``Resize`` / ``RandomResizedCrop`` resample: DALI's interpolation and antialias
LINEAR = (("interp", "linear"), ("antialias", True))


@dataclass(frozen=True)
class Op:
    """One translated step. ``kind`` names it; ``args`` holds its parameters."""

    kind: str
    args: tuple[tuple[str, Any], ...] = ()

    def __getitem__(self, key: str) -> Any:
        return dict(self.args)[key]


@dataclass(frozen=True)
class TvPlan:
    """What the DALI backend needs to reproduce a torchvision Compose.

    Attributes:
        ops: the geometric and colour ops in the Compose's order. An ``affine`` op
            (``x -> scale * x + shift`` per channel, to float) stands where a float conversion
            is followed by more geometric ops; before the first one the images are uint8.
        mean, std: the last value map, ``(x - mean) / std``, fused into the output op
            (``(0,0,0)`` / ``(1,1,1)`` when the Compose ends in uint8: float 0..255 out).
        out_size: ``(H, W)`` of every output image.
    """

    ops: tuple[Op, ...]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    out_size: tuple[int, int]


def spec_ops(spec) -> TvPlan:
    """The ``AugmentSpec`` as a plan (the built-in recipe, without a user Compose). Its sizes
    are fed with each sample (``("fed", "hw")``: the output size, ``("fed", "resize")``: the
    eval resize; ``pipelines.dali.draws.out_size``), so one graph serves every size that
    ``set_resolution`` sets; ``size`` holds the spec's own."""
    from pipelines.transforms.spec import Mode

    if spec.mode is Mode.TRAIN:
        ops = (Op("random_resized_crop", (("size", spec.hw), ("scale", spec.scale),
                                          ("ratio", spec.ratio),
                                          *LINEAR, ("fed", "hw"))),
               Op("hflip", (("p", spec.flip_p),)))
    else:
        ops = (Op("resize_shorter", (("size", spec.resize_size), ("max_size", None), *LINEAR,
                                     ("fed", "resize"))),
               Op("center_crop", (("size", spec.hw), ("fed", "hw"))))
    return TvPlan(ops, spec.mean_255, spec.std_255, spec.hw)
