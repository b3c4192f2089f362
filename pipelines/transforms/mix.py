"""Batch-level MixUp and CutMix on the device, the same for every backend.

``LoaderConfig(mix=MixSpec(...))`` (or torchvision v2's ``MixUp``, ``CutMix`` or a
``RandomChoice`` of the two) mixes each batch after it lands on the device, in
``LoaderBase.__iter__``: one code path for ``pageable``, ``pinned`` and ``dali``, so the three
mix identically given the same images. ``Batch.labels`` is then a float32 ``N x C`` tensor of
soft targets (each row sums to 1), which ``torch.nn.functional.cross_entropy`` takes as it is.
With ``LoaderConfig(target="multilabel")`` the float32 multi-hot rows are mixed as they are, with
the same ``lam`` and box: row ``i`` becomes ``lam * y_i + (1 - lam) * y_(i-1)``, so it sums to
``lam * k_i + (1 - lam) * k_(i-1)`` for ``k`` labels per row (``BCEWithLogitsLoss`` takes it).

NOTE [the rule, as torchvision's]
Per batch, with the random draws below: the partner of image ``i`` is image ``i - 1`` (the
batch rolled by one). MixUp draws ``lam ~ Beta(a, a)`` and gives ``lam * x + (1 - lam) *
partner``. CutMix draws ``lam ~ Beta(a, a)``, a centre ``(r_x, r_y)`` uniform over the pixels
and half-sides ``int(r * W)``, ``int(r * H)`` with ``r = sqrt(1 - lam) / 2``; the box, clipped
to the image, is pasted from the partner and ``lam`` becomes ``1 - box area / image area``. The
labels mix with the same ``lam``. With both on, CutMix is chosen with ``switch_prob``
(``RandomChoice([MixUp, CutMix])``: 0.5); ``prob`` is the chance a batch is mixed at all;
``label_smoothing`` smooths the one-hot targets first (timm's ``Mixup``): ``y * (1 - s) + s / C``,
the same formula for multi-hot rows (which then sum to ``k * (1 - s) + s``).

NOTE [random draws]
The draws come from ``numpy.random.default_rng((seed, epoch, rank, position))``, position being
the batch's place in the rank's epoch: independent of the backend, the worker count and the
device, and reproduced exactly by a resumed loader (``state_dict``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class MixSpec:
    """Batch mixing (module NOTE [the rule]). Invalid values raise ``ValueError`` naming them.

    Args:
        mixup_alpha: MixUp's Beta parameter; 0 turns MixUp off.
        cutmix_alpha: CutMix's Beta parameter; 0 turns CutMix off.
        switch_prob: with both on, the chance a batch gets CutMix rather than MixUp.
        prob: the chance a batch is mixed at all (its labels still become soft targets).
        label_smoothing: smoothing of the one-hot targets, in ``[0, 1)``.
        num_classes: the width of the targets; ``None``: the dataset's class count. A number
            that differs from the dataset's is refused when the loader is built.
    """

    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    switch_prob: float = 0.5
    prob: float = 1.0
    label_smoothing: float = 0.0
    num_classes: int | None = None

    def __post_init__(self) -> None:
        for k in ("mixup_alpha", "cutmix_alpha"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 \
                    or math.isinf(v):
                raise ValueError(f"{k}={v!r} must be a finite number >= 0 (0 turns it off)")
        if self.mixup_alpha == 0 and self.cutmix_alpha == 0:
            raise ValueError("mixup_alpha=0 and cutmix_alpha=0: turn at least one on, or pass "
                             "mix=None")
        for k, hi in (("switch_prob", 1.0), ("prob", 1.0)):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= hi:
                raise ValueError(f"{k}={v!r} must be a number in [0, 1]")
        v = self.label_smoothing
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
            raise ValueError(f"label_smoothing={v!r} must be a number in [0, 1)")
        if self.num_classes is not None and (isinstance(self.num_classes, bool) or not isinstance(
                self.num_classes, int) or self.num_classes < 2):
            raise ValueError(f"num_classes={self.num_classes!r} must be an int >= 2")


def as_mix_spec(mix: Any) -> MixSpec | None:
    """``LoaderConfig.mix`` as a ``MixSpec``: ``None``, a ``MixSpec``, or torchvision v2's
    ``MixUp`` / ``CutMix`` / ``RandomChoice([MixUp, CutMix])`` with their parameters.

    Raises:
        TypeError: anything else.
        ValueError: a torchvision mix this cannot reproduce (naming the parameter).
    """
    if mix is None or isinstance(mix, MixSpec):
        return mix
    name = type(mix).__name__
    if name in ("MixUp", "CutMix"):
        return MixSpec(**_one(mix), num_classes=getattr(mix, "num_classes", None))
    if name == "RandomChoice":
        parts = [_one(t) for t in mix.transforms]
        kinds = [type(t).__name__ for t in mix.transforms]
        if sorted(kinds) != ["CutMix", "MixUp"]:
            raise ValueError(f"mix=RandomChoice of {kinds}: only a RandomChoice of one MixUp "
                             "and one CutMix is a batch mix")
        p = list(getattr(mix, "p", None) or [1.0, 1.0])
        p_cut = p[kinds.index("CutMix")] / float(sum(p))
        ncls = {getattr(t, "num_classes", None) for t in mix.transforms}
        if len(ncls) > 1:
            raise ValueError(f"mix=RandomChoice: MixUp and CutMix give num_classes {ncls}")
        merged = {k: v for d in parts for k, v in d.items()}
        return MixSpec(**merged, switch_prob=p_cut, num_classes=ncls.pop())
    raise TypeError(f"mix={mix!r} must be a MixSpec, or torchvision.transforms.v2 MixUp, CutMix "
                    "or RandomChoice([MixUp(...), CutMix(...)])")


def _one(t) -> dict:
    name = type(t).__name__
    if name not in ("MixUp", "CutMix"):
        raise ValueError(f"mix: {name} is not MixUp or CutMix")
    getter = getattr(t, "_labels_getter", getattr(t, "labels_getter", None))
    if getter is not None and "default" not in getattr(getter, "__name__", ""):
        raise ValueError(f"mix={name}(labels_getter=...): the loader mixes its own labels; "
                         "leave labels_getter at its default")
    alpha = float(t.alpha)
    return {"mixup_alpha": alpha} if name == "MixUp" else {"cutmix_alpha": alpha}


def mix_rng(seed: int, epoch: int, rank: int, position: int) -> np.random.Generator:
    """The draws of one batch (module NOTE [random draws])."""
    return np.random.default_rng((seed & 0xFFFFFFFF, epoch, rank, position, 0x313C))


def soft_targets(labels: torch.Tensor, num_classes: int, smoothing: float) -> torch.Tensor:
    """One-hot float32 ``N x C`` of class ids, or float multi-hot ``N x C`` rows as they are,
    smoothed (module NOTE [the rule])."""
    if labels.dim() == 2:
        y = labels.to(torch.float32, copy=True)
    else:
        y = torch.nn.functional.one_hot(labels.long(), num_classes).to(torch.float32)
    if smoothing:
        y = y * (1.0 - smoothing) + smoothing / num_classes
    return y


def cutmix_box(h: int, w: int, lam: float, rng: np.random.Generator
               ) -> tuple[int, int, int, int]:
    """``(y1, y2, x1, x2)`` of CutMix's box for ``lam`` (module NOTE [the rule])."""
    r_x, r_y = int(rng.integers(0, w)), int(rng.integers(0, h))
    r = 0.5 * math.sqrt(1.0 - lam)
    hw, hh = int(r * w), int(r * h)
    return max(r_y - hh, 0), min(r_y + hh, h), max(r_x - hw, 0), min(r_x + hw, w)


def mix_batch(images: torch.Tensor, labels: torch.Tensor, spec: MixSpec, num_classes: int,
              rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mixed images, soft targets)`` of one ``N x C x H x W`` batch (module NOTEs); the
    images keep their dtype, device and memory format."""
    y = soft_targets(labels, num_classes, spec.label_smoothing)
    if spec.prob < 1.0 and rng.random() >= spec.prob:
        return images, y
    cut = spec.cutmix_alpha > 0 and (spec.mixup_alpha == 0 or rng.random() < spec.switch_prob)
    alpha = spec.cutmix_alpha if cut else spec.mixup_alpha
    lam = float(rng.beta(alpha, alpha))
    partner = images.roll(1, 0)
    if cut:
        h, w = images.shape[-2:]
        y1, y2, x1, x2 = cutmix_box(h, w, lam, rng)
        out = images.clone(memory_format=torch.preserve_format)
        out[..., y1:y2, x1:x2] = partner[..., y1:y2, x1:x2]
        lam = 1.0 - (y2 - y1) * (x2 - x1) / float(h * w)
    else:
        out = images.mul(lam).add_(partner, alpha=1.0 - lam)
    return out, y.mul(lam).add_(y.roll(1, 0), alpha=1.0 - lam)
