"""Targets beyond one class (``LoaderConfig.target``), ``Batch.indices`` / ``Batch.valid``,
and an evaluation that is exact under DDP when padded rows are masked."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipelines import AugmentSpec, LoaderConfig
from pipelines.transforms.mix import MixSpec
from tests.utils import make

BACKENDS = ["dali", "pinned", "pageable"]


def _skip(backend):
    if backend == "dali":
        pytest.importorskip("nvidia.dali")


def _cfg(root, **kw):
    base = dict(root=root, batch_size=8, device="cpu", num_workers=1, debug_indices=True,
                augment=AugmentSpec(size=16), seed=2)
    base.update(kw)
    return LoaderConfig(**base)


@pytest.mark.parametrize("backend", BACKENDS)
def test_indices_and_valid_cover_every_sample_once_over_padded_ranks(backend, tiny_root):
    _skip(backend)
    seen = []
    for rank in (0, 1):
        with make(backend, _cfg(tiny_root, rank=rank, world_size=2, last_batch="pad")) as ld:
            for b in ld:
                assert torch.equal(b.indices.cpu(), torch.from_numpy(ld.last_batch_indices))
                assert b.valid.dtype == torch.bool and len(b.valid) == len(b.images)
                seen += b.indices[b.valid].tolist()
    assert sorted(seen) == list(range(37))  # 37 images: 40 rows over two ranks, 3 padded
    with make(backend, _cfg(tiny_root)) as ld:  # one process, partial: every row is valid
        assert all(bool(b.valid.all()) for b in ld)


def _labels(backend, root, target):
    out = {}
    with make(backend, _cfg(root, target=target)) as ld:
        for b in ld:
            for i, y in zip(b.indices.tolist(), b.labels):
                out[i] = y.clone()
    return out


def test_every_target_kind_is_the_same_on_every_backend(tiny_root):
    pytest.importorskip("nvidia.dali")

    def multi_hot(rel):  # a multi-label target from the path: class and file-number parity
        cls, name = rel.split(os.sep)[-2:]
        n = int("".join(ch for ch in name if ch.isdigit()) or 0)
        return [1.0 if cls.endswith(str(k)) else 0.0 for k in range(3)] + [float(n % 2)]

    def regression(rel):
        return (len(rel) / 10.0, -1.5)

    for target, dtype, shape in (("none", torch.int64, ()), (multi_hot, torch.float32, (4,)),
                                 (regression, torch.float32, (2,)),
                                 (lambda rel: len(rel) % 5, torch.int64, ())):
        got = [_labels(b, tiny_root, target) for b in BACKENDS]
        assert sorted(got[0]) == list(range(37))
        for i in range(37):
            y = got[0][i]
            assert y.dtype == dtype and tuple(y.shape) == shape
            assert all(torch.equal(y, g[i]) for g in got[1:]), (target, i)
            if target == "none":
                assert int(y) == i


@pytest.fixture(scope="module")
def sources(tiny_root, tmp_path_factory):
    """The same 37 images as a folder, a CSV file list and tar shards."""
    from data_gen.generate import GenConfig, generate
    from pipelines.sources.root import list_dataset

    paths, labels, _ = list_dataset(tiny_root)
    lst = tiny_root.parent / "tiny-list.csv"
    lst.write_text("path,label\n" + "".join(f"{p},{int(y)}\n" for p, y in zip(paths, labels)))
    wds = tmp_path_factory.mktemp("tiny-wds")
    generate(GenConfig(out=str(wds), num_images=37, classes=3, seed=7, width_range=(48, 96),
                       workers=1, layout="wds", shard_size=8), progress=False)
    return {"folder": tiny_root, "list": lst, "shards": wds}


@pytest.mark.parametrize("source", ["folder", "list", "shards"])
def test_targets_from_every_source_are_the_same_on_every_backend(sources, source):
    """``"none"`` and a ``target_fn`` on a folder, a file list and tar shards: each backend
    yields the same targets for the same indices; the function saw relative paths."""
    pytest.importorskip("nvidia.dali")
    rels = []

    def fn(rel):
        rels.append(rel)
        return [float(len(rel)), float(sum(map(ord, rel)) % 7)]

    root = sources[source]
    for target in ("none", fn):
        got = [_labels(b, root, target) for b in BACKENDS]
        assert sorted(got[0]) == list(range(37))
        assert all(torch.equal(got[0][i], g[i]) for g in got[1:] for i in range(37))
    assert rels and not any(os.path.isabs(r) for r in rels)


def test_bad_targets_are_refused_naming_target(tiny_root):
    for bad in ("multi", 3, (), ("a", "A"), ("a", 1)):
        with pytest.raises(ValueError, match="target="):
            _cfg(tiny_root, target=bad)
    calls = []

    def ragged(rel):
        calls.append(rel)
        return [1.0] * len(calls)

    for fn, what in ((lambda rel: 1 / 0, "raised ZeroDivisionError"),
                     (lambda rel: "x", "returned 'x'"),
                     (lambda rel: [float("nan")], "finite"),
                     (ragged, "one length")):
        with pytest.raises(ValueError, match=rf"target.*{what}"):
            make("pinned", _cfg(tiny_root, target=fn))
    with pytest.raises(ValueError, match="^mix"):
        _cfg(tiny_root, target="none", mix=MixSpec(mixup_alpha=0.2))


# -- evaluation under DDP ---------------------------------------------------------------------
def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 3))


def evaluate(loader, model) -> tuple[int, int]:
    """The README's loop: ``(samples, correct)``, padded rows masked, summed over ranks."""
    count = torch.zeros(2, dtype=torch.int64)
    with torch.no_grad():
        for batch in loader:
            hit = (model(batch.images).argmax(1) == batch.labels) & batch.valid
            count += torch.stack([batch.valid.sum(), hit.sum()]).cpu()
    if dist.is_initialized():
        dist.all_reduce(count)
    return int(count[0]), int(count[1])


