"""The torch backends' DataLoader stream across epochs (``pipelines.torch_backend.base`` NOTE)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipelines import AugmentSpec, LoaderConfig
from tests.utils import make

TORCH = ["pinned", "pageable"]


def _cfg(root, **kw):
    base = dict(root=root, batch_size=8, device="cpu", num_workers=2, debug_indices=True,
                augment=AugmentSpec(size=32), seed=11)
    base.update(kw)
    return LoaderConfig(**base)


def _epoch(loader, e):
    loader.set_epoch(e)
    xs = [x.clone() for x, _ in loader]
    return xs, loader.last_indices.copy()


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("backend", TORCH)
def test_one_stream_serves_consecutive_epochs_with_the_same_batches(backend, persistent,
                                                                   tiny_root):
    with make(backend, _cfg(tiny_root), persistent_workers=persistent) as fresh:
        want = [_epoch(fresh, e) for e in (0, 1, 2)]
        fresh.close()
    with make(backend, _cfg(tiny_root), persistent_workers=persistent,
              epoch_stream=True) as ld:
        _epoch(ld, 0)
        stream = ld._stream
        assert stream is not None and ld._next == 1
        got1 = _epoch(ld, 1)
        assert ld._stream is stream  # not restarted: the workers ran ahead into epoch 1
        got2 = _epoch(ld, 2)
        assert ld._stream is stream and ld._next == 3
    for (wx, wi), (gx, gi) in zip(want[1:], (got1, got2)):
        assert np.array_equal(wi, gi) and all(torch.equal(a, b) for a, b in zip(wx, gx))


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("backend", TORCH)
def test_an_epoch_left_early_or_a_jump_restarts_the_stream_at_the_right_epoch(
        backend, persistent, tiny_root):
    with make(backend, _cfg(tiny_root), persistent_workers=persistent) as ref:
        want1, want5 = _epoch(ref, 1), _epoch(ref, 5)
    with make(backend, _cfg(tiny_root), persistent_workers=persistent,
              epoch_stream=True) as ld:
        ld.set_epoch(0)
        next(iter(ld))  # leave epoch 0 after one batch
        got1 = _epoch(ld, 1)  # epoch 1 whole, not the rest of epoch 0
        got5 = _epoch(ld, 5)  # a jump: epochs 2-4 are not read
        again5 = _epoch(ld, 5)  # the same epoch twice
    for (wx, wi), (gx, gi) in ((want1, got1), (want5, got5), (want5, again5)):
        assert np.array_equal(wi, gi) and len(wx) == len(gx)
        assert all(torch.equal(a, b) for a, b in zip(wx, gx))


def test_pageable_drains_each_epoch_as_a_plain_dataloader_and_pinned_streams(tiny_root):
    """The baseline is the default recipe, untuned (issue 20): a fresh DataLoader iterator and
    fresh workers every epoch, with the same batches as the stream gives."""
    with make("pinned", _cfg(tiny_root)) as ld:
        assert ld.epoch_stream and ld.loader.persistent_workers
        want = [_epoch(ld, e) for e in (0, 1)]
    with make("pageable", _cfg(tiny_root)) as ld:
        assert not ld.epoch_stream and not ld.loader.persistent_workers
        pids = []
        got = []
        for e in (0, 1):
            ld.set_epoch(e)
            xs = []
            for x, _ in ld:
                xs.append(x.clone())
                if len(xs) == 1:
                    pids.append(sorted(w.pid for w in ld._stream._workers))
            got.append((xs, ld.last_indices.copy()))
            assert ld._stream is None  # the epoch's iterator ended with it
        assert set(pids[0]).isdisjoint(pids[1])  # fresh workers
    for (wx, wi), (gx, gi) in zip(want, got):
        assert np.array_equal(wi, gi) and len(wx) == len(gx)
