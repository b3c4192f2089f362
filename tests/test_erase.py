"""RandomErasing on DALI (``pipelines.dali.geometry.random_erase``) against torchvision: the
erase rate and the box's area, aspect ratio and position, each with a failing counter-example."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torchvision.transforms import v2

from pipelines import LoaderConfig, UnsupportedTransformError, create_loader, from_torchvision
from tests.utils import ks, one_image_copies

H, W, FILL = 48, 64, 5.0  # the fill is no normalised pixel value (those lie in [-2, 2])
EPOCHS = 12
N = 64 * EPOCHS
D_CRIT = 1.949 * math.sqrt(2 / N)  # two-sample KS, p = 0.001


def compose(p=0.6, scale=(0.02, 0.33), ratio=(0.3, 3.3)):
    return v2.Compose([v2.Resize((H, W)), v2.ToDtype(torch.float32, scale=True),
                       v2.Normalize([0.5] * 3, [0.25] * 3),
                       v2.RandomErasing(p=p, scale=scale, ratio=ratio, value=FILL)])


@pytest.fixture(scope="module")
def copies(tmp_path_factory, tiny_root):
    return one_image_copies(tiny_root, tmp_path_factory.mktemp("erase"))


def boxes(backend, root, t):
    """Per sample: erased or not, and the box's (area fraction, log(h / w), y / (H - h),
    x / (W - w)) when erased."""
    cfg = LoaderConfig(root=root, batch_size=64, device="cpu", num_workers=2, transform=t,
                       seed=11)
    rows, erased = [], 0
    with create_loader(backend, cfg) as ld:
        for e in range(EPOCHS):
            ld.set_epoch(e)
            for x, _ in ld:
                m = (x == FILL).all(1)
                for mk in m:
                    if not mk.any():
                        continue
                    erased += 1
                    ys, xs = mk.any(1).nonzero()[:, 0], mk.any(0).nonzero()[:, 0]
                    h, w = len(ys), len(xs)
                    assert int(mk.sum()) == h * w  # one rectangle
                    rows.append((h * w / (H * W), math.log(h / w),
                                 int(ys[0]) / max(H - h, 1), int(xs[0]) / max(W - w, 1)))
    return erased / N, np.array(rows)


@pytest.fixture(scope="module")
def torchvision_boxes(copies):
    return boxes("pageable", copies, compose())


@pytest.mark.dali
def test_dali_erases_at_torchvisions_rate_with_its_boxes(copies, torchvision_boxes):
    rate_tv, tv = torchvision_boxes
    rate, dali = boxes("dali", copies, compose())
    assert abs(rate - rate_tv) < 4 * math.sqrt(0.6 * 0.4 * 2 / N) and abs(rate - 0.6) < 0.08
    for k, what in enumerate(("area", "log aspect", "y offset", "x offset")):
        assert ks(dali[:, k], tv[:, k]) < D_CRIT, what


@pytest.mark.dali
def test_a_wrong_scale_or_p_is_told_apart(copies, torchvision_boxes):
    rate_tv, tv = torchvision_boxes
    rate, wrong = boxes("dali", copies, compose(p=0.3, scale=(0.1, 0.5)))
    assert abs(rate - rate_tv) > 4 * math.sqrt(0.6 * 0.4 * 2 / N)
    assert ks(wrong[:, 0], tv[:, 0]) > D_CRIT


def test_random_fill_values_are_refused_for_dali():
    t = v2.Compose([v2.RandomResizedCrop(32), v2.ToDtype(torch.float32, scale=True),
                    v2.RandomErasing(value="random")])
    with pytest.raises(UnsupportedTransformError, match=r"RandomErasing.*value='random'"):
        from_torchvision(t)
    uint8 = v2.Compose([v2.RandomResizedCrop(32), v2.RandomErasing(value=0.5)])
    with pytest.raises(UnsupportedTransformError, match=r"RandomErasing.*uint8"):
        from_torchvision(uint8)
    ops = from_torchvision(v2.Compose([v2.RandomResizedCrop(32), v2.RandomErasing(value=7)])).ops
    assert ops[-1].kind == "erase" and ops[-1]["value"] == (7.0, 7.0, 7.0)


@pytest.mark.dali
@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric"])
@pytest.mark.parametrize("padding", [3, [1, 2], [1, 2, 3, 4]])
def test_pad_matches_torchvision_exactly(tiny_root, mode, padding):
    t = v2.Compose([v2.CenterCrop((20, 24)), v2.Pad(padding, fill=7, padding_mode=mode)])
    outs = {}
    for b in ("dali", "pageable"):
        cfg = LoaderConfig(root=tiny_root, batch_size=8, device="cpu", num_workers=0,
                           transform=t, shuffle=False)
        with create_loader(b, cfg) as ld:
            outs[b] = next(iter(ld))[0]
    assert outs["dali"].shape == outs["pageable"].shape
    assert torch.equal(outs["dali"], outs["pageable"])
    if mode == "constant":
        assert bool((outs["dali"][:, :, 0, :] == 7).all())  # the top row is fill


def test_pad_after_normalize_fills_in_the_normalised_space():
    t = v2.Compose([v2.CenterCrop(16), v2.ToDtype(torch.float32, scale=True),
                    v2.Normalize([0.5] * 3, [0.25] * 3), v2.Pad(2, fill=-1.5)])
    ops = from_torchvision(t)
    assert [o.kind for o in ops.ops] == ["center_crop", "affine", "pad"]
    assert ops.out_size == (20, 20)
    with pytest.raises(Exception, match="reflect padding must be smaller"):
        from_torchvision(v2.Compose([v2.CenterCrop(4), v2.Pad(5, padding_mode="reflect")]))
