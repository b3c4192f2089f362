"""RandomRotation and RandomAffine on DALI (``pipelines.dali.geometry.affine``) against
torchvision: exact at fixed parameters, the same draws otherwise, and what is refused."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torchvision.transforms import v2

from pipelines import LoaderConfig, UnsupportedTransformError, create_loader, from_torchvision
from tests.utils import ks, one_image_copies

pytestmark = pytest.mark.dali


def _run(backend, root, t, batch=8, epochs=1, seed=3):
    cfg = LoaderConfig(root=root, batch_size=batch, device="cpu", num_workers=0, transform=t,
                       shuffle=False, seed=seed)
    out = []
    with create_loader(backend, cfg) as ld:
        for e in range(epochs):
            ld.set_epoch(e)
            out += [x.clone() for x, _ in ld]
    return torch.cat(out)


FIXED = [
    v2.RandomRotation((30.0, 30.0)),
    v2.RandomRotation((-75.0, -75.0), interpolation=v2.InterpolationMode.NEAREST, fill=9),
    v2.RandomRotation((20.0, 20.0), center=(5.0, 7.0)),
    v2.RandomAffine((15.0, 15.0), scale=(1.2, 1.2)),
    v2.RandomAffine((0.0, 0.0), shear=(10.0, 10.0, -20.0, -20.0)),
    v2.RandomAffine((-40.0, -40.0), scale=(0.8, 0.8), shear=(5.0, 5.0), center=(10.0, 3.0)),
]


@pytest.mark.parametrize("t", FIXED, ids=[repr(t)[:60] for t in FIXED])
def test_fixed_warps_equal_torchvision(tiny_root, t):
    c = v2.Compose([v2.CenterCrop((40, 48)), t])
    a, b = _run("dali", tiny_root, c), _run("pageable", tiny_root, c)
    assert a.shape == b.shape
    assert float((a != b).float().mean()) < 0.01  # only where a point falls between two pixels


def test_a_wrong_angle_is_told_apart(tiny_root):
    a = _run("dali", tiny_root, v2.Compose([v2.CenterCrop((40, 48)), v2.RandomRotation((30, 30))]))
    b = _run("pageable", tiny_root, v2.Compose([v2.CenterCrop((40, 48)),
                                                v2.RandomRotation((-30, -30))]))
    assert float((a != b).float().mean()) > 0.3


@pytest.fixture(scope="module")
def copies(tmp_path_factory, tiny_root):
    return one_image_copies(tiny_root, tmp_path_factory.mktemp("warp"))


def _stats(backend, root, t):
    x = _run(backend, root, v2.Compose([v2.CenterCrop((40, 48)), t]), batch=64, epochs=10)
    x = x.float()
    return np.stack([x.mean((1, 2, 3)).numpy(),
                     (x[..., :24].mean((1, 2, 3)) - x[..., 24:].mean((1, 2, 3))).numpy(),
                     (x[..., :20, :].mean((1, 2, 3)) - x[..., 20:, :].mean((1, 2, 3))).numpy()],
                    1)


@pytest.mark.parametrize("t, wrong", [
    (v2.RandomRotation(45), v2.RandomRotation(10)),
    (v2.RandomAffine(20, translate=(0.2, 0.1), scale=(0.7, 1.3), shear=(-10, 10, -5, 5)),
     v2.RandomAffine(20, translate=(0.4, 0.1), scale=(0.7, 1.3), shear=(-10, 10, -5, 5))),
], ids=["rotation", "affine"])
def test_random_warps_draw_as_torchvision(copies, t, wrong):
    d, tv = _stats("dali", copies, t), _stats("pageable", copies, t)
    crit = 1.949 * math.sqrt(2 / len(d))
    for k in range(3):
        assert ks(d[:, k], tv[:, k]) < crit, k
    other = _stats("pageable", copies, wrong)
    assert max(ks(other[:, k], d[:, k]) for k in range(3)) > crit


def test_refusals_are_named():
    base = [v2.RandomResizedCrop(32)]
    with pytest.raises(UnsupportedTransformError, match="expand=True"):
        from_torchvision(v2.Compose([*base, v2.RandomRotation(10, expand=True),
                                     v2.CenterCrop(32)]))
    with pytest.raises(UnsupportedTransformError, match="fill="):
        from_torchvision(v2.Compose([*base, v2.RandomAffine(10, fill=[1, 2, 3])]))
    with pytest.raises(UnsupportedTransformError, match="RandomRotation"):
        from_torchvision(v2.Compose([*base, v2.ToDtype(torch.float32, scale=True),
                                     v2.RandomRotation(10)]))
    op = from_torchvision(v2.Compose([*base, v2.RandomAffine(10, shear=5)])).ops[-1]
    assert op.kind == "warp" and op["shear"] == (-5.0, 5.0, 0.0, 0.0)
