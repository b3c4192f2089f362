"""``TorchOptions.cpu_binding``: each local rank's workers on its own slice of the cores."""
from __future__ import annotations

import os

import pytest

from pipelines import LoaderConfig, TorchOptions, create_loader
from pipelines.config import CpuBinding
from pipelines.torch_backend.affinity import rank_cores

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"),
                                reason="needs os.sched_setaffinity (Linux)")


@pytest.mark.parametrize("cores,world,want", [
    (range(32), 2, [tuple(range(16)), tuple(range(16, 32))]),
    (range(10), 3, [(0, 1, 2), (3, 4, 5), (6, 7, 8, 9)]),
    ([7, 3, 5, 1], 2, [(1, 3), (5, 7)]),  # sorted, then split
])
def test_slices_are_contiguous_disjoint_and_cover_the_cores(cores, world, want):
    got = [rank_cores(r, world, cores) for r in range(world)]
    assert got == want
    assert sorted(c for s in got for c in s) == sorted(cores)


def test_bad_slices_name_the_option():
    with pytest.raises(ValueError, match="cpu_binding='rank'.*LOCAL_RANK=2"):
        rank_cores(2, 2, range(8))
    with pytest.raises(ValueError, match="cpu_binding='rank': 1 usable cores.*LOCAL_WORLD_SIZE=2"):
        rank_cores(0, 2, [0])


def _env(monkeypatch, local_rank, local_world):
    for k, v in (("RANK", local_rank), ("WORLD_SIZE", local_world), ("LOCAL_RANK", local_rank),
                 ("LOCAL_WORLD_SIZE", local_world)):
        monkeypatch.setenv(k, str(v))


def _worker_affinities(ld):
    ld.set_epoch(0)
    next(iter(ld))
    return [os.sched_getaffinity(w.pid) for w in ld._stream._workers]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 if hasattr(os, "sched_getaffinity")
                    else True, reason="needs 2 usable cores")
def test_workers_of_local_rank_1_run_on_its_slice_only(tiny_root, monkeypatch):
    _env(monkeypatch, 1, 2)
    mine = set(rank_cores(1, 2))
    cfg = LoaderConfig(root=tiny_root, device="cpu", num_workers=2, batch_size=4)
    with create_loader("pinned", cfg, options=TorchOptions(cpu_binding="rank")) as ld:
        assert ld.worker_cores == tuple(sorted(mine))
        got = _worker_affinities(ld)
    assert got == [mine, mine]
    assert os.sched_getaffinity(0) != mine  # the main process keeps its own affinity


def test_default_and_one_local_rank_keep_the_inherited_affinity(tiny_root, monkeypatch):
    everything = os.sched_getaffinity(0)
    cfg = LoaderConfig(root=tiny_root, device="cpu", num_workers=1, batch_size=4)
    _env(monkeypatch, 0, 1)
    with create_loader("pinned", cfg, options=TorchOptions(cpu_binding="rank")) as ld:
        assert ld.worker_cores is None and _worker_affinities(ld) == [everything]
    _env(monkeypatch, 1, 2)
    with create_loader("pinned", cfg) as ld:  # default: none
        assert TorchOptions().cpu_binding is CpuBinding.NONE
        assert ld.worker_cores is None and _worker_affinities(ld) == [everything]


def test_binding_is_refused_on_the_baseline():
    with pytest.raises(ValueError, match="cpu_binding=.*no effect on backend 'pageable'"):
        TorchOptions(cpu_binding="rank").for_backend("pageable")
    with pytest.raises(ValueError, match="cpu_binding='spread' is not valid"):
        TorchOptions(cpu_binding="spread")
