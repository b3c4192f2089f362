"""Issue 40, classes 2, 3 and 7: resume states checked whole, the plan's identity, states across
ranks, ``load_state_dict`` and a second ``iter()`` while an iterator is live, and the
environment's ``RANK`` / ``WORLD_SIZE`` pair (``pipelines.loader`` NOTE [resume], NOTE [one
iterator]; ``pipelines.placement`` NOTE [placement])."""
from __future__ import annotations

import os

import pytest
import torch

from data_gen.generate import GenConfig, generate
from pipelines import AugmentSpec, LoaderConfig, create_loader
from pipelines import placement as D
from tests.utils import state_after

BACKENDS = ["dali", "pinned", "pageable"]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("small")
    generate(GenConfig(out=str(out), num_images=14, classes=2, seed=5, width_range=(32, 48),
                       workers=1), progress=False)
    return out


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    generate(GenConfig(out=str(out), num_images=22, classes=2, seed=5, width_range=(32, 48),
                       layout="wds", shard_size=6, workers=1), progress=False)
    return out


def _cfg(root, **kw):
    base = dict(root=root, batch_size=4, device="cpu", num_workers=1, debug_indices=True,
                augment=AugmentSpec(size=16), seed=3)
    base.update(kw)
    return LoaderConfig(**base)


def _epoch(loader):
    return [(x.clone(), y.clone(), loader.last_batch_indices.tolist()) for x, y in loader]


def _same(a, b, pixels=True):
    """The same batches; ``pixels=False`` for a DALI loader that already drew (its draws run
    on, NOTE [resume]): the same samples and labels."""
    assert len(a) == len(b)
    for (xa, ya, ia), (xb, yb, ib) in zip(a, b):
        assert ia == ib and torch.equal(ya, yb)
        assert torch.equal(xa, xb) if pixels else xa.shape == xb.shape


# -- class 3: a refused state changes nothing ---------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_refused_state_leaves_the_position_and_epoch_as_they_were(backend, small):
    cfg = _cfg(small)
    with create_loader(backend, cfg) as ref:
        want = _epoch(ref)
    with create_loader(backend, cfg) as ld:
        good = state_after(ld, 2)
        ld.set_epoch(0)
        before = ld.state_dict()
        bads = [{**good, "batches": 1, "seed": 4},
                {**good, "batches": 1, "epoch": "1"},
                {**good, "batches": 1, "extra": 0},
                {**good, "batches": 1, "shuffle": 1}]
        for bad in bads:
            with pytest.raises(ValueError, match="load_state_dict"):
                ld.load_state_dict(bad)
            assert ld.state_dict() == before and ld.epoch == 0
        _same(want, _epoch(ld))  # from batch 0, not batch 2


@pytest.mark.dali
def test_a_dali_state_of_another_augmentation_resumes_the_position(small):
    """A state is the position only: another augmentation reads the same samples on."""
    with create_loader("dali", _cfg(small)) as a:
        state = state_after(a, 1)
    other = _cfg(small, augment=AugmentSpec(size=16, scale=(0.5, 1.0)))
    with create_loader("dali", other) as ref:
        want = _epoch(ref)
    with create_loader("dali", other) as b:
        b.load_state_dict(state)
        _same(want[1:], _epoch(b))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_shard_state_of_another_shuffle_window_is_refused(backend, shards):
    with create_loader(backend, _cfg(shards, shuffle_window=4)) as a:
        state = state_after(a, 2)
    assert state["shuffle_window"] == 4
    with create_loader(backend, _cfg(shards, shuffle_window=8)) as b:
        with pytest.raises(ValueError, match="shuffle_window differs"):
            b.load_state_dict(state)
    with create_loader(backend, _cfg(shards, shuffle_window=4)) as ref:
        want = _epoch(ref)
    with create_loader(backend, _cfg(shards, shuffle_window=4)) as c:
        c.load_state_dict(state)
        rest = _epoch(c)
    assert [i for *_, i in rest] == [i for *_, i in want[2:]]


# -- class 3: a state saved on rank 0, loaded on rank 1 ------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_rank0s_state_resumes_rank1_exactly_on_its_own_shard(backend, small):
    r0, r1 = (_cfg(small, rank=r, world_size=2) for r in (0, 1))
    with create_loader(backend, r1) as ref:
        ref.set_epoch(1)
        want = _epoch(ref)
    with create_loader(backend, r0) as a:
        state = state_after(a, 1, epoch=1)
    with create_loader(backend, r1) as b:
        b.load_state_dict(state)
        _same(want[1:], _epoch(b))


