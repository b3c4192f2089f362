"""The suite as one job of ``torchrun``: every rank runs, rank 0 reports.

NOTE [the suite under torchrun] (docs/distributed.md)
``start`` joins the ranks in one process group (NCCL on GPUs, gloo on the CPU) and the step is
wrapped in ``DistributedDataParallel``. Every rank runs every variant on its own shard; ``merge``
sums the ranks' rates (the job's throughput), averages waits and idle, and keeps each rank's own
figures in ``Repeat.ranks``. Without torchrun's environment there is no process group.
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, replace
from typing import Any

import torch

from .results import VariantResult

RANK_FIELDS = ("samples_per_s", "loader_only_per_s", "wait_p50_ms", "wait_p95_ms", "idle_pct")


@dataclass(frozen=True)
class Job:
    """This process's place in the suite's job (one process: rank 0 of 1, no group)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    group: bool = False  # a process group was started here (and DDP wraps the step)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def nodes(self) -> int:
        return max(1, self.world // max(1, self.local_world))

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not self.group:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def all_agree(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every rank (a collective: NOTE [settling] in compare.runner)."""
        return all(self.gather(bool(flag)))

    def barrier(self) -> None:
        if self.group:
            import torch.distributed as dist

            dist.barrier()

    def finish(self) -> None:
        if self.group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def under_torchrun() -> bool:
    return all((os.environ.get(k) or "").strip() for k in ("WORLD_SIZE", "RANK"))  # as the loader


def start(device: str) -> Job:
    """Join torchrun's job (module NOTE), or return the one-process ``Job``."""
    if not under_torchrun():
        return Job()
    import torch.distributed as dist

    from pipelines.placement import placement

    p = placement()
    lr = p.local_rank or 0
    cuda = device.startswith("cuda") and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(lr)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return Job(dist.get_rank(), dist.get_world_size(), lr, p.local_world_size, True)


def wrap(module: torch.nn.Module, job: Job) -> torch.nn.Module:
    """``module`` in ``DistributedDataParallel`` when the job has a process group."""
    if not job.group:
        return module
    from torch.nn.parallel import DistributedDataParallel as DDP

    device = next(module.parameters()).device
    return DDP(module, device_ids=[device.index] if device.type == "cuda" else None)


def merge(parts: list[VariantResult]) -> VariantResult:
    """One ``VariantResult`` from every rank's (module NOTE); one part is returned as it is."""
    if len(parts) == 1:
        return parts[0]
    head = parts[0]
    reps = []
    for rs in zip(*(p.repeats for p in parts)):
        mean = lambda k, rs=rs: statistics.fmean(getattr(r, k) for r in rs)  # noqa: E731
        cpu = [r.cpu_util_pct for r in rs if r.cpu_util_pct is not None]
        nv = [r.nvml_util_pct for r in rs if r.nvml_util_pct is not None]
        reps.append(replace(
            rs[0],
            samples_per_s=sum(r.samples_per_s for r in rs),
            loader_only_per_s=sum(r.loader_only_per_s for r in rs),
            wait_p50_ms=mean("wait_p50_ms"), wait_p95_ms=mean("wait_p95_ms"),
            idle_pct=mean("idle_pct"),
            cpu_util_pct=statistics.fmean(cpu) if cpu else None,
            nvml_util_pct=statistics.fmean(nv) if nv else None,
            waits_ms=tuple(w for r in rs for w in r.waits_ms),
            ranks=tuple({k: getattr(r, k) for k in RANK_FIELDS} for r in rs),
            halves=(tuple(sum(h) for h in zip(*(r.halves for r in rs)))
                    if all(r.halves for r in rs) else None),  # the job's, like samples/s
            loader_only_halves=(tuple(sum(h) for h in zip(*(r.loader_only_halves for r in rs)))
                                if all(r.loader_only_halves for r in rs) else None),
        ))
    h2d = [p.h2d_bytes_per_sample for p in parts if p.h2d_bytes_per_sample is not None]
    return VariantResult(head.label, head.backend, dict(head.overrides),
                         statistics.fmean(h2d) if h2d else None, tuple(reps))
