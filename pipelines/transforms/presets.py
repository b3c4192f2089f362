"""Ready-made training recipes, each a torchvision v2 ``Compose`` (no new DSL).

Give one to ``LoaderConfig(transform=...)``, or to the suite:
``python -m compare --transform "pipelines.transforms.presets:torchvision_ref(auto_augment='ta_wide',
random_erase=0.1)" --mix "mixup=0.2,cutmix=1.0"``. MixUp and CutMix act on batches, so they are
``LoaderConfig(mix=...)`` (``pipelines.transforms.mix``), not part of these.

The loader hands each transform a decoded ``uint8`` ``3 x H x W`` tensor, so the recipes start
where torchvision's tensor backend starts (no ``PILToTensor``) and end with the normalised float
image (no ``ToPureTensor``). The torch backends run them as they are; which steps ``dali`` can
translate is the migration table in the README (``pipelines.transforms.migrate``).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torchvision.transforms import v2

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
AUTO_AUGMENT = ("ra", "ta_wide", "augmix", "imagenet", "cifar10", "svhn")


def _interp(name: str) -> v2.InterpolationMode:
    try:
        return v2.InterpolationMode(name)
    except ValueError:
        raise ValueError(f"interpolation={name!r}: choose one of "
                         f"{[m.value for m in v2.InterpolationMode]}") from None


def torchvision_ref(crop_size: int = 224, *, auto_augment: str | None = None,
                    random_erase: float = 0.0, hflip_prob: float = 0.5,
                    interpolation: str = "bilinear", ra_magnitude: int = 9,
                    augmix_severity: int = 3, mean: Sequence[float] = IMAGENET_MEAN,
                    std: Sequence[float] = IMAGENET_STD) -> v2.Compose:
    """torchvision's classification reference, ``ClassificationPresetTrain`` of
    ``references/classification/presets.py`` (tensor backend, v2), step for step.

    Args:
        auto_augment: ``None``, ``"ra"`` (RandAugment, ``ra_magnitude``), ``"ta_wide"``
            (TrivialAugmentWide), ``"augmix"`` (``augmix_severity``), or an AutoAugment policy
            (``"imagenet"``, ``"cifar10"``, ``"svhn"``); the reference's ``--auto-augment``.
        random_erase: RandomErasing's probability (``--random-erase``); 0 leaves it out.
        the rest: as the reference's arguments of the same names.
    """
    mode = _interp(interpolation)
    steps = [v2.RandomResizedCrop(crop_size, interpolation=mode, antialias=True)]
    if hflip_prob > 0:
        steps.append(v2.RandomHorizontalFlip(hflip_prob))
    if auto_augment is not None:
        if auto_augment == "ra":
            steps.append(v2.RandAugment(interpolation=mode, magnitude=ra_magnitude))
        elif auto_augment == "ta_wide":
            steps.append(v2.TrivialAugmentWide(interpolation=mode))
        elif auto_augment == "augmix":
            steps.append(v2.AugMix(interpolation=mode, severity=augmix_severity))
        elif auto_augment in AUTO_AUGMENT:
            steps.append(v2.AutoAugment(policy=v2.AutoAugmentPolicy(auto_augment),
                                        interpolation=mode))
        else:
            raise ValueError(f"auto_augment={auto_augment!r}: choose one of {AUTO_AUGMENT} "
                             "or None")
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean=mean, std=std)]
    if random_erase > 0:
        steps.append(v2.RandomErasing(p=random_erase))
    return v2.Compose(steps)


def timm_like(crop_size: int = 224, *, color_jitter: float = 0.4, auto_augment: bool = True,
              ra_num_ops: int = 2, ra_magnitude: int = 9, re_prob: float = 0.25,
              hflip_prob: float = 0.5, mean: Sequence[float] = IMAGENET_MEAN,
              std: Sequence[float] = IMAGENET_STD) -> v2.Compose:
    """The shape of timm's ``transforms_imagenet_train`` with torchvision's ops: random resized
    crop (scale 0.08 to 1, bicubic), flip, then RandAugment (``rand-m9-n2``; timm uses its own
    RandAugment, whose op set and magnitude noise differ) or, with ``auto_augment=False``,
    ColorJitter; normalise; RandomErasing with per-pixel random values (timm's
    ``mode='pixel'``)."""
    bicubic = v2.InterpolationMode.BICUBIC
    steps = [v2.RandomResizedCrop(crop_size, scale=(0.08, 1.0), interpolation=bicubic,
                                  antialias=True)]
    if hflip_prob > 0:
        steps.append(v2.RandomHorizontalFlip(hflip_prob))
    if auto_augment:
        steps.append(v2.RandAugment(num_ops=ra_num_ops, magnitude=ra_magnitude,
                                    interpolation=bicubic))
    elif color_jitter > 0:
        steps.append(v2.ColorJitter(color_jitter, color_jitter, color_jitter))
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean=mean, std=std)]
    if re_prob > 0:
        steps.append(v2.RandomErasing(p=re_prob, value="random"))
    return v2.Compose(steps)
