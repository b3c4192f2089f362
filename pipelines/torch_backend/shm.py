"""Fit DataLoader workers to /dev/shm, so a small one (Docker's 64 MB) never means a Bus error.

NOTE [/dev/shm]
Worker processes hand batches to the main process in shared memory (/dev/shm). When the tmpfs
fills up, the next page fault kills the worker with SIGBUS ("DataLoader worker killed by
signal: Bus error"). Switching ``torch.multiprocessing`` to the ``file_system`` strategy does
not help: it names the same /dev/shm segments differently. What helps is holding fewer batches
in flight: about ``num_workers * prefetch + 2`` batches live there at once. So before starting
workers we lower ``prefetch``, then ``num_workers`` (down to 0: load in the main process, no
shared memory) until that fits in 80% of this rank's share of the free space (the free space
divided by ``LOCAL_WORLD_SIZE``: every local rank of a torchrun job has its own workers), and
say so in one warning.
"""
from __future__ import annotations

import os
import warnings

SHM_PATH = "/dev/shm"
HEADROOM = 0.8


def shm_free_bytes(path: str = SHM_PATH) -> int | None:
    """Free bytes in /dev/shm, or ``None`` where there is none (not Linux)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def shm_need(num_workers: int, prefetch: int, batch_bytes: int) -> int:
    return (num_workers * prefetch + 2) * batch_bytes if num_workers > 0 else 0


def fit_to_shm(num_workers: int, prefetch: int, batch_bytes: int,
               free: int | None) -> tuple[int, int, str | None]:
    """``(num_workers, prefetch, warning or None)`` that fit in ``HEADROOM * free``."""
    if free is None or num_workers == 0:
        return num_workers, prefetch, None
    budget = HEADROOM * free
    w, p = num_workers, prefetch
    while p > 1 and shm_need(w, p, batch_bytes) > budget:
        p -= 1
    while w > 0 and shm_need(w, p, batch_bytes) > budget:
        w -= 1
    if (w, p) == (num_workers, prefetch):
        return w, p, None
    msg = (f"/dev/shm has {free / 2**20:.0f} MiB free but num_workers={num_workers} x "
           f"prefetch={prefetch} batches of {batch_bytes / 2**20:.1f} MiB need "
           f"{shm_need(num_workers, prefetch, batch_bytes) / 2**20:.0f} MiB; using "
           f"num_workers={w}, prefetch={p} to avoid a Bus error "
           "(enlarge it, e.g. docker run --shm-size=8g)")
    return w, p, msg


def rank_share(free: int | None, local_ranks: int) -> int | None:
    """This rank's share of ``free`` bytes when ``local_ranks`` processes share the host."""
    return None if free is None else free // max(1, local_ranks)


def fitted(num_workers: int, prefetch: int, batch_bytes: int) -> tuple[int, int]:
    """Apply :func:`fit_to_shm` to this rank's share of the real /dev/shm, warning when it
    changes anything."""
    from pipelines.placement import local_world_size

    lw = local_world_size()
    w, p, msg = fit_to_shm(num_workers, prefetch, batch_bytes,
                           rank_share(shm_free_bytes(), lw))
    if msg and lw > 1:
        msg = f"{lw} local ranks share /dev/shm; per rank: " + msg
    if msg:
        warnings.warn(msg, RuntimeWarning, stacklevel=4)
    return w, p
