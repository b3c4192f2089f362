"""Progressive resizing (``pipelines.resolution``, ``LoaderBase.set_resolution``): each epoch's
size, a switch that keeps what was made ahead, and a state that resumes every later size."""
from __future__ import annotations

import pytest
import torch

from pipelines import AugmentSpec, LoaderConfig
from pipelines.resolution import Resolutions
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


def _pixels(batches):
    return [(b.indices.cpu().clone(), b.images.clone()) for b in batches]


def _same(got, want):
    assert len(got) == len(want)
    for (ia, xa), (ib, xb) in zip(got, want):
        assert torch.equal(ia, ib) and torch.equal(xa, xb)


# -- the schedule ----------------------------------------------------------------------------
def test_a_size_holds_from_its_epoch_to_the_next_one_set():
    r = Resolutions(AugmentSpec(size=16))
    r.set(24, epoch=2)
    r.set((16, 20), epoch=4)
    assert [r.at(e).hw for e in range(6)] == [(16, 16)] * 2 + [(24, 24)] * 2 + [(16, 20)] * 2
    r.set(32)  # without an epoch: every epoch, the sizes set before are gone
    assert {r.at(e).hw for e in range(6)} == {(32, 32)}
    with pytest.raises(ValueError, match="set_resolution: epoch=-1"):
        r.set(24, epoch=-1)
    with pytest.raises(ValueError, match="set_resolution: size=0"):
        r.set(0, epoch=1)


def test_the_state_holds_the_resumed_epochs_size_and_every_later_change():
    r = Resolutions(AugmentSpec(size=16))
    r.set(24, epoch=2)
    r.set((16, 20), epoch=4)
    assert r.saved(1, r.at(1)) == {"resolution_schedule": [[2, 24, 24], [4, 16, 20]]}
    state = r.saved(2, r.at(2))
    assert state == {"resolution": [24, 24], "resolution_schedule": [[4, 16, 20]]}
    fresh = Resolutions(AugmentSpec(size=16))
    fresh.load(*fresh.checked(state, 2))
    assert [fresh.at(e).hw for e in range(2, 7)] == [r.at(e).hw for e in range(2, 7)]
    for bad in ([[2, 24, 24]], [[5, 24, 24], [4, 16, 16]], [[5, 0, 24]], [[5, 24]], "x"):
        with pytest.raises(ValueError, match="resolution_schedule"):
            fresh.checked({"resolution_schedule": bad}, 2)


# -- a switch on each backend ----------------------------------------------------------------
class _Count:
    """Counts the calls of ``obj.name`` (an instance attribute wraps the method)."""

    def __init__(self, obj, name):
        self.n = 0
        f = getattr(obj, name)

        def counted(*a, **kw):
            self.n += 1
            return f(*a, **kw)

        setattr(obj, name, counted)


def _counters(backend, ld):
    if backend == "dali":
        return {"start": _Count(ld.source, "start_epoch"), "drain": _Count(ld, "_drain"),
                "rebuild": _Count(ld, "_rebuild")}
    return {"restart": _Count(ld, "_stop_stream")}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_size_announced_ahead_keeps_what_was_made_ahead(backend, tiny_root):
    """``set_resolution(24, epoch=1)`` during epoch 0: epoch 1's first batches, made while
    epoch 0 ran, are at 24 and kept (the torch stream is not restarted, ``dali``'s lanes go on
    without a new start), and epoch 1 is what a loader built at 24 yields. A size set after
    the epoch's first batches were made drops them, still without a rebuild."""
    _skip(backend)
    opts = {} if backend == "dali" else {"epoch_stream": True, "persistent_workers": True}
    with make(backend, _cfg(tiny_root, augment=AugmentSpec(size=24)), **opts) as ref:
        ref.set_epoch(1)
        want = _pixels(ref)
    with make(backend, _cfg(tiny_root), **opts) as ld:
        pipes = list(getattr(ld, "pipes", []))
        it = iter(ld)
        first = next(it)
        ld.set_resolution(24, epoch=1)
        assert {tuple(b.images.shape[-2:]) for b in [first, *it]} == {(16, 16)}
        count = _counters(backend, ld)
        ld.set_epoch(1)
        _same(_pixels(ld), want)
        assert {k: c.n for k, c in count.items()} == {k: 0 for k in count}
        ld.set_resolution((16, 20))  # after epoch 2's first batches were made at 24
        ld.set_epoch(2)
        assert {tuple(b.images.shape[-2:]) for b in ld} == {(16, 20)}
        if backend == "dali":
            assert count["start"].n == 1 and count["rebuild"].n == 0
            assert len(pipes) == len(ld.pipes) and all(a is b for a, b in zip(pipes, ld.pipes))
        else:
            assert count["restart"].n == 1


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("size", [24, (16, 28)])
def test_dali_switches_size_in_the_same_pipelines_as_pinned_crops(tiny_root, mode, size):
    """``dali`` takes a new size with no rebuild (its pipelines are the same objects), square
    and not, train and eval, and crops as ``pinned`` does at that size (decoder and resampling
    rounding apart; the same bound as ``tests/test_one_plan.py``)."""
    pytest.importorskip("nvidia.dali")
    hw = (size, size) if isinstance(size, int) else size
    got = {}
    for backend in ("dali", "pinned"):
        with make(backend, _cfg(tiny_root, augment=AugmentSpec(mode=mode, size=16))) as ld:
            pipes = list(getattr(ld, "pipes", []))
            for _ in ld:
                pass
            ld.set_resolution(size)
            ld.set_epoch(1)
            got[backend] = _pixels(ld)
            if backend == "dali":
                assert pipes and all(a is b for a, b in zip(pipes, ld.pipes, strict=True))
    d, p = got["dali"], got["pinned"]
    assert all(tuple(x.shape[-2:]) == hw for _, x in d)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(d, p, strict=True))
    diff = (torch.cat([x for _, x in d]).float() - torch.cat([x for _, x in p]).float()).abs()
    assert diff.mean(dim=(1, 2, 3)).max() < 0.1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_state_saved_after_a_switch_resumes_every_later_size(backend, tiny_root):
    """Sizes announced for epochs 1 and 2; a state saved in epoch 1 resumes its rest at 24 and
    epoch 2 at (16, 20) in a fresh loader that was told neither: as an uninterrupted run."""
    _skip(backend)

    def announced(ld):
        ld.set_resolution(24, epoch=1)
        ld.set_resolution((16, 20), epoch=2)
        return ld

    with announced(make(backend, _cfg(tiny_root))) as ref:
        want = {}
        for e in (0, 1, 2):
            ref.set_epoch(e)
            want[e] = _pixels(ref)
    with announced(make(backend, _cfg(tiny_root))) as ld:
        for _ in ld:
            pass
        ld.set_epoch(1)
        it = iter(ld)
        next(it), next(it)
        state = ld.state_dict()
        it.close()
    assert state["resolution"] == [24, 24] and state["resolution_schedule"] == [[2, 16, 20]]
    with make(backend, _cfg(tiny_root)) as fresh:
        fresh.load_state_dict(state)
        assert fresh.resolution == (24, 24)
        _same(_pixels(fresh), want[1][2:])
        fresh.set_epoch(2)
        assert fresh.resolution == (16, 20)
        _same(_pixels(fresh), want[2])