def _rank(rank, world, root, backend, store, out):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        cfg = LoaderConfig(root=root, batch_size=8, device="cpu", num_workers=0, shuffle=False,
                           augment=AugmentSpec(mode="eval", size=16), rank=rank,
                           world_size=world, last_batch="pad")
        with make(backend, cfg) as ld:
            res = evaluate(ld, _net())
        if rank == 0:
            torch.save(res, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_masked_evaluation_under_ddp_equals_one_process_exactly(backend, tiny_root, tmp_path):
    _skip(backend)
    cfg = LoaderConfig(root=tiny_root, batch_size=8, device="cpu", num_workers=0, shuffle=False,
                       augment=AugmentSpec(mode="eval", size=16))
    with make(backend, cfg) as ld:
        want = evaluate(ld, _net())
    assert want[0] == 37
    out = tmp_path / "res.pt"
    mp.spawn(_rank, args=(2, str(tiny_root), backend, str(tmp_path / "store"), str(out)),
             nprocs=2, join=True)
    assert tuple(torch.load(out)) == want


# -- non-square outputs -------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_non_square_outputs_on_every_backend_crop_alike(tiny_root, mode):
    pytest.importorskip("nvidia.dali")
    spec = AugmentSpec(mode=mode, size=(24, 40))
    assert spec.hw == (24, 40) and spec.resize_size == 46
    got = {}
    for backend in BACKENDS:
        with make(backend, _cfg(tiny_root, augment=spec, shuffle=False)) as ld:
            xs = [b.images for b in ld]
        assert all(tuple(x.shape[1:]) == (3, 24, 40) for x in xs), backend
        got[backend] = torch.cat(xs).float()
    for backend in ("dali", "pageable"):
        mae = (got[backend] - got["pinned"]).abs().mean(dim=(1, 2, 3))
        assert mae.max() < 0.1, (backend, float(mae.max()))
    with pytest.raises(ValueError, match="size="):
        AugmentSpec(size=(24, 0))
    with pytest.raises(ValueError, match="resize_size="):
        AugmentSpec(mode="eval", size=(24, 40), resize_size=32)


# -- progressive resizing -----------------------------------------------------------------------
def _epoch_pixels(ld, epoch):
    ld.set_epoch(epoch)
    return [(b.indices.cpu().clone(), b.images.clone()) for b in ld]


@pytest.mark.parametrize("backend", BACKENDS)
def test_set_resolution_takes_effect_at_the_next_epoch_and_resumes(backend, tiny_root):
    """Epoch 1 after ``set_resolution(24)`` is what a loader built at 24 yields (the same
    draws); a state saved in it carries the size, and a fresh loader resumes it exactly."""
    _skip(backend)
    with make(backend, _cfg(tiny_root, augment=AugmentSpec(size=24))) as ref:
        want = _epoch_pixels(ref, 1)
    with make(backend, _cfg(tiny_root)) as ld:
        ld.set_epoch(0)
        it = iter(ld)
        first = next(it)
        ld.set_resolution(24)  # mid-epoch: this epoch keeps its size, and so does its state
        assert "resolution" not in ld.state_dict() and ld.resolution == (24, 24)
        assert all(b.images.shape[-1] == 16 for b in [first, *it])
        got = _epoch_pixels(ld, 1)
        assert len(got) == len(want)
        for (ia, xa), (ib, xb) in zip(got, want):
            assert torch.equal(ia, ib) and torch.equal(xa, xb)
        ld.set_epoch(2)
        it = iter(ld)
        next(it), next(it)
        state = ld.state_dict()
        it.close()
        assert state["resolution"] == [24, 24]
        ld.set_resolution((16, 20))
        assert all(tuple(b.images.shape[-2:]) == (16, 20) for b in ld)
        ld.set_resolution(16)  # back to the config's own size (pinned's workers kept the last)
        assert all(tuple(b.images.shape[-2:]) == (16, 16) for b in ld)
    with make(backend, _cfg(tiny_root, augment=AugmentSpec(size=24))) as ref:
        rest = _epoch_pixels(ref, 2)[2:]
    with make(backend, _cfg(tiny_root)) as fresh:
        fresh.load_state_dict(state)
        assert fresh.resolution == (24, 24)
        got = [(b.indices.cpu(), b.images) for b in fresh]
    assert len(got) == len(rest)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(got, rest))


