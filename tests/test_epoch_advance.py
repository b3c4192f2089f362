"""Epochs advance by themselves (``pipelines.loader`` NOTE [epochs advance]): an ``iter()``
after an epoch began reads the next epoch unless ``set_epoch`` or ``load_state_dict`` named
one, as each ``iter()`` of a shuffling ``DataLoader`` is a new order; ``set_epoch`` still sets
the epoch exactly, and states resume exactly."""
from __future__ import annotations

import pytest
import torch

from pipelines import AugmentSpec, LoaderConfig
from tests.utils import make

BACKENDS = ["dali", "pinned", "pageable"]


def _cfg(backend, root):
    return LoaderConfig(root=root, batch_size=8, device="cpu", seed=11, debug_indices=True,
                        num_workers=1 if backend == "dali" else 0, augment=AugmentSpec(size=16))


def _open(backend, root):
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    return make(backend, _cfg(backend, root))


def _read(loader, stop=None):
    """``(loader.epoch, indices, pixel sum)`` of each batch of one ``iter()`` (``stop``: leave
    after that many)."""
    out = []
    for b in loader:
        out.append((loader.epoch, tuple(b.indices.tolist()), round(float(b.images.sum()), 2)))
        if stop is not None and len(out) == stop:
            break
    return out


@pytest.fixture(scope="module")
def reference(tiny_root):
    """Epochs 0-3 of every backend, each read after ``set_epoch`` on one loader."""
    cache: dict[str, list] = {}

    def get(backend):
        if backend not in cache:
            with _open(backend, tiny_root) as ld:
                epochs = []
                for e in range(4):
                    ld.set_epoch(e)
                    epochs.append(_read(ld))
            assert len({tuple(i for _, i, _ in ep) for ep in epochs}) == 4  # four orders
            cache[backend] = epochs
        return cache[backend]

    return get


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_iter_without_set_epoch_reads_the_next_epoch(backend, tiny_root, reference):
    ref = reference(backend)
    with _open(backend, tiny_root) as ld:
        assert _read(ld) == ref[0]
        assert ld.epoch == 0 and ld.resolution == (16, 16)
        assert _read(ld) == ref[1]  # a new order, as a shuffling DataLoader gives
        assert _read(ld, stop=2) == ref[2][:2]  # an epoch left early has begun: it counts
        assert _read(ld) == ref[3] and ld.epoch == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_set_epoch_still_sets_the_epoch_exactly(backend, tiny_root, reference):
    ref = reference(backend)
    with _open(backend, tiny_root) as ld:
        ld.set_epoch(2)
        assert _read(ld) == ref[2]
        ld.set_epoch(2)  # the same epoch again, as a DistributedSampler loop may
        assert _read(ld) == ref[2]
        assert _read(ld) == ref[3]  # then on from there
        it = iter(ld)
        ld.set_epoch(1)  # between iter() and the first next(): it still counts
        assert [(e, i, k) for e, i, k in _read_iter(ld, it)] == ref[1]


def _read_iter(loader, it):
    return [(loader.epoch, tuple(b.indices.tolist()), round(float(b.images.sum()), 2))
            for b in it]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_iter_never_read_advances_nothing(backend, tiny_root, reference):
    """Lightning calls ``iter(loader)`` once only to check that it is iterable."""
    ref = reference(backend)
    with _open(backend, tiny_root) as ld:
        iter(ld)
        iter(ld)
        assert _read(ld) == ref[0]
        iter(ld)
        assert _read(ld) == ref[1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_resumed_run_without_set_epoch_joins_the_uninterrupted_one(backend, tiny_root,
                                                                     reference):
    """No ``set_epoch`` anywhere: states taken mid-epoch, at an epoch's end and after it
    resume so that the joined batches are the uninterrupted run's, epoch numbers included."""
    ref = reference(backend)
    flat = [r for ep in ref[:3] for r in ep]
    with _open(backend, tiny_root) as ld:
        states = []
        for _ in range(3):  # the uninterrupted run: three iter()s, a state after each batch
            for _b in ld:
                states.append(ld.state_dict())
        assert ld.epoch == 2
        for k, state in enumerate(states):
            with _open(backend, tiny_root) as resumed:
                resumed.load_state_dict(state)
                rest: list = []
                for _ in range(4):  # bounded: at most an empty rest and three epochs
                    if len(rest) >= len(flat) - k - 1:
                        break
                    got = _read(resumed)
                    assert got or resumed.position[1] == len(resumed), k  # only an ended one
                    rest += got
                assert rest == flat[k + 1:], (backend, k)
            if k > 6:
                break  # into the second epoch: its start, its middle, its end


@pytest.mark.parametrize("backend", BACKENDS)
def test_load_state_dict_names_the_epoch_the_next_iter_reads(backend, tiny_root, reference):
    ref = reference(backend)
    with _open(backend, tiny_root) as ld:
        _read(ld, stop=2)
        state = ld.state_dict()  # epoch 0, two batches
        _read(ld)  # epoch 1 began since
        ld.load_state_dict(state)
        assert ld.epoch == 0
        assert _read(ld) == ref[0][2:]
        assert _read(ld) == ref[1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_resolution_and_sizes_follow_the_epoch_the_next_iter_reads(backend, tiny_root):
    with _open(backend, tiny_root) as ld:
        ld.set_resolution(8, epoch=1)
        assert ld.resolution == (16, 16)
        first = next(iter(ld))
        assert tuple(first.images.shape[-2:]) == (16, 16)
        assert ld.epoch == 0 and ld.resolution == (8, 8)  # the next iter() reads epoch 1
        second = next(iter(ld))
        assert ld.epoch == 1 and tuple(second.images.shape[-2:]) == (8, 8)
        assert not torch.equal(first.indices, second.indices)
