"""Indexing shared by every backend: the file listing, the epoch order, the shard and the batches.

NOTE [epoch and shard semantics]
Every backend asks this module which samples to read, in which order, so all of them visit exactly
the same files, each exactly once per epoch (per the last-batch policy):

1. ``list_samples(root)`` (``pipelines.sources.folder``): sorted class folders give the class indices;
   files inside are sorted; the config's ``extensions`` (JPEG, PNG, WebP, BMP by default) in any
   case are kept.
2. ``epoch_order``: a full permutation drawn from ``numpy.random.default_rng((seed, epoch))``
   (identity when ``shuffle=False``). Same (seed, epoch) -> same order on every rank and backend.
3. ``shard_indices``: rank ``r`` of ``w`` takes ``order[r::w]``. With ``DROP`` the order is first
   cut to a multiple of ``w`` and with ``PAD`` it is wrapped up to one, so every rank gets the same
   count (as ``DistributedSampler`` does); with ``PARTIAL`` shards may differ by one sample, and
   so may the ranks' batch counts (which hangs DDP). ``PAD`` is the default with several ranks
   (``pipelines.placement``).
4. ``epoch_batches``: the shard cut into batches under the ``LastBatchPolicy``.

Tar shards (``groups``: the samples of each shard, ``pipelines.sources.shards``) change steps 2 and 3
(``grouped_order``, ``contiguous_shard``, ``window_shuffle``): the shards are permuted, each
rank takes a contiguous slice of the concatenated stream (the same counts as above, so ``len()``
and the policies are unchanged), and its samples are shuffled within bounded windows. See
``pipelines.sources.shards`` NOTE [the plan for shards: what is exact].
"""
from __future__ import annotations

import math

import numpy as np

from pipelines.config import LastBatchPolicy, int_option
from pipelines.sources.folder import DatasetRootError, list_samples  # noqa: F401  (re-exported)

MAX_EPOCH = 2**32  # every backend's range: dali's draws key a sample by a 32-bit epoch


def as_epoch(epoch) -> int:
    """``epoch`` as a plain int in ``[0, MAX_EPOCH)`` (numpy integers welcome), the range every
    backend serves, or ``ValueError`` naming it."""
    return int_option("epoch", epoch, 0, MAX_EPOCH)


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