def test_set_resolution_is_refused_by_name(tiny_root):
    from torchvision.transforms import v2

    with make("pinned", _cfg(tiny_root)) as ld:
        with pytest.raises(ValueError, match="set_resolution: size"):
            ld.set_resolution(0)
        state = ld.state_dict()
        with pytest.raises(ValueError, match="resolution="):
            ld.load_state_dict({**state, "resolution": [24]})
    tv = v2.Compose([v2.RandomResizedCrop(16), v2.PILToTensor()])
    with make("pinned", _cfg(tiny_root, transform=tv)) as ld:
        with pytest.raises(ValueError, match="transform="):
            ld.set_resolution(24)


@pytest.mark.cuda
def test_targets_indices_and_valid_on_the_gpu(tiny_root):
    """On CUDA: the targets, indices and valid mask are on the batch's device and the same on
    every backend; progressive resizing gives the new size."""
    pytest.importorskip("nvidia.dali")
    got = []
    for backend in BACKENDS:
        cfg = _cfg(tiny_root, device="cuda", target=lambda rel: [float(len(rel)), 1.0],
                   rank=1, world_size=2, last_batch="pad")
        rows = {}
        with make(backend, cfg) as ld:
            for b in ld:
                assert b.labels.device == b.images.device == b.indices.device == b.valid.device
                assert b.images.device.type == "cuda"
                for i, y, ok in zip(b.indices.tolist(), b.labels.cpu(), b.valid.tolist()):
                    rows.setdefault(i, []).append((y, ok))
            ld.set_resolution((16, 24))
            assert all(tuple(b.images.shape[-2:]) == (16, 24) for b in ld)
        got.append(rows)
    assert sorted(got[0]) == sorted(got[1]) == sorted(got[2])
    for i in got[0]:
        for g in got[1:]:
            assert all(torch.equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(got[0][i], g[i]))
