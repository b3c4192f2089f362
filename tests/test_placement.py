"""``pipelines.placement`` in one process: resolution order, defaults, errors."""
from __future__ import annotations

import pytest
import torch

from pipelines import LastBatchPolicy, LoaderConfig, create_loader
from pipelines import placement as D
from pipelines.config import default_workers
from pipelines.torch_backend.shm import rank_share


@pytest.fixture
def torchrun_env(monkeypatch):
    def set_(rank, world, local_rank=None, local_world=None):
        for k, v in (("RANK", rank), ("WORLD_SIZE", world), ("LOCAL_RANK", local_rank),
                     ("LOCAL_WORLD_SIZE", local_world)):
            if v is None:
                monkeypatch.delenv(k, raising=False)
            else:
                monkeypatch.setenv(k, str(v))
    set_(None, None)
    return set_


def test_single_process_by_default(torchrun_env):
    p = D.placement()
    assert (p.rank, p.world_size, p.local_rank, p.local_world_size, p.source) == (
        0, 1, None, 1, "single process")
    c = LoaderConfig(root="x", device="cpu").resolved()
    assert (c.rank, c.world_size, c.last_batch) == (0, 1, LastBatchPolicy.PARTIAL)


def test_torchrun_env_is_read_when_torch_distributed_is_not_initialised(torchrun_env):
    torchrun_env(2, 4, 0, 2)
    p = D.placement()
    assert (p.rank, p.world_size, p.local_rank, p.local_world_size, p.source) == (
        2, 4, 0, 2, "environment")
    c = LoaderConfig(root="x", device="cpu").resolved()
    assert (c.rank, c.world_size, c.last_batch) == (2, 4, LastBatchPolicy.PAD)
    # what the config names wins, and an explicit policy is kept
    c = LoaderConfig(root="x", device="cpu", rank=1, world_size=2, last_batch="drop").resolved()
    assert (c.rank, c.world_size, c.last_batch) == (1, 2, LastBatchPolicy.DROP)
    assert D.placement(1, 2).source == "config"


def test_bad_environment_values_name_the_variable(torchrun_env, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match=r"WORLD_SIZE='two' in the environment must be an int"):
        D.placement()
    torchrun_env(3, 2)
    with pytest.raises(ValueError, match=r"rank=3 must be in \[0, world_size=2\) "
                                         r"\(from environment\)"):
        LoaderConfig(root="x", device="cpu").resolved()


def test_cpu_budget_and_shm_are_divided_among_local_ranks(torchrun_env, monkeypatch):
    monkeypatch.setattr("pipelines.config.usable_cores", lambda: 32)
    assert default_workers() == 30
    torchrun_env(0, 2, 0, 2)
    assert default_workers() == 14
    assert LoaderConfig(root="x", device="cpu").num_workers == 14
    torchrun_env(0, 8, 0, 8)
    assert default_workers() == 2
    assert rank_share(8 << 30, 4) == 2 << 30 and rank_share(None, 4) is None


def test_cuda_means_cuda_local_rank(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    p = lambda lr: D.Placement(lr or 0, 2, lr, 2, "environment")  # noqa: E731
    assert D.local_device("cuda", p(1)) == "cuda:1"
    assert D.local_device("cuda:0", p(1)) == "cuda:0"  # the user's explicit choice
    assert D.local_device("cpu", p(1)) == "cpu"
    assert D.local_device("cuda", p(None)) == "cuda"  # no LOCAL_RANK: the current device
    with pytest.raises(ValueError, match="LOCAL_RANK=3 and this process sees 2 CUDA devices"):
        D.local_device("cuda", p(3))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert D.local_device("cuda", p(3)) == "cuda:0"  # one GPU bound per process


def test_placement_change_after_build_is_refused(monkeypatch):
    built = D.Placement(0, 1, None, 1, "single process")
    monkeypatch.setattr(D, "_dist", lambda: None)
    D.check_unchanged(built)  # still one process: fine
    monkeypatch.setattr(D, "_dist", lambda: (1, 2))
    with pytest.raises(RuntimeError, match=r"built as rank 0 of 1 \(from single process\), but "
                                           r"torch.distributed now says rank 1 of 2"):
        D.check_unchanged(built)
    D.check_unchanged(D.Placement(0, 1, None, 1, "config"))  # the user's own: not checked
    monkeypatch.setattr(D, "_dist", lambda: None)
    with pytest.raises(RuntimeError, match="no longer initialised"):
        D.check_unchanged(D.Placement(1, 2, None, 1, "torch.distributed"))


def test_loader_keeps_the_resolved_config_and_placement(tiny_root, torchrun_env):
    torchrun_env(1, 2, 1, 2)
    cfg = LoaderConfig(root=tiny_root, device="cpu", num_workers=0, batch_size=4)
    assert cfg.rank is None  # resolved by the loader, not the config
    with create_loader("pageable", cfg) as ld:
        assert (ld.config.rank, ld.config.world_size) == (1, 2)
        assert ld.config.last_batch is LastBatchPolicy.PAD
        assert ld.placement.source == "environment" and len(ld) == 5  # ceil(37/2)=19 -> 5


def test_explicit_partial_warns_only_when_steps_differ(tiny_root):
    kw = dict(root=tiny_root, device="cpu", num_workers=0, last_batch="partial", world_size=3)
    with pytest.warns(RuntimeWarning, match="wait forever in all-reduce"):
        create_loader("pageable", LoaderConfig(rank=0, batch_size=4, **kw)).close()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        create_loader("pageable", LoaderConfig(rank=0, batch_size=13, **kw)).close()  # 1/1/1


def test_every_backend_resolves_cuda_to_the_local_rank(torchrun_env, monkeypatch):
    """Regression: the backends resolved the device from the unresolved config ("cuda", the
    current device) and rank 1 of a job that never called set_device ran on cuda:0."""
    from pipelines.device import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    torchrun_env(1, 2, 1, 2)
    cfg = LoaderConfig(root="x")
    for backend in ("dali", "pinned", "pageable"):
        assert resolve_device(cfg, backend) == torch.device("cuda", 1)