# -- class 3 and 7: while an iterator is live ----------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_load_state_dict_while_live_ends_that_iterator_and_applies_at_the_next_iter(backend,
                                                                                     small):
    cfg = _cfg(small)
    with create_loader(backend, cfg) as ref:
        want = _epoch(ref)
    with create_loader(backend, cfg) as a:
        state = state_after(a, 1)
    with create_loader(backend, cfg) as ld:
        it = iter(ld)
        next(it)
        next(it)
        ld.load_state_dict(state)
        with pytest.raises(RuntimeError, match=r"load_state_dict\(\)"):
            next(it)
        _same(want[1:], _epoch(ld))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_second_iter_takes_the_whole_epoch_and_the_first_ends_clearly(backend, small):
    cfg = _cfg(small)
    with create_loader(backend, cfg) as ref:
        want = _epoch(ref)
    with create_loader(backend, cfg) as ld:
        first = iter(ld)
        next(first)
        ld.set_epoch(0)  # epoch 0 again (else the next: pipelines.loader NOTE [epochs advance])
        second = iter(ld)
        with pytest.raises(RuntimeError, match=r"later iter\(\).*one iterator at a time"):
            next(first)
        got = [(x.clone(), y.clone(), ld.last_batch_indices.tolist()) for x, y in second]
        _same(want, got, backend != "dali")
        unread = iter(ld)  # made and dropped unread: the next one is whole too
        del unread
        ld.set_epoch(0)
        _same(want, _epoch(ld), backend != "dali")


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_ended_iterators_backend_half_is_closed_at_once(backend, small):
    """A framework may keep the ended iterator referenced: its backend half must not wait for
    the garbage collector (and then run beside the next epoch)."""
    with create_loader(backend, _cfg(small)) as ld:
        first = iter(ld)
        next(first)
        produce = ld._live
        assert produce is not None and produce.gi_frame is not None  # suspended, live
        second = iter(ld)
        assert produce.gi_frame is None  # closed by the second iter(), first still referenced
        next(second)
        produce = ld._live
        ld.close()
        assert produce.gi_frame is None
        with pytest.raises(RuntimeError, match="loader is closed"):
            next(second)


# -- class 2: RANK and WORLD_SIZE come as a pair -------------------------------------------------
@pytest.fixture
def env(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(D, "_dist", lambda: None)
    return monkeypatch


def test_world_size_without_rank_is_an_error_naming_rank(env, small):
    env.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"WORLD_SIZE='2' is set in the environment but RANK "
                                         r"is not"):
        D.placement()
    with pytest.raises(ValueError, match="RANK is not"):
        create_loader("pageable", _cfg(small, num_workers=0))
    assert D.placement(rank=1).rank == 1  # the config gives the missing one
    assert D.placement(1, 2).source == "config"


def test_rank_without_world_size_is_an_error_naming_world_size(env):
    env.setenv("RANK", "1")
    with pytest.raises(ValueError, match=r"RANK='1' is set in the environment but WORLD_SIZE "
                                         r"is not"):
        D.placement()
    p = D.placement(world_size=2)
    assert (p.rank, p.world_size) == (1, 2)
    env.setenv("WORLD_SIZE", "2")
    assert (D.placement().rank, D.placement().world_size) == (1, 2)


def test_torch_distributed_wins_over_half_an_environment(env):
    env.setenv("WORLD_SIZE", "2")
    env.setattr(D, "_dist", lambda: (1, 2))
    assert D.placement().source == "torch.distributed"


# -- NOTE [forked copies]: a DataLoader worker's garbage collector frees a copy of a loader ------
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_forked_child_frees_a_copy_of_a_loader_without_hanging(backend, small):
    """Seen as a hang of the suite: a pinned worker, forked while a DALI loader was cycle
    garbage in the parent, collected it and waited forever in DALI's pipeline shutdown."""
    import gc
    import signal
    import time

    ld = create_loader(backend, _cfg(small))
    next(iter(ld))  # pipelines built, threads and workers running
    ld.cycle = ld  # garbage only a collection frees
    del ld
    gc.disable()
    try:
        pid = os.fork()
        if pid == 0:  # the child: what a DataLoader worker's collector does
            try:
                gc.enable()
                gc.collect()
            finally:
                os._exit(0)
    finally:
        gc.enable()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung freeing its copy of the loader")
    gc.collect()  # the parent's copy is freed and closed as usual
