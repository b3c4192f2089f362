"""One contract, every backend: the same Batch, the same files, the same epoch semantics (CPU)."""
import numpy as np
import pytest
import torch

from pipelines import AugmentSpec, Batch, BatchLoader, LastBatchPolicy, LoaderConfig, create_loader
from pipelines.epoch_plan import list_samples

BACKENDS = [
    pytest.param("pageable"),
    pytest.param("pinned"),
    pytest.param("dali", marks=pytest.mark.dali),
]


def _cfg(root, **kw):
    base = dict(root=root, batch_size=8, device="cpu", num_workers=0, debug_indices=True,
                augment=AugmentSpec(size=32), seed=3)
    base.update(kw)
    return LoaderConfig(**base)


def _epoch(loader):
    batches = [(x.clone(), y.clone()) for x, y in loader]
    return batches, loader.last_indices.copy()


@pytest.fixture(params=[0, 2], ids=["inline", "workers"])
def workers(request):
    return request.param


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_shape_dtype_and_range(backend, tiny_root, workers):
    cfg = _cfg(tiny_root, num_workers=workers)
    with create_loader(backend, cfg) as loader:
        assert isinstance(loader, BatchLoader)
        b = next(iter(loader))
    assert isinstance(b, Batch)
    x, y = b
    assert x.shape == (8, 3, 32, 32) and x.dtype == torch.float32 and x.device.type == "cpu"
    assert y.dtype == torch.int64 and y.shape == (8,)
    # normalised: uint8 0..255 maps into [(0-m)/s, (1-m)/s]
    m, s = torch.tensor(cfg.augment.mean), torch.tensor(cfg.augment.std)
    lo, hi = (-m / s).min().item(), ((1 - m) / s).max().item()
    assert lo - 1e-4 <= x.min().item() and x.max().item() <= hi + 1e-4
    assert x.std().item() > 0.1  # real pixels, not a constant
    _, labels, _ = list_samples(tiny_root)
    assert set(y.tolist()) <= set(labels.tolist())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype, channels_last", [("bfloat16", True), ("float16", False)])
def test_dtype_and_channels_last(backend, tiny_root, dtype, channels_last):
    with create_loader(backend, _cfg(tiny_root, dtype=dtype, channels_last=channels_last)) as loader:
        x, _ = next(iter(loader))
    assert x.dtype == getattr(torch, dtype)
    assert x.is_contiguous(memory_format=torch.channels_last) == channels_last


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("policy", list(LastBatchPolicy))
def test_every_sample_once_and_len_matches_policy(backend, tiny_root, policy):
    n = 37
    with create_loader(backend, _cfg(tiny_root, last_batch=policy)) as loader:
        batches, idx = _epoch(loader)
        assert len(batches) == len(loader)
    sizes = [len(y) for _, y in batches]
    if policy is LastBatchPolicy.DROP:
        assert sizes == [8] * 4 and len(set(idx.tolist())) == 32
    elif policy is LastBatchPolicy.PARTIAL:
        assert sizes == [8] * 4 + [5] and sorted(idx.tolist()) == list(range(n))
    else:
        assert sizes == [8] * 5 and set(idx.tolist()) == set(range(n))
    _, labels, _ = list_samples(tiny_root)
    got = torch.cat([y for _, y in batches]).numpy()
    assert np.array_equal(got, labels[idx])  # each label belongs to its file


@pytest.mark.parametrize("backend", BACKENDS)
def test_set_epoch_reshuffles_deterministically_and_same_seed_same_batches(backend, tiny_root):
    cfg = _cfg(tiny_root)
    with create_loader(backend, cfg) as a, create_loader(backend, cfg) as b:
        a.set_epoch(1)
        b.set_epoch(1)
        (ba, ia), (bb, ib) = _epoch(a), _epoch(b)
        assert np.array_equal(ia, ib)
        for (xa, ya), (xb, yb) in zip(ba, bb):
            assert torch.equal(ya, yb) and torch.equal(xa, xb)
        a.set_epoch(2)
        _, i2 = _epoch(a)
        assert not np.array_equal(ia, i2) and sorted(ia.tolist()) == sorted(i2.tolist())
        a.set_epoch(1)
        _, i1 = _epoch(a)
        assert np.array_equal(ia, i1)


@pytest.mark.parametrize("policy", [None, "partial", "pad", "drop"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_sharded_ranks_are_disjoint_and_complete(backend, policy, tiny_root):
    """37 files, 3 ranks, batch 8: partial reads each file once (ranks may differ in steps,
    13/12/12 samples -> 2 batches each here); pad (the default with several ranks) reads
    each at least once with equal steps; drop reads whole batches (3 x 1 x 8) once each."""
    seen, lens = [], []
    for rank in range(3):
        cfg = _cfg(tiny_root, rank=rank, world_size=3, last_batch=policy)
        with create_loader(backend, cfg) as loader:
            batches, idx = _epoch(loader)
            assert len(batches) == len(loader)
            seen.append(idx)
            lens.append(len(loader))
    allidx = np.concatenate(seen).tolist()
    if policy in (None, "pad"):
        assert len(set(lens)) == 1 and len(allidx) == 3 * lens[0] * 8
        assert set(allidx) == set(range(37))
    elif policy == "partial":
        assert sorted(allidx) == list(range(37))
    else:
        assert len(set(lens)) == 1 and len(allidx) == len(set(allidx)) == 3 * lens[0] * 8


@pytest.mark.parametrize("backend", BACKENDS)
def test_shuffle_false_visits_in_listing_order(backend, tiny_root):
    with create_loader(backend, _cfg(tiny_root, shuffle=False)) as loader:
        assert _epoch(loader)[1].tolist() == list(range(37))


@pytest.mark.parametrize("backend", BACKENDS)
def test_closed_loader_refuses_to_iterate(backend, tiny_root):
    loader = create_loader(backend, _cfg(tiny_root))
    loader.close()
    loader.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        next(iter(loader))
