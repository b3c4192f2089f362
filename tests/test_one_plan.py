"""One plan for every backend (``pipelines.transforms.draws`` NOTE [one plan]): every draw keyed by
``(seed, epoch, index)``, so ``dali`` crops and flips as the torch backends do, and a state
is the position only: resume is exact anywhere."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision.transforms import v2

from pipelines import AugmentSpec, DaliOptions, LoaderConfig
from pipelines.epoch_plan import sample_seed
from pipelines.transforms.draws import DrawPlan, Step, mt_raws, sample_seeds
from tests.utils import make

pytest.importorskip("nvidia.dali")


def test_sample_seeds_are_sample_seed_vectorised():
    idx = (np.arange(2000) * 7919) % 1_000_003
    for seed, epoch in ((0, 0), (12345, 3), (2**40 + 5, 7), (2**32 - 1, 2**31)):
        want = np.array([sample_seed(seed, epoch, int(i)) for i in idx], dtype=np.uint64)
        assert np.array_equal(sample_seeds(seed, epoch, idx), want)


def test_mt_raws_are_torchs_generator():
    seeds = [0, 5, 2**32 + 5, 2**63 - 1]
    raws = mt_raws(np.array(seeds, dtype=np.uint64), 8)
    g = torch.Generator()
    for s, r in zip(seeds, raws):
        g.manual_seed(s)
        want = torch.empty(8, dtype=torch.int32).random_(generator=g).numpy()  # low 31 bits
        assert np.array_equal(r & 0x7FFFFFFF, want.astype(np.uint64))
    with pytest.raises(ValueError, match="count"):
        mt_raws(np.zeros(1, np.uint64), 300)


@pytest.mark.parametrize("scale,ratio", [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.35, 1.0), (0.5, 2.0)),
                                         ((0.9, 1.0), (3 / 4, 4 / 3))])
def test_the_rows_are_torchvisions_draws(scale, ratio):
    """A window, a flip, three uniform numbers and a coin: exactly what torchvision's
    RandomResizedCrop, RandomHorizontalFlip, ``torch.rand(3)`` and ``torch.rand(1) < 0.3``
    draw after ``manual_seed(sample_seed(...))``, fallback windows included."""
    rng = np.random.default_rng(0)
    n = 1500
    sizes = np.stack([rng.integers(8, 900, n), rng.integers(8, 900, n)], 1)
    sizes[:100, 0] = 5          # very wide: torchvision falls back to the centre
    sizes[100:200, 1] = 3000
    plan = DrawPlan((Step("window", scale=scale, ratio=ratio), Step("coin"),
                     Step("uniform", count=3), Step("coin", p=0.3)))
    rows = plan.rows(plan.raws(7, 2, np.arange(n)), sizes)
    t = v2.RandomResizedCrop(224, scale=scale, ratio=ratio)
    for k in range(n):
        h, w = map(int, sizes[k])
        torch.random.default_generator.manual_seed(sample_seed(7, 2, k))
        p = t.make_params([torch.zeros(1, dtype=torch.uint8).expand(3, h, w)])
        flip = float(torch.rand(1).item() < 0.5)
        u = torch.rand(3).numpy()
        coin = float(torch.rand(1).item() < 0.3)
        want = np.array([p["top"], p["left"], p["height"], p["width"], flip, *u, coin],
                        np.float32)
        assert np.array_equal(rows[k], want), (k, h, w, rows[k], want)


def test_a_window_needs_the_sizes():
    plan = DrawPlan((Step("window"),))
    with pytest.raises(ValueError, match="sizes"):
        plan.rows(plan.raws(0, 0, np.arange(3)))


# -- the same crops on every backend --------------------------------------------------------
@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from data_gen.generate import GenConfig, generate

    out = tmp_path_factory.mktemp("one-plan")
    generate(GenConfig(out=str(out), num_images=64, classes=4, seed=3, width_range=(160, 400),
                       workers=1), progress=False)
    return out


def _epoch(backend, root, seed, **kw):
    cfg = LoaderConfig(root=root, batch_size=16, num_workers=2, device="cpu", seed=seed,
                       debug_indices=True, augment=AugmentSpec(size=64), **kw)
    xs, idx = [], []
    with make(backend, cfg) as ld:
        for x, _ in ld:
            xs.append(x.float())
            idx.append(ld.last_batch_indices.copy())
    idx = np.concatenate(idx)
    return torch.cat(xs)[np.argsort(idx)], np.sort(idx)


def test_dali_crops_and_flips_every_sample_as_pinned(photos):
    """Per image, the mean absolute difference (normalised units) between ``dali`` and
    ``pinned`` is decoder and resampling rounding only; another seed's crops are far apart."""
    d, di = _epoch("dali", photos, 0)
    p, pi = _epoch("pinned", photos, 0)
    o, _ = _epoch("pinned", photos, 1)
    assert np.array_equal(di, pi) and len(di) == 64
    same = (d - p).abs().mean(dim=(1, 2, 3))
    other = (d - o).abs().mean(dim=(1, 2, 3))
    assert same.max() < 0.1, same.max()
    assert other.mean() > 0.3, other.mean()


