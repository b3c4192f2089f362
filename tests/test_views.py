"""Several views per sample (``AugmentSpec(views=k)``; ``pipelines.transforms.draws`` NOTE
[views]): each image decoded once and cropped ``k`` times, view ``v`` keyed by ``(seed, epoch,
index, v)``, so view 0 is the ``views=1`` crop, the views differ, every backend crops the same
views, and resume is exact. ``Batch.images`` is ``(N * k) x 3 x H x W``, the views of a sample
adjacent; ``labels``, ``indices`` and ``valid`` keep length ``N``."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision.transforms import v2

from pipelines import AugmentSpec, LoaderConfig, MixSpec
from pipelines.epoch_plan import sample_seed
from pipelines.transforms.draws import DrawPlan, Step, sample_seeds, view_seed
from pipelines.transforms.plan import TransformPlan
from tests.utils import make

pytest.importorskip("nvidia.dali")

SIZE = 32
BACKENDS = ["pinned", "pageable", "dali"]


# -- the draws ------------------------------------------------------------------------------
def test_view_0_is_the_sample_seed_and_views_are_keyed():
    idx = np.arange(300) * 7919
    for seed, epoch in ((0, 0), (12345, 3), (2**32 - 1, 9)):
        zero = sample_seeds(seed, epoch, idx, view=0)
        assert np.array_equal(zero, sample_seeds(seed, epoch, idx))
        assert all(view_seed(seed, epoch, int(i), 0) == sample_seed(seed, epoch, int(i))
                   for i in idx[:20])
        for v in (1, 2, 5):
            got = sample_seeds(seed, epoch, idx, view=v)
            assert np.array_equal(got, [view_seed(seed, epoch, int(i), v) for i in idx])
            assert not np.any(got == zero)
    with pytest.raises(ValueError, match="view"):
        sample_seeds(0, 0, idx, view=-1)


def test_a_rows_views_are_torchvisions_draws_of_each_views_seed():
    """A plan of 3 views: block ``v`` of a row is what RandomResizedCrop and the flip draw
    after ``manual_seed(view_seed(..., v))``; block 0 is the one-view row."""
    steps = (Step("window"), Step("coin"))
    plan = DrawPlan(steps, views=3)
    n = 200
    rng = np.random.default_rng(1)
    sizes = np.stack([rng.integers(8, 300, n), rng.integers(8, 300, n)], 1)
    rows = plan.rows(plan.raws(7, 2, np.arange(n)), sizes)
    assert rows.shape == (n, 15) and plan.width == 15 and plan.view_width == 5
    one = DrawPlan(steps)
    assert np.array_equal(rows[:, :5], one.rows(one.raws(7, 2, np.arange(n)), sizes))
    t = v2.RandomResizedCrop(SIZE)
    for k in range(0, n, 7):
        h, w = map(int, sizes[k])
        for v in range(3):
            torch.random.default_generator.manual_seed(view_seed(7, 2, k, v))
            p = t.make_params([torch.zeros(1, dtype=torch.uint8).expand(3, h, w)])
            flip = float(torch.rand(1).item() < 0.5)
            want = [p["top"], p["left"], p["height"], p["width"], flip]
            assert np.array_equal(rows[k, 5 * v:5 * v + 5], np.float32(want)), (k, v)


# -- the options ----------------------------------------------------------------------------
@pytest.mark.parametrize("views,match", [(0, "views=0"), (True, "views=True"), (1.5, "views=1.5"),
                                         ("2", "views='2'")])
def test_views_must_be_a_positive_int(views, match):
    with pytest.raises(ValueError, match=match):
        AugmentSpec(views=views)


def test_views_need_train_mode():
    with pytest.raises(ValueError, match="views=2 needs mode='train'"):
        AugmentSpec(mode="eval", views=2)
    assert AugmentSpec(mode="eval", views=1).views == 1


def test_views_refuse_a_transform_and_mix(tiny_root):
    spec = AugmentSpec(size=SIZE, views=2)
    tv = v2.Compose([v2.RandomResizedCrop(SIZE), v2.ToDtype(torch.float32, scale=True)])
    with pytest.raises(ValueError, match=r"views=2 .*transform"):
        LoaderConfig(root=tiny_root, augment=spec, transform=tv)
    with pytest.raises(ValueError, match=r"views=2 .*mix"):
        LoaderConfig(root=tiny_root, augment=spec, mix=MixSpec(mixup_alpha=0.2))
    LoaderConfig(root=tiny_root, augment=AugmentSpec(views=1), mix=MixSpec(mixup_alpha=0.2))


def test_views_keep_their_count_across_sizes_and_in_the_byte_count():
    spec = AugmentSpec(size=SIZE, views=3)
    assert spec.at_size(48).views == 3
    one = TransformPlan.of(AugmentSpec(size=SIZE))
    three = TransformPlan.of(spec)
    for where in ("full", "head"):
        assert three.sample_bytes(in_workers=where) == 3 * one.sample_bytes(in_workers=where)


# -- every backend, folder and shards -------------------------------------------------------
def _epoch(backend, root, views, seed=0, **kw):
    """One epoch: images as ``N x views x 3 x H x W`` ordered by dataset index, and the
    indices."""
    cfg = LoaderConfig(root=root, batch_size=8, num_workers=1, device="cpu", seed=seed,
                       debug_indices=True, augment=AugmentSpec(size=SIZE, views=views),
                       **kw.pop("cfg", {}))
    xs, idx = [], []
    with make(backend, cfg, **kw) as ld:
        for batch in ld:
            x, y = batch
            n = len(y)
            assert x.shape == (n * views, 3, SIZE, SIZE)
            assert len(batch.indices) == len(batch.valid) == n
            assert torch.equal(batch.indices, torch.as_tensor(ld.last_batch_indices))
            xs.append(x.float().view(n, views, 3, SIZE, SIZE))
            idx.append(ld.last_batch_indices.copy())
    idx = np.concatenate(idx)
    return torch.cat(xs)[np.argsort(idx)], np.sort(idx)


def _per_image(a, b):
    return (a - b).abs().mean(dim=(-3, -2, -1))


@pytest.fixture(scope="module", params=["folder", "shards"])
def root(request, tiny_root, wds):
    return tiny_root if request.param == "folder" else wds


@pytest.fixture(scope="module")
def epochs(root):
    """Each backend's epoch with one view and with two, from the same seed."""
    return {(b, k): _epoch(b, root, k) for b in BACKENDS for k in (1, 2)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_view_0_is_the_one_view_crop_and_the_views_differ(epochs, backend):
    one, i1 = epochs[backend, 1]
    two, i2 = epochs[backend, 2]
    assert np.array_equal(i1, i2) and len(i1) == 37
    if backend == "dali":  # the views slice one whole decode; views=1 decodes the window
        assert _per_image(two[:, 0], one[:, 0]).max() < 0.02
    else:
        assert torch.equal(two[:, 0], one[:, 0])
    assert _per_image(two[:, 1], two[:, 0]).mean() > 0.3


def test_every_backend_crops_the_same_views(epochs, root):
    """``dali`` against ``pinned``: decoder and resampling rounding only (as
    ``tests/test_one_plan.py``); ``pinned`` with PIL's decoder is ``pageable`` exactly."""
    d, _ = epochs["dali", 2]
    p, _ = epochs["pinned", 2]
    assert _per_image(d, p).max() < 0.1
    pil, _ = _epoch("pinned", root, 2, decoder="pil")
    assert torch.equal(pil, epochs["pageable", 2][0])
    other, _ = _epoch("pinned", root, 2, seed=1)
    assert _per_image(other, p).mean() > 0.3


@pytest.mark.parametrize("backend", ["pinned", "dali"])
def test_views_with_channels_last_are_the_same_values(epochs, root, backend):
    got, _ = _epoch(backend, root, 2, cfg={"channels_last": True})
    assert torch.equal(got, epochs[backend, 2][0])


def test_dali_decodes_each_image_once_for_its_views(tiny_root):
    cfg = LoaderConfig(root=tiny_root, batch_size=8, num_workers=1, device="cpu",
                       augment=AugmentSpec(size=SIZE, views=3))
    with make("dali", cfg) as ld:
        pipe = ld.pipes[0]
        pipe.build()
        ops = [type(o._op).__name__ for o in pipe._ops]
        assert pipe.draw_plan.views == 3
    decoders = [n for n in ops if n in ("Image", "ImageSlice", "ImageCrop", "ImageRandomCrop")]
    assert decoders == ["Image"], ops
    assert ops.count("Slice") == 3 and ops.count("Resize") == 3


# -- resume -----------------------------------------------------------------------------------
def _read(loader, epoch):
    loader.set_epoch(epoch)
    return [(loader.last_batch_indices.copy(), x.clone()) for x, _ in loader]


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_with_views_is_exact(tiny_root, backend):
    cfg = LoaderConfig(root=tiny_root, batch_size=8, num_workers=1, device="cpu", seed=5,
                       debug_indices=True, augment=AugmentSpec(size=SIZE, views=2))
    with make(backend, cfg) as ref:
        whole = [_read(ref, 0), _read(ref, 1)]
    with make(backend, cfg) as saver:
        saver.set_epoch(0)
        it = iter(saver)
        next(it), next(it)
        state = saver.state_dict()
        it.close()
    with make(backend, cfg) as resumed:
        resumed.load_state_dict(state)
        for got, want in ((_read(resumed, 0), whole[0][2:]), (_read(resumed, 1), whole[1])):
            assert len(got) == len(want)
            for (ia, xa), (ib, xb) in zip(got, want):
                assert np.array_equal(ia, ib) and torch.equal(xa, xb)
    assert not torch.equal(whole[0][0][1], whole[1][0][1])  # another epoch, other crops


# -- with the rest of the loader ----------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_views_follow_set_resolution_and_skip_bad_files(tmp_path, tiny_root, backend):
    """At another size the views are the recipe's at that size; a bad file's row stands in
    for it in every view, and ``valid`` stays one flag per sample."""
    from tests.utils import broken_huffman, copy_root

    root = copy_root(tiny_root, tmp_path / "root")
    bad = sorted(root.rglob("*.jpg"))[3]
    bad.write_bytes(broken_huffman(bad.read_bytes()))
    cfg = LoaderConfig(root=root, batch_size=8, num_workers=1, device="cpu",
                       on_bad_file="skip", augment=AugmentSpec(size=SIZE, views=2))
    with make(backend, cfg) as ld:
        ld.set_resolution(24)
        rows = valid = 0
        with pytest.warns(RuntimeWarning, match="skipped 1 bad files"):
            for batch in ld:
                x, y = batch
                assert x.shape == (2 * len(y), 3, 24, 24) and len(batch.valid) == len(y)
                rows += len(x)
                valid += int(batch.valid.sum())
        assert ld.stats.bad_files == 1
    assert rows == 2 * 37 and valid == 36


@pytest.mark.cuda
def test_dali_views_on_the_gpu_are_pinneds(tiny_root):
    """nvJPEG's one whole decode, sliced per view on the GPU, against ``pinned``'s views:
    decoder and resampling rounding only."""
    def on_gpu(backend):
        cfg = LoaderConfig(root=tiny_root, batch_size=8, num_workers=2, device="cuda",
                           debug_indices=True, augment=AugmentSpec(size=SIZE, views=2))
        xs, idx = [], []
        with make(backend, cfg) as ld:
            for x, y in ld:
                assert x.shape == (2 * len(y), 3, SIZE, SIZE) and x.is_cuda
                xs.append(x.float().cpu().view(len(y), 2, 3, SIZE, SIZE))
                idx.append(ld.last_batch_indices.copy())
        return torch.cat(xs)[np.argsort(np.concatenate(idx))]

    d, p = on_gpu("dali"), on_gpu("pinned")
    assert _per_image(d, p).max() < 0.1
    assert _per_image(d[:, 1], d[:, 0]).mean() > 0.3
