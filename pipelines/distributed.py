"""Listing once across the ranks of a job (``from_rank0``).

NOTE [listing once]
When the placement comes from an initialised ``torch.distributed`` with several ranks, only
rank 0 lists the dataset (walks the folder, reads the file list, indexes the shards); the others
receive its listing with ``broadcast_object_list`` (``from_rank0``), so a job of N ranks walks a
network filesystem once, not N times. A listing error on rank 0 is sent too and raised on every
rank. Building a loader is then a collective call: every rank of the default group must build
it, in the same order (as DDP's constructor must be). ``GPU_FEED_SHARED_LISTING=0`` turns this
off (each rank lists for itself, as a loader whose rank and world size are given in its config,
or come from torchrun's environment before ``init_process_group``, always does).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import torch

from pipelines.placement import Placement

T = TypeVar("T")


def shares_listing(p: Placement) -> bool:
    """Whether rank 0 lists for every rank (NOTE [listing once])."""
    off = os.environ.get("GPU_FEED_SHARED_LISTING", "1").strip().lower() in ("0", "off", "no",
                                                                             "false")
    return p.source == "torch.distributed" and p.world_size > 1 and not off


def from_rank0(make: Callable[[], T], p: Placement) -> T:
    """``make()`` run on rank 0 and its result, or its exception, given to every rank
    (NOTE [listing once]); just ``make()`` when the listing is not shared."""
    if not shares_listing(p):
        return make()
    import torch.distributed as dist

    box: list = [None]
    if p.rank == 0:
        try:
            box = [(True, make())]
        except Exception as e:  # noqa: BLE001 - sent, then raised on every rank
            box = [(False, e)]
    device = None
    if dist.get_backend() == "nccl":  # its objects travel through this rank's GPU
        device = torch.device("cuda", p.local_rank if p.local_rank is not None
                              and p.local_rank < torch.cuda.device_count()
                              else torch.cuda.current_device())
    dist.broadcast_object_list(box, src=0, device=device)
    ok, value = box[0]
    if not ok:
        raise value
    return value