def test_pinned_with_pil_is_pageable_exactly(photos):
    cfg = dict(root=photos, batch_size=16, num_workers=2, device="cpu", seed=4,
               augment=AugmentSpec(size=64))
    with make("pinned", LoaderConfig(**cfg), decoder="pil") as a, \
            make("pageable", LoaderConfig(**cfg)) as b:
        for (xa, ya), (xb, yb) in zip(a, b):
            assert torch.equal(ya, yb) and torch.equal(xa, xb)


# -- resume is exact anywhere -----------------------------------------------------------------
def _cfg(root, **kw):
    base = dict(root=root, batch_size=8, device="cpu", num_workers=2, debug_indices=True,
                augment=AugmentSpec(size=32), seed=5)
    base.update(kw)
    return LoaderConfig(**base)


def _read(loader, epoch):
    loader.set_epoch(epoch)
    return [(loader.last_batch_indices.copy(), x.clone()) for x, _ in loader]


def _equal(a, b):
    assert len(a) == len(b)
    for (ia, xa), (ib, xb) in zip(a, b):
        assert np.array_equal(ia, ib) and torch.equal(xa, xb)


CASES = [("pinned", {}), ("pageable", {}), ("dali", {"run_on": True}),
         ("dali", {"run_on": False}), ("dali", {"run_on": True, "pipelines": 2})]


@pytest.mark.parametrize("backend,kw", CASES)
@pytest.mark.parametrize("rank", [0, 1])
def test_resume_is_exact_mid_epoch_at_the_boundary_and_past_the_end(tiny_root, backend, kw,
                                                                    rank):
    """Against an uninterrupted run of epochs 0 and 1: a state saved by rank 0 after 2
    batches and loaded on ``rank``; a fresh loader told only ``set_epoch(1)``; and a loader
    that read epoch 0 and called ``next()`` past its end before epoch 1."""
    cfg = _cfg(tiny_root, rank=rank, world_size=2)
    with make(backend, cfg, **kw) as ref:
        whole = [_read(ref, 0), _read(ref, 1)]
    with make(backend, _cfg(tiny_root, rank=0, world_size=2), **kw) as saver:
        saver.set_epoch(0)
        it = iter(saver)
        next(it), next(it)
        state = saver.state_dict()
        it.close()
    with make(backend, cfg, **kw) as resumed:
        resumed.load_state_dict(state)
        _equal(_read(resumed, 0), whole[0][2:])
        _equal(_read(resumed, 1), whole[1])
    with make(backend, cfg, **kw) as fresh:
        _equal(_read(fresh, 1), whole[1])
    with make(backend, cfg, **kw) as past:
        past.set_epoch(0)
        it = iter(past)
        n = sum(1 for _ in it)
        assert n == len(whole[0])
        with pytest.raises(StopIteration):
            next(it)
        _equal(_read(past, 1), whole[1])


