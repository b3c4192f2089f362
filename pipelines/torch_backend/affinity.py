"""Each local rank's slice of the host's cores, for its DataLoader workers
(``TorchOptions.cpu_binding="rank"``).

NOTE [per-rank cores]
Under torchrun every rank's workers inherit the whole host's affinity, and the scheduler mixes
all of them (N ranks x ``num_workers`` processes, plus each rank's main process, pin thread and
NCCL threads) over every core. ``default_workers`` already gives each rank its share of the
cores in number; binding gives it those cores in place: the usable cores (this process's
affinity, in order) are split into ``LOCAL_WORLD_SIZE`` contiguous slices, as even as they
divide, and the workers of ``LOCAL_RANK`` run on slice ``LOCAL_RANK`` only. The main process is
left where it is: it runs the training step, and its threads are not ours to place. Why this
exists and what it changed: docs/results/h200x2/README.md.
"""
from __future__ import annotations

import os
from collections.abc import Sequence


def can_bind() -> bool:
    return hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def rank_cores(local_rank: int, local_world: int,
               cores: Sequence[int] | None = None) -> tuple[int, ...]:
    """Local rank ``local_rank``'s slice of ``cores`` (default: this process's affinity).

    Raises:
        ValueError: ``local_rank`` is outside ``[0, local_world)``, or there are fewer cores
            than local ranks (a slice would be empty).
    """
    if not 0 <= local_rank < local_world:
        raise ValueError(f"cpu_binding='rank': LOCAL_RANK={local_rank} must be in "
                         f"[0, LOCAL_WORLD_SIZE={local_world})")
    cores = sorted(os.sched_getaffinity(0) if cores is None else cores)
    if len(cores) < local_world:
        raise ValueError(f"cpu_binding='rank': {len(cores)} usable cores cannot be split among "
                         f"LOCAL_WORLD_SIZE={local_world} ranks; use cpu_binding='none'")
    lo = len(cores) * local_rank // local_world
    hi = len(cores) * (local_rank + 1) // local_world
    return tuple(cores[lo:hi])


def bind_worker(worker_id: int, cores: tuple[int, ...]) -> None:
    """DataLoader ``worker_init_fn``: run this worker on ``cores``."""
    os.sched_setaffinity(0, cores)