def grouped_order(groups: np.ndarray, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The samples of the groups (consecutive runs of ``groups[g]`` indices), the groups in an
    order drawn from ``(seed, epoch)`` (in order when ``shuffle=False``)."""
    starts = np.concatenate([[0], np.cumsum(groups)[:-1]]).astype(np.int64)
    gs = (np.random.default_rng((seed, epoch)).permutation(len(groups)) if shuffle
          else np.arange(len(groups)))
    parts = [np.arange(starts[g], starts[g] + groups[g], dtype=np.int64) for g in gs]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def contiguous_shard(order: np.ndarray, *, rank: int, world_size: int,
                     policy: LastBatchPolicy) -> np.ndarray:
    """Rank ``rank``'s contiguous slice of ``order``, of the size ``shard_indices`` gives."""
    n = len(order)
    if world_size == 1:
        return order
    if policy is LastBatchPolicy.PAD:
        per = math.ceil(n / world_size)
        return np.resize(order, per * world_size)[rank * per:(rank + 1) * per]
    if policy is LastBatchPolicy.DROP:
        per = n // world_size
        return order[rank * per:(rank + 1) * per]
    sizes = [len(range(q, n, world_size)) for q in range(world_size)]
    start = sum(sizes[:rank])
    return order[start:start + sizes[rank]]


def window_shuffle(shard: np.ndarray, window: int, rng: np.random.Generator) -> np.ndarray:
    """``shard`` with each run of ``window`` consecutive items permuted (a bounded shuffle)."""
    out = shard.copy()
    for a in range(0, len(out), window):
        out[a:a + window] = rng.permutation(out[a:a + window])
    return out


def _cut(shard: np.ndarray, ok: np.ndarray, batch_size: int, policy: LastBatchPolicy
         ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    n = len(shard)
    full = n // batch_size
    batches = [shard[i * batch_size : (i + 1) * batch_size] for i in range(full)]
    valid = [ok[i * batch_size : (i + 1) * batch_size] for i in range(full)]
    rest, rest_ok = shard[full * batch_size :], ok[full * batch_size :]
    if len(rest) and policy is not LastBatchPolicy.DROP:
        if policy is LastBatchPolicy.PAD:
            pad = batch_size - len(rest)
            rest = np.resize(shard, full * batch_size + batch_size)[full * batch_size :]
            rest_ok = np.concatenate([rest_ok, np.zeros(pad, bool)])
        batches.append(rest)
        valid.append(rest_ok)
    return batches, valid


def epoch_plan(
    n: int,
    *,
    batch_size: int,
    seed: int,
    epoch: int,
    shuffle: bool,
    policy: LastBatchPolicy,
    rank: int = 0,
    world_size: int = 1,
    groups: np.ndarray | None = None,
    window: int = 8192,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``(batches, valid)``: the batches (arrays of dataset indices) that rank ``rank`` reads in
    ``epoch``, and per batch a bool array, ``False`` for the samples that ``PAD`` repeats (to
    give every rank the same count, or a full last batch): over all ranks the ``True`` ones
    are every sample once. With ``groups`` (tar shards, module doc) a grouped order, contiguous
    slices and a ``window`` shuffle.

    Every step works on positions in the epoch's order, padded to the ranks' total, so a
    repeat is told from its original: position ``p`` holds ``order[p % n]``, valid ``p < n``."""
    total = n
    if world_size > 1 and policy is LastBatchPolicy.PAD:
        total = math.ceil(n / world_size) * world_size
    pos = np.arange(total, dtype=np.int64)
    if groups is None:
        order = epoch_order(n, seed=seed, epoch=epoch, shuffle=shuffle)
        mine = shard_indices(pos, rank=rank, world_size=world_size, policy=policy)
    else:
        if int(np.sum(groups)) != n:
            raise ValueError(f"groups hold {int(np.sum(groups))} samples, not n={n}")
        order = grouped_order(groups, seed=seed, epoch=epoch, shuffle=shuffle)
        mine = contiguous_shard(pos, rank=rank, world_size=world_size, policy=policy)
        if shuffle:
            rng = np.random.default_rng((seed, epoch, rank, world_size, 0x5A4D))
            mine = window_shuffle(mine, window, rng)
    shard = order[mine % n] if n else mine
    return _cut(shard, mine < n, batch_size, policy)


def epoch_batches(n: int, **kw) -> list[np.ndarray]:
    """The batches of ``epoch_plan`` (same arguments)."""
    return epoch_plan(n, **kw)[0]


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


def _resolved(config):
    return config if config.is_resolved else config.resolved()


def unequal_steps(n: int, config) -> tuple[int, int] | None:
    """``(most, fewest)`` batches per epoch across ranks when they differ, else ``None``."""
    c = _resolved(config)
    if c.world_size == 1:
        return None
    counts = {num_batches(n, batch_size=c.batch_size, policy=c.last_batch, rank=r,
                          world_size=c.world_size) for r in (0, c.world_size - 1)}
    return (max(counts), min(counts)) if len(counts) > 1 else None


def config_batches(n: int, config, epoch: int, groups: np.ndarray | None = None
                   ) -> list[np.ndarray]:
    """``epoch_batches`` with the order, shard and policy of a ``LoaderConfig`` (``groups``:
    the samples per tar shard, or ``None``)."""
    c = _resolved(config)
    return epoch_batches(n, batch_size=c.batch_size, seed=c.seed, epoch=epoch, shuffle=c.shuffle,
                         policy=c.last_batch, rank=c.rank, world_size=c.world_size,
                         groups=groups, window=c.shuffle_window)


def config_plan(n: int, config, epoch: int, groups: np.ndarray | None = None
                ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``epoch_plan`` (the batches, and per batch ``False`` for the samples ``PAD`` repeats)
    with the order, shard and policy of a ``LoaderConfig``."""
    c = _resolved(config)
    return epoch_plan(n, batch_size=c.batch_size, seed=c.seed, epoch=epoch, shuffle=c.shuffle,
                      policy=c.last_batch, rank=c.rank, world_size=c.world_size,
                      groups=groups, window=c.shuffle_window)


def config_valid(n: int, config, epoch: int, groups: np.ndarray | None = None
                 ) -> list[np.ndarray]:
    """Per batch of ``config_batches``, ``False`` for the samples ``PAD`` repeats
    (``epoch_plan``)."""
    return config_plan(n, config, epoch, groups)[1]


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