def test_a_dali_state_is_the_position_only(tiny_root):
    with make("dali", _cfg(tiny_root)) as ld:
        ld.set_epoch(0)
        it = iter(ld)
        next(it)
        state = ld.state_dict()
        it.close()
    assert "dali" not in state and state["epoch"] == 0 and state["batches"] == 1
    with pytest.raises(TypeError, match="checkpointing.*removed"):
        DaliOptions(checkpointing=True)


@pytest.mark.cuda
def test_dali_on_the_gpu_crops_and_flips_every_sample_as_pinned(photos):
    """The same check with nvJPEG's decode and DALI's GPU resize against ``pinned``'s CPU
    decode and GPU normalisation."""
    def on_gpu(backend, seed):
        cfg = LoaderConfig(root=photos, batch_size=16, num_workers=2, device="cuda", seed=seed,
                           debug_indices=True, augment=AugmentSpec(size=64))
        xs, idx = [], []
        with make(backend, cfg) as ld:
            for x, _ in ld:
                xs.append(x.float().cpu())
                idx.append(ld.last_batch_indices.copy())
        idx = np.concatenate(idx)
        return torch.cat(xs)[np.argsort(idx)]

    d, p, o = on_gpu("dali", 0), on_gpu("pinned", 0), on_gpu("pinned", 1)
    same = (d - p).abs().mean(dim=(1, 2, 3))
    assert same.max() < 0.1, same.max()
    assert (d - o).abs().mean(dim=(1, 2, 3)).mean() > 0.3


def test_trivial_augment_draws_are_torchvisions():
    """After a window and a flip, ``TrivialAugmentWide``'s op, magnitude bin and sign are what
    torchvision v2 draws for the same sample seed."""
    from pipelines.dali.autoaug import tables

    bins = 31
    tab = tables("TrivialAugmentWide", bins, 64, 64)
    names = list(tab)
    plan = DrawPlan((Step("window"), Step("coin"),
                     Step("trivial", bins=bins, mags=tuple(tab[n][0] is not None for n in names),
                          signs=tuple(bool(tab[n][1]) for n in names))))
    n = 600
    sizes = np.full((n, 2), 64)
    rows = plan.rows(plan.raws(3, 1, np.arange(n)), sizes)
    ta = v2.TrivialAugmentWide(num_magnitude_bins=bins)
    seen = []
    ta._apply_image_or_video_transform = lambda img, name, mag, **kw: seen.append((name, mag)) or img
    rrc, flip = v2.RandomResizedCrop(32), v2.RandomHorizontalFlip()
    img = torch.zeros(3, 64, 64, dtype=torch.uint8)
    kinds = set()
    for k in range(n):
        torch.random.default_generator.manual_seed(sample_seed(3, 1, k))
        ta(flip(rrc(img)))
        name, mag = seen[-1]
        op, b, neg = rows[k, 5:8].astype(int)
        assert names[op] == name, k
        want = 0.0 if tab[name][0] is None else float(tab[name][0][b]) * (-1 if neg else 1)
        assert mag == want, (k, name, mag, want)
        kinds.add((tab[name][0] is not None, bool(neg)))
    assert kinds == {(False, False), (True, False), (True, True)}


def test_dali_trivial_augment_takes_pinneds_ops(photos):
    """With TrivialAugmentWide in the recipe, ``dali`` applies the op and magnitude ``pinned``
    applies to each sample: per image within rounding, but for Equalize (DALI's differs,
    docs/transforms.md) and the interpolation of warps."""
    tv = v2.Compose([v2.RandomResizedCrop(48), v2.RandomHorizontalFlip(),
                     v2.TrivialAugmentWide(), v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                     v2.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    d, di = _epoch("dali", photos, 0, transform=tv)
    p, pi = _epoch("pinned", photos, 0, transform=tv)
    o, _ = _epoch("pinned", photos, 1, transform=tv)
    assert np.array_equal(di, pi)
    same = (d - p).abs().mean(dim=(1, 2, 3))
    other = (d - o).abs().mean(dim=(1, 2, 3))
    assert float((same < 0.1).float().mean()) >= 0.9 and float(same.median()) < 0.01, same
    assert float(other.mean()) > 0.3
