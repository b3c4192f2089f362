"""TrivialAugmentWide, RandAugment and AutoAugment on DALI (``pipelines.dali.autoaug``) against
torchvision: each op at fixed magnitudes, the magnitude tables, the draws end to end, and what
is refused."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms import v2

from pipelines import (
    InvalidTransformError,
    LoaderConfig,
    UnsupportedTransformError,
    create_loader,
    from_torchvision,
)
from tests.utils import ks, one_image_copies

pytestmark = pytest.mark.dali
NAMES = ["Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness",
         "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize",
         "Invert"]


@pytest.fixture(scope="module")
def images(tiny_root):
    files = sorted(tiny_root.glob("class_*/*.jpg"))[:8]
    return [v2.functional.center_crop(decode_image(str(f), mode=ImageReadMode.RGB), [40, 48])
            for f in files]


def dali_op(images, k: int, param, interp="nearest", gpu: bool = False):
    """Op ``k`` of the suite with a fixed parameter, on DALI's CPU operators (or the GPU's)."""
    from nvidia.dali import fn, pipeline_def

    from pipelines.dali.autoaug import INTERP, suite, tables

    hwc = [np.ascontiguousarray(i.permute(1, 2, 0).numpy()) for i in images]
    arr = np.array(param, dtype=np.uint8 if isinstance(param, np.uint8) else np.float32)

    @pipeline_def(batch_size=len(hwc), num_threads=1, device_id=0 if gpu else None)
    def pipe():
        x = fn.external_source(source=lambda: hwc, batch=True, layout="HWC")
        p = fn.external_source(source=lambda: [arr] * len(hwc), batch=True)
        aug = suite(tables("AutoAugment", 31, 40, 48), INTERP[interp], 0.0)[NAMES[k]] \
            if NAMES[k] == "Invert" else \
            suite(tables("TrivialAugmentWide", 31), INTERP[interp], 0.0)[NAMES[k]]
        if gpu:
            x = x.gpu()
            if aug.param_device == "auto":
                p = p.gpu()
        return aug.op(x, p)

    p = pipe()
    p.build()
    out = p.run()[0]
    return [np.array(o) for o in (out.as_cpu() if gpu else out)]


def torchvision_op(images, k: int, magnitude, interp="nearest"):
    ta = v2.AutoAugment() if NAMES[k] == "Invert" else v2.TrivialAugmentWide()
    mode = v2.InterpolationMode(interp)
    return [ta._apply_image_or_video_transform(i, NAMES[k], magnitude, interpolation=mode,
                                               fill={"others": None}).permute(1, 2, 0).numpy()
            for i in images]


def diff(a, b) -> np.ndarray:
    return np.concatenate([np.abs(x.astype(int) - y.astype(int)).ravel() for x, y in zip(a, b)])


# (op, DALI's parameter, torchvision's magnitude): every op, signed both ways where it is signed
EXACT = [(0, 0.0, 0.0), (1, 0.3, 0.3), (2, -0.45, -0.45), (3, 13.0, 13.7), (3, -7.0, -7.9),
         (4, 21.0, 21.2), (5, 30.0, 30.0), (5, -100.5, -100.5), (6, 0.5, 0.5), (6, -0.4, -0.4),
         (8, 0.6, 0.6), (8, -0.5, -0.5), (9, -0.66, -0.66), (10, np.uint8(0b11100000), 3.0),
         (11, 255 * 0.4, 0.4), (12, 0.0, 0.0), (14, 0.0, 0.0)]
WITHIN_ONE = [(7, 0.7, 0.7), (7, -0.9, -0.9), (9, 0.8, 0.8)]  # a float rounding apart


@pytest.mark.parametrize("k, param, magnitude", EXACT)
def test_each_op_computes_what_torchvision_computes(images, k, param, magnitude):
    d = diff(dali_op(images, k, param), torchvision_op(images, k, magnitude))
    assert d.max() == 0, NAMES[k]


@pytest.mark.parametrize("k, param, magnitude", WITHIN_ONE)
def test_blends_are_within_one_level(images, k, param, magnitude):
    d = diff(dali_op(images, k, param), torchvision_op(images, k, magnitude))
    assert d.max() <= 1 and d.mean() < 0.05, NAMES[k]


def test_bilinear_warps_are_close(images):
    d = diff(dali_op(images, 5, 17.0, "bilinear"), torchvision_op(images, 5, 17.0, "bilinear"))
    assert d.mean() < 2.0


def test_a_wrong_magnitude_is_told_apart(images):
    for k, param, magnitude in [(1, 0.3, 0.35), (6, 0.5, 0.45), (5, 30.0, -30.0)]:
        assert diff(dali_op(images, k, param), torchvision_op(images, k, magnitude)).max() > 1


def test_nearest_shear_differs_only_where_a_point_falls_between_two_pixels(images):
    # x_in = x + 0.5 - 0.6 (y + 0.5) is a whole number (a tie) where 0.6 (y + 0.5) ends in .5
    a, b = dali_op(images, 1, -0.6), torchvision_op(images, 1, -0.6)
    rows = {int(y) for x, z in zip(a, b) for y in np.nonzero((x != z).any(2).any(1))[0]}
    assert rows and all(abs((0.6 * (y + 0.5)) % 1.0 - 0.5) < 1e-6 for y in rows)


def cv_equalize(img: torch.Tensor) -> torch.Tensor:
    """OpenCV's ``equalizeHist`` per channel of a uint8 CHW image: ``round((cdf - cdf_min) *
    255 / (N - cdf_min))``."""
    out = img.clone()
    for c in range(img.shape[0]):
        x = img[c].flatten().long()
        hist = torch.bincount(x, minlength=256)
        cdf = hist.cumsum(0)
        low = cdf[hist.nonzero()[0, 0]]
        if x.numel() > low:
            lut = torch.round((cdf - low).double() * 255.0 / (x.numel() - low))
            out[c] = lut.clamp(0, 255).to(torch.uint8)[x].view(img.shape[1:])
    return out


def test_equalize_is_opencvs_rule_and_its_distance_from_torchvision_is_bounded(images):
    """The documented difference: DALI's histogram equalisation is OpenCV's rule exactly, not
    torchvision's PIL-style table; both flatten the histogram, their outputs differ by tens of
    levels."""
    a, b = dali_op(images, 13, 0.0), torchvision_op(images, 13, 0.0)
    assert diff(a, [cv_equalize(i).permute(1, 2, 0).numpy() for i in images]).max() == 0
    d = diff(a, b)
    assert 5 < d.mean() < 60
    def from_uniform(img) -> float:  # the worst channel's KS distance to uniform levels
        return max(float(np.max(np.abs(np.searchsorted(np.sort(img[..., c].ravel()),
                                                       np.arange(256), side="right")
                                       / img[..., c].size - np.arange(1, 257) / 256)))
                   for c in range(3))

    for x, y, src in zip(a, b, images):  # both bring every channel's levels near uniform
        s = from_uniform(src.permute(1, 2, 0).numpy())
        assert from_uniform(x) < s and from_uniform(y) < s


@pytest.mark.parametrize("policy, bins", [("TrivialAugmentWide", 31), ("RandAugment", 31),
                                          ("AutoAugment", 10)])
def test_every_bin_has_torchvisions_magnitude(policy, bins):
    from pipelines.dali.autoaug import INTERP, suite, tables

    h, w = 40, 56  # RandAugment's and AutoAugment's translations scale with the size
    space = getattr(v2, policy)()._AUGMENTATION_SPACE
    augs = suite(tables(policy, bins, h, w), INTERP["nearest"], 0.0)
    assert list(augs) == list(space)
    for name, aug in augs.items():
        fn, signed = space[name]
        want = fn(bins, h, w)
        if want is None:
            assert aug.mag_range is None, name
            continue
        assert aug.randomly_negate == signed, name
        for b in range(bins):
            v = float(want[b])
            got, neg = float(aug.mag_to_param(float(b))), float(aug.mag_to_param(-float(b)))
            if name == "Posterize":
                assert int(got) == ((1 << int(v)) - 1) << (8 - int(v)), b
            elif name.startswith("Translate"):
                assert got == math.trunc(v) and (not signed or neg == -math.trunc(v)), b
            elif name == "Solarize":
                assert math.isclose(got, 255.0 * v, rel_tol=1e-6), b
            else:
                assert math.isclose(got, v, rel_tol=1e-6, abs_tol=1e-7), (name, b)
                assert not signed or math.isclose(neg, -v, rel_tol=1e-6, abs_tol=1e-7)


@pytest.fixture(scope="module")
def copies(tmp_path_factory, tiny_root):
    return one_image_copies(tiny_root, tmp_path_factory.mktemp("ta"))


def _stats(backend, root, t, epochs=10):
    """Per sample: its mean level and its left half's mean minus its right half's."""
    cfg = LoaderConfig(root=root, batch_size=64, device="cpu", num_workers=2, transform=t,
                       seed=5)
    out = []
    with create_loader(backend, cfg) as ld:
        for e in range(epochs):
            ld.set_epoch(e)
            for x, _ in ld:
                for img in x:
                    half = img.shape[-1] // 2
                    out.append((float(img.mean()),
                                float(img[..., :half].mean() - img[..., half:].mean())))
    return np.array(out)


@pytest.mark.parametrize("policy, wrong", [
    (v2.TrivialAugmentWide(), v2.TrivialAugmentWide(num_magnitude_bins=2)),
    (v2.RandAugment(), v2.RandAugment(num_ops=1, magnitude=2)),
    (v2.AutoAugment(), v2.AutoAugment(v2.AutoAugmentPolicy.SVHN)),
], ids=["ta_wide", "rand", "auto"])
def test_the_draws_match_torchvision_end_to_end(copies, policy, wrong, monkeypatch):
    """The draws, with the documented Equalize difference taken out: torchvision's workers
    equalise by OpenCV's rule here, as DALI does."""
    monkeypatch.setattr(v2.functional, "equalize", cv_equalize)
    t = v2.Compose([v2.CenterCrop((40, 48)), policy])
    d, tv = _stats("dali", copies, t), _stats("pageable", copies, t)
    crit = 1.949 * math.sqrt(2 / len(d))
    assert ks(d[:, 0], tv[:, 0]) < crit and ks(d[:, 1], tv[:, 1]) < crit
    # a counter-example: torchvision with other parameters draws otherwise
    other = _stats("pageable", copies, v2.Compose([v2.CenterCrop((40, 48)), wrong]))
    assert max(ks(other[:, 0], d[:, 0]), ks(other[:, 1], d[:, 1])) > crit


