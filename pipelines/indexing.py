"""Indexing shared by every backend: the file listing, the epoch order, the shard and the batches.

NOTE [epoch and shard semantics]
Every backend asks this module which samples to read, in which order, so all of them visit exactly
the same files, each exactly once per epoch (per the last-batch policy):

1. ``list_samples(root)`` (``pipelines.listing``): sorted class folders give the class indices;
   files inside are sorted; the config's ``extensions`` (JPEG, PNG, WebP, BMP by default) in any
   case are kept.
2. ``epoch_order``: a full permutation drawn from ``numpy.random.default_rng((seed, epoch))``
   (identity when ``shuffle=False``). Same (seed, epoch) -> same order on every rank and backend.
3. ``shard_indices``: rank ``r`` of ``w`` takes ``order[r::w]``. With ``DROP`` the order is first
   cut to a multiple of ``w`` and with ``PAD`` it is wrapped up to one, so every rank gets the same
   count (as ``DistributedSampler`` does); with ``PARTIAL`` shards may differ by one sample, and
   so may the ranks' batch counts (which hangs DDP). ``PAD`` is the default with several ranks
   (``pipelines.distributed``).
4. ``epoch_batches``: the shard cut into batches under the ``LastBatchPolicy``.
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import numpy as np

from .config import LastBatchPolicy, int_option
from .listing import DatasetRootError, list_samples  # noqa: F401  (re-exported)



def as_epoch(epoch) -> int:
    """``epoch`` as a plain int (numpy integers welcome), or ``ValueError`` naming it."""
    return int_option("epoch", epoch, 0)


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


def dali_seed(seed: int, rank: int, lane: int) -> int:
    """A 31-bit seed for DALI's augmentation RNG of pipeline ``lane`` on ``rank``, so ranks
    and lanes draw independent crops and flips from one user seed."""
    ss = np.random.SeedSequence((seed & 0xFFFFFFFF, rank, lane, 0xDA11))
    return int(ss.generate_state(1, dtype=np.uint32)[0]) >> 1


def _resolved(config):
    return config if config.is_resolved else config.resolved()


def unequal_steps(n: int, config) -> Optional[Tuple[int, int]]:
    """``(most, fewest)`` batches per epoch across ranks when they differ, else ``None``."""
    c = _resolved(config)
    if c.world_size == 1:
        return None
    counts = {num_batches(n, batch_size=c.batch_size, policy=c.last_batch, rank=r,
                          world_size=c.world_size) for r in (0, c.world_size - 1)}
    return (max(counts), min(counts)) if len(counts) > 1 else None


def config_batches(n: int, config, epoch: int) -> List[np.ndarray]:
    """``epoch_batches`` with the order, shard and policy of a ``LoaderConfig``."""
    c = _resolved(config)
    return epoch_batches(n, batch_size=c.batch_size, seed=c.seed, epoch=epoch, shuffle=c.shuffle,
                         policy=c.last_batch, rank=c.rank, world_size=c.world_size)


def config_len(n: int, config) -> int:
    """``num_batches`` for a ``LoaderConfig``: the ``len()`` of every backend."""
    c = _resolved(config)
    return num_batches(n, batch_size=c.batch_size, policy=c.last_batch, rank=c.rank,
                       world_size=c.world_size)


def check_nonempty(n: int, config) -> None:
    """Refuse a config whose epochs would be empty for this rank (``ValueError`` naming why)."""
    c = _resolved(config)
    if config_len(n, c) > 0:
        return
    shard = len(shard_indices(np.arange(n), rank=c.rank, world_size=c.world_size,
                              policy=c.last_batch))
    if shard == 0:
        raise ValueError(f"world_size={c.world_size} is larger than the dataset ({n} samples): "
                         f"rank {c.rank} would get no sample; use fewer ranks or "
                         "last_batch='pad'")
    raise ValueError(f"batch_size={c.batch_size} with last_batch='drop' gives no batch: rank "
                     f"{c.rank}'s shard holds {shard} of {n} samples; lower batch_size or use "
                     "last_batch='partial' or 'pad'")
