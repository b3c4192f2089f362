"""``pipelines.transforms.presets``: the reference recipes as v2 Composes, and the suite's call syntax."""
from __future__ import annotations

import pytest
import torch
from torchvision.transforms import v2

from pipelines import LoaderConfig, MixSpec, UnsupportedTransformError, create_loader
from pipelines.transforms.presets import timm_like, torchvision_ref


def _names(c):
    return [type(t).__name__ for t in c.transforms]


@pytest.mark.parametrize("policy, cls, attr, value", [
    ("ra", "RandAugment", "magnitude", 9),
    ("ta_wide", "TrivialAugmentWide", "num_magnitude_bins", 31),
    ("augmix", "AugMix", "severity", 3),
    ("imagenet", "AutoAugment", "policy", v2.AutoAugmentPolicy.IMAGENET),
])
def test_torchvision_ref_is_the_reference_preset(policy, cls, attr, value):
    c = torchvision_ref(auto_augment=policy, random_erase=0.1)
    assert _names(c) == ["RandomResizedCrop", "RandomHorizontalFlip", cls, "ToDtype",
                         "Normalize", "RandomErasing"]
    assert getattr(c.transforms[2], attr) == value
    rrc = c.transforms[0]
    assert rrc.size == (224, 224) and rrc.antialias and rrc.scale == (0.08, 1.0)
    assert c.transforms[-1].p == 0.1 and c.transforms[-2].mean == [0.485, 0.456, 0.406]
    assert _names(torchvision_ref(hflip_prob=0)) == ["RandomResizedCrop", "ToDtype", "Normalize"]


def test_bad_recipe_arguments_are_named():
    with pytest.raises(ValueError, match="auto_augment='rand'"):
        torchvision_ref(auto_augment="rand")
    with pytest.raises(ValueError, match="interpolation='cubic'"):
        torchvision_ref(interpolation="cubic")


def test_timm_like():
    c = timm_like()
    assert _names(c) == ["RandomResizedCrop", "RandomHorizontalFlip", "RandAugment", "ToDtype",
                         "Normalize", "RandomErasing"]
    ra, er = c.transforms[2], c.transforms[-1]
    assert (ra.num_ops, ra.magnitude) == (2, 9)
    assert ra.interpolation == v2.InterpolationMode.BICUBIC and er.p == 0.25
    assert er.value is None  # per-pixel random values, timm's mode="pixel"
    assert "ColorJitter" in _names(timm_like(auto_augment=False))


def test_the_suite_calls_a_recipe_with_literal_arguments():
    from compare.suite import load_transform

    t = load_transform("pipelines.transforms.presets:torchvision_ref(auto_augment='ta_wide', "
                       "random_erase=0.1)")
    assert "TrivialAugmentWide" in _names(t) and t.transforms[-1].p == 0.1
    assert "RandAugment" in _names(load_transform("pipelines.transforms.presets:timm_like"))
    for ref, msg in (("pipelines.transforms.presets:torchvision_ref(auto_augment=ta)", "not NAME"),
                     ("pipelines.transforms.presets:torchvision_ref(nope=1)", "calling torchvision_ref"),
                     ("pipelines.transforms.presets:IMAGENET_MEAN(x=1)", "not a function")):
        with pytest.raises(ValueError, match=msg):
            load_transform(ref)


@pytest.mark.parametrize("backend", ["pinned", "pageable"])
def test_the_torch_backends_run_the_reference_recipe_with_mixing(backend, tiny_root):
    cfg = LoaderConfig(root=tiny_root, batch_size=4, device="cpu", num_workers=1,
                       transform=torchvision_ref(64, auto_augment="ta_wide", random_erase=0.5),
                       mix=MixSpec(mixup_alpha=0.2, cutmix_alpha=1.0))
    with create_loader(backend, cfg) as ld:
        x, y = next(iter(ld))
    assert x.shape == (4, 3, 64, 64) and x.dtype == torch.float32
    assert y.shape == (4, 3) and torch.allclose(y.sum(1), torch.ones(4))


@pytest.mark.dali
def test_dali_runs_the_reference_policies_and_names_what_it_cannot_translate(tiny_root):
    cfg = LoaderConfig(root=tiny_root, batch_size=4, device="cpu", num_workers=1,
                       transform=torchvision_ref(64, auto_augment="ta_wide", random_erase=0.5),
                       mix=MixSpec(mixup_alpha=0.2, cutmix_alpha=1.0))
    with create_loader("dali", cfg) as ld:
        x, y = next(iter(ld))
    assert x.shape == (4, 3, 64, 64) and y.shape == (4, 3)
    for policy in ("ra", "imagenet"):
        with create_loader("dali", cfg.replace(transform=torchvision_ref(
                64, auto_augment=policy))) as ld:
            assert next(iter(ld))[0].shape == (4, 3, 64, 64)
    with pytest.raises(UnsupportedTransformError, match="AugMix"):
        create_loader("dali", cfg.replace(transform=torchvision_ref(64, auto_augment="augmix")))