@pytest.mark.parametrize("policy, workers, given, want", [
    (v2.TrivialAugmentWide(), 2, None, 2),   # a conditional graph: two pipelines by default
    (v2.TrivialAugmentWide(), 1, None, 1),   # one thread cannot be split
    (v2.TrivialAugmentWide(), 2, 1, 1),      # an explicit choice stands
    (v2.RandomHorizontalFlip(), 2, None, 1),  # no conditional execution: one pipeline
])
def test_the_default_pipelines_follow_the_graph(tiny_root, policy, workers, given, want):
    from pipelines import DaliOptions

    t = v2.Compose([v2.RandomResizedCrop(32), policy])
    cfg = LoaderConfig(root=tiny_root, batch_size=8, device="cpu", num_workers=workers,
                       transform=t, debug_indices=True)
    with create_loader("dali", cfg, options=DaliOptions(pipelines=given)) as ld:
        assert ld.options.pipelines == want and len(ld.pipes) == want
        seen = [i for _ in ld for i in ld.last_batch_indices.tolist()]
    assert sorted(seen) == list(range(37))  # every sample once, in either case


def test_what_dali_refuses_is_named():
    base = [v2.RandomResizedCrop(32)]
    for t, msg in ((v2.TrivialAugmentWide(interpolation=v2.InterpolationMode.BICUBIC),
                    "interpolation='bicubic'"),
                   (v2.TrivialAugmentWide(fill=[1, 2, 3]), "fill=")):
        with pytest.raises(UnsupportedTransformError, match=msg):
            from_torchvision(v2.Compose([*base, t]))
    with pytest.raises(InvalidTransformError, match="num_magnitude_bins=1"):  # torchvision's
        from_torchvision(v2.Compose([*base, v2.TrivialAugmentWide(num_magnitude_bins=1)]))
    after = v2.Compose([*base, v2.ToDtype(torch.float32, scale=True), v2.TrivialAugmentWide()])
    with pytest.raises(UnsupportedTransformError, match="TrivialAugmentWide"):
        from_torchvision(after)
    ops = from_torchvision(v2.Compose([*base, v2.TrivialAugmentWide(fill=9)])).ops
    assert ops[-1].kind == "trivial_augment" and ops[-1]["fill"] == 9.0
    for t in (v2.RandAugment(), v2.AutoAugment()):  # they need the size their shifts scale with
        with pytest.raises(UnsupportedTransformError, match="share of the image size"):
            from_torchvision(v2.Compose([v2.Resize(40), t, v2.CenterCrop(32)]))
    ops = from_torchvision(v2.Compose([*base, v2.RandAugment(num_ops=3, magnitude=5)])).ops
    assert ops[-1].kind == "rand_augment" and ops[-1]["size"] == (32, 32)
    assert (ops[-1]["num_ops"], ops[-1]["magnitude"]) == (3, 5)


@pytest.mark.cuda
@pytest.mark.parametrize("k, param, magnitude", EXACT + WITHIN_ONE + [(13, 0.0, 0.0)])
def test_each_op_on_the_gpu_matches_the_cpu(images, k, param, magnitude):
    d = diff(dali_op(images, k, param, gpu=True), dali_op(images, k, param))
    assert d.max() <= 1, NAMES[k]


@pytest.mark.cuda
def test_the_reference_recipe_with_mixing_on_the_gpu(tiny_root):
    from pipelines import MixSpec
    from pipelines.transforms.presets import torchvision_ref

    cfg = LoaderConfig(root=tiny_root, batch_size=8, device="cuda", num_workers=2,
                       transform=torchvision_ref(64, auto_augment="ta_wide", random_erase=0.5),
                       mix=MixSpec(mixup_alpha=0.2, cutmix_alpha=1.0), debug_indices=True)
    with create_loader("dali", cfg) as ld:
        for e in range(2):
            ld.set_epoch(e)
            for x, y in ld:
                assert x.is_cuda and y.is_cuda and bool(torch.isfinite(x).all())
                assert torch.allclose(y.sum(1), torch.ones(len(y), device=y.device))
        assert sorted(ld.last_indices.tolist()) == list(range(37))
