"""Indexing shared by every backend: the file listing, the epoch order, the shard and the batches.

NOTE [epoch and shard semantics]
Every backend asks this module which samples to read, in which order, so all of them visit exactly
the same files, each exactly once per epoch (per the last-batch policy):

1. ``list_samples(root)``: sorted class folders give the class indices; files inside are sorted;
   ``.jpg`` / ``.jpeg`` in any case are kept.
2. ``epoch_order``: a full permutation drawn from ``numpy.random.default_rng((seed, epoch))``
   (identity when ``shuffle=False``). Same (seed, epoch) -> same order on every rank and backend.
3. ``shard_indices``: rank ``r`` of ``w`` takes ``order[r::w]``. With ``DROP`` the order is first
   cut to a multiple of ``w`` and with ``PAD`` it is wrapped up to one, so every rank gets the same
   count (as ``DistributedSampler`` does); with ``PARTIAL`` shards may differ by one sample.
4. ``epoch_batches``: the shard cut into batches under the ``LastBatchPolicy``.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import List, Tuple

import numpy as np

from .config import LastBatchPolicy

IMAGE_EXTENSIONS = (".jpg", ".jpeg")


class DatasetRootError(ValueError):
    """The dataset root is missing, empty or holds no images."""


def list_samples(root: str | os.PathLike) -> Tuple[List[str], np.ndarray, List[str]]:
    """List an ImageFolder root.

    Args:
        root: a directory with one sub-directory per class.

    Returns:
        ``(paths, labels, classes)``: sorted absolute paths, their int64 class indices and the
        sorted class names.

    Raises:
        DatasetRootError: the root is missing, not a directory, or holds no ``.jpg``/``.jpeg``.
    """
    root = Path(root)
    if not root.exists():
        raise DatasetRootError(f"root={str(root)!r} does not exist")
    if not root.is_dir():
        raise DatasetRootError(f"root={str(root)!r} is not a directory")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise DatasetRootError(
            f"root={str(root)!r} has no class sub-folders; expected ImageFolder layout root/<class>/*.jpg"
        )
    paths: List[str] = []
    labels: List[int] = []
    skipped_ext = 0
    for ci, c in enumerate(classes):
        for dirpath, dirnames, filenames in os.walk(root / c, followlinks=True):
            dirnames.sort()
            for f in sorted(filenames):
                if f.lower().endswith(IMAGE_EXTENSIONS):
                    paths.append(os.path.join(dirpath, f))
                    labels.append(ci)
                elif not f.startswith("."):
                    skipped_ext += 1
    if not paths:
        extra = f" ({skipped_ext} files with other extensions were ignored)" if skipped_ext else ""
        raise DatasetRootError(f"root={str(root)!r} holds no .jpg/.jpeg files{extra}")
    return paths, np.asarray(labels, dtype=np.int64), classes


def epoch_order(n: int, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The global visiting order for one epoch: a full permutation of ``range(n)``."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng((seed, epoch)).permutation(n).astype(np.int64)


def shard_indices(
    order: np.ndarray, *, rank: int, world_size: int, policy: LastBatchPolicy
) -> np.ndarray:
    """Rank ``rank``'s part of ``order`` (see the module note)."""
    n = len(order)
    if world_size > 1:
        if policy is LastBatchPolicy.DROP:
            order = order[: (n // world_size) * world_size]
        elif policy is LastBatchPolicy.PAD:
            total = math.ceil(n / world_size) * world_size
            order = np.resize(order, total)  # np.resize repeats from the start
    return order[rank::world_size]


def _cut(shard: np.ndarray, batch_size: int, policy: LastBatchPolicy) -> List[np.ndarray]:
    n = len(shard)
    full = n // batch_size
    batches = [shard[i * batch_size : (i + 1) * batch_size] for i in range(full)]
    rest = shard[full * batch_size :]
    if len(rest) and policy is not LastBatchPolicy.DROP:
        if policy is LastBatchPolicy.PAD:
            rest = np.resize(shard, full * batch_size + batch_size)[full * batch_size :]
        batches.append(rest)
    return batches


def epoch_batches(
    n: int,
    *,
    batch_size: int,
    seed: int,
    epoch: int,
    shuffle: bool,
    policy: LastBatchPolicy,
    rank: int = 0,
    world_size: int = 1,
) -> List[np.ndarray]:
    """The batches (arrays of dataset indices) that rank ``rank`` reads in ``epoch``."""
    order = epoch_order(n, seed=seed, epoch=epoch, shuffle=shuffle)
    shard = shard_indices(order, rank=rank, world_size=world_size, policy=policy)
    return _cut(shard, batch_size, policy)


def num_batches(
    n: int, *, batch_size: int, policy: LastBatchPolicy, rank: int = 0, world_size: int = 1
) -> int:
    """``len()`` of a loader: batches per epoch under ``policy`` (no permutation needed)."""
    if world_size > 1:
        if policy is LastBatchPolicy.DROP:
            n = n // world_size
        elif policy is LastBatchPolicy.PAD:
            n = math.ceil(n / world_size)
        else:
            n = len(range(rank, n, world_size))
    if policy is LastBatchPolicy.DROP:
        return n // batch_size
    return math.ceil(n / batch_size)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed for one sample's augmentation, from (seed, epoch, dataset index).

    The torch backends seed each sample's transform with it, so the augmentation does not depend
    on the number of workers or on which worker ran the sample.
    """
    ss = np.random.SeedSequence((seed & 0xFFFFFFFF, epoch, index))
    return int(ss.generate_state(1, dtype=np.uint64)[0]) >> 1


def config_batches(n: int, config, epoch: int) -> List[np.ndarray]:
    """``epoch_batches`` with the order, shard and policy of a ``LoaderConfig``."""
    c = config
    return epoch_batches(n, batch_size=c.batch_size, seed=c.seed, epoch=epoch, shuffle=c.shuffle,
                         policy=c.last_batch, rank=c.rank, world_size=c.world_size)


def config_len(n: int, config) -> int:
    """``num_batches`` for a ``LoaderConfig``: the ``len()`` of every backend."""
    c = config
    return num_batches(n, batch_size=c.batch_size, policy=c.last_batch, rank=c.rank,
                       world_size=c.world_size)
