"""``Placement``: where this process sits in a distributed job, and the defaults that follow.

NOTE [placement]
A loader reads rank ``r`` of ``w``'s shard, on ``cuda:LOCAL_RANK``, with a CPU budget of the
host's cores divided by ``LOCAL_WORLD_SIZE``. Rank and world size are resolved when the loader
is built (``create_loader``), not when the config is made, in this order:

1. the config's own ``rank=`` / ``world_size=`` (``source="config"``);
2. ``torch.distributed`` when it is initialised (``"torch.distributed"``);
3. torchrun's environment: ``RANK``, ``WORLD_SIZE`` (``"environment"``), so a config or a
   loader made before ``init_process_group`` still shards correctly under torchrun. They come
   as a pair: one without the other (and without the config giving the missing one) is a
   ``ValueError`` naming the missing variable, not rank 0 of the world size on every process;
4. otherwise one process: rank 0 of 1 (``"single process"``).

``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` come from the environment only (torch.distributed does
not know them). Every ``iter()`` compares the placement with ``torch.distributed`` again
(``check_unchanged``): a loader that was built as one process and then iterated in a job of
two raises instead of reading the whole dataset on every rank.

What a resolved config gets (``pipelines.config.resolve``):

* ``last_batch=None`` (the default) becomes ``PAD`` with several ranks, so every rank yields
  the same number of batches as ``DistributedSampler`` does (a rank with one batch more would
  wait forever in DDP's all-reduce), and ``PARTIAL`` with one rank.
* ``device="cuda"`` becomes ``cuda:LOCAL_RANK`` when ``LOCAL_RANK`` is set (``cuda:0`` when
  the process sees one GPU, as with per-task GPU binding), for every backend.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

SOURCES = ("config", "torch.distributed", "environment", "single process")


def env_int(name: str, lo: int = 0) -> int | None:
    """``int(os.environ[name])``, ``None`` when unset, or a ``ValueError`` naming the variable."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        v = int(raw)
    except ValueError:
        v = None
    if v is None or v < lo:
        raise ValueError(f"{name}={raw!r} in the environment must be an int >= {lo}")
    return v


def local_world_size() -> int:
    """Processes of this job on this host: ``LOCAL_WORLD_SIZE`` (torchrun sets it), else 1."""
    return env_int("LOCAL_WORLD_SIZE", 1) or 1


def _dist() -> tuple[int, int] | None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


@dataclass(frozen=True)
class Placement:
    """This process's shard and device slot.

    Attributes:
        rank, world_size: the shard (``rank`` in ``[0, world_size)``).
        local_rank: the process's index on its host (``LOCAL_RANK``), ``None`` when unknown.
        local_world_size: processes of the job on this host (``LOCAL_WORLD_SIZE``, else 1).
        source: where rank and world size came from (one of ``SOURCES``).
    """

    rank: int
    world_size: int
    local_rank: int | None
    local_world_size: int
    source: str

    def describe(self) -> str:
        return f"rank {self.rank} of {self.world_size} (from {self.source})"


def placement(rank: int | None = None, world_size: int | None = None) -> Placement:
    """Resolve the placement (module NOTE); ``rank``/``world_size`` given win."""
    lr, lw = env_int("LOCAL_RANK"), local_world_size()
    if rank is not None and world_size is not None:
        return Placement(rank, world_size, lr, lw, "config")
    d, env_world, env_rank = _dist(), env_int("WORLD_SIZE", 1), env_int("RANK")
    if d is not None:
        src, (r, w) = "torch.distributed", d
    elif env_world is not None or env_rank is not None:
        _check_pair(env_rank, env_world, rank, world_size)
        src = "environment"
        r = env_rank if env_rank is not None else 0
        w = env_world if env_world is not None else 1
    else:
        src, r, w = "single process", 0, 1
    if rank is not None or world_size is not None:
        src = "config"
    return Placement(r if rank is None else rank, w if world_size is None else world_size,
                     lr, lw, src)


def _check_pair(env_rank: int | None, env_world: int | None, rank: int | None,
                world_size: int | None) -> None:
    """Refuse half of torchrun's pair (module NOTE): ``RANK`` without ``WORLD_SIZE`` or the
    reverse, unless the config gives the missing one."""
    for name, have, given in (("WORLD_SIZE", env_world, world_size), ("RANK", env_rank, rank)):
        if have is None and given is None:
            other = "RANK" if name == "WORLD_SIZE" else "WORLD_SIZE"
            raise ValueError(
                f"{other}={os.environ.get(other)!r} is set in the environment but {name} is not; "
                f"set both (torchrun does), unset {other}, or pass rank= and world_size= to "
                "LoaderConfig")


def check_unchanged(p: Placement) -> None:
    """Raise ``RuntimeError`` when ``torch.distributed`` now disagrees with ``p`` (module NOTE);
    a placement the config set explicitly is the user's and is not checked."""
    if p.source == "config":
        return
    d = _dist()
    now = d if d is not None else ((p.rank, p.world_size) if p.source != "torch.distributed"
                                   else None)
    if now == (p.rank, p.world_size):
        return
    said = ("torch.distributed is no longer initialised" if now is None
            else f"torch.distributed now says rank {now[0]} of {now[1]}")
    raise RuntimeError(
        f"this loader was built as {p.describe()}, but {said}; build the loader after "
        "init_process_group (or under torchrun), or pass rank= and world_size= to LoaderConfig")


def local_device(device: str, p: Placement) -> str:
    """``"cuda"`` -> ``"cuda:LOCAL_RANK"`` (module NOTE); anything else is returned as it is.

    Raises:
        ValueError: ``LOCAL_RANK`` names a GPU this process cannot see.
    """
    if device != "cuda" or p.local_rank is None or not torch.cuda.is_available():
        return device
    n = torch.cuda.device_count()
    if p.local_rank < n:
        return f"cuda:{p.local_rank}"
    if n == 1:  # one visible GPU per process (CUDA_VISIBLE_DEVICES set per rank)
        return "cuda:0"
    raise ValueError(f"device='cuda' means cuda:LOCAL_RANK, but LOCAL_RANK={p.local_rank} and "
                     f"this process sees {n} CUDA devices; pass device='cuda:N'")
