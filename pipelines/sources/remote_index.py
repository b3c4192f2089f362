"""The index of a remote shard: the shard copied once to a temporary file and indexed there.

NOTE [remote index]
A remote shard is indexed by the same code as a local one (``shards.index_shard``: the same
offsets, sizes, labels and damage checks): it is copied once to a temporary local file
(``remote.download``, retried as NOTE [faults] in ``remote`` says), indexed, and the copy is
deleted (or, with ``LoaderConfig.shard_cache``, kept there for the first epoch). The index is
cached in ``<listing cache>/shards/`` keyed by the URL without credentials and checked against
``remote.stamp``: the size and ETag or Last-Modified the server gives (a ``pipe:`` command by
its text: it is indexed again when the cache is cleared). Nothing is written to the storage.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time

import numpy as np

from pipelines.sources import remote
from pipelines.sources.cache import cache_dir

STAMPS: dict[str, np.ndarray] = {}  # the stamp each shard was last indexed at


def _cache_file(name: str):
    from pipelines.sources.shards import INDEX_VERSION

    folder = cache_dir()
    if folder is None:
        return None
    raw = f"{INDEX_VERSION}\0remote\0{name}".encode("utf-8", "surrogateescape")
    return folder / "shards" / f"{hashlib.sha256(raw).hexdigest()[:32]}.npz"


def cached_index(name: str):
    """The ``ShardIndex`` of remote shard ``name`` (a redacted URL from ``remote.register``),
    from the cache while its stamp is unchanged (module NOTE)."""
    from pipelines.sources.shards import ShardError, _load_index, index_shard, store_index

    stamp = STAMPS[name] = remote.stamp(name)
    file = _cache_file(name)
    if file is not None:
        idx = _load_index(file, stamp)
        if idx is not None:
            return idx
    tmp = tempfile.mkdtemp(prefix="gpu-feed-index-")
    try:
        local = os.path.join(tmp, "shard.tar")
        remote.download(name, local, expect=int(stamp[0]))
        try:
            idx = index_shard(local)
        except ShardError as e:
            raise ShardError(str(e).replace(repr(local), repr(name))) from None
        keep = spool_file(name, stamp)
        if keep is not None and not os.path.exists(keep):
            try:
                os.makedirs(os.path.dirname(keep), exist_ok=True)
                os.replace(local, keep)
                os.utime(keep, (time.time(), time.time()))
            except OSError:
                pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if file is not None:
        store_index(file, stamp, idx)
    return idx


def spool_file(name: str, stamp: np.ndarray) -> str | None:
    """Where ``LoaderConfig.shard_cache`` keeps shard ``name`` at ``stamp`` (``None`` without
    a shard cache)."""
    _, storage = remote.real(name)
    if not storage.cache:
        return None
    return os.path.join(storage.cache, spool_key(name, stamp) + ".tar")


def spool_key(name: str, stamp: np.ndarray) -> str:
    """A file name for shard ``name`` at ``stamp``: a changed shard is another file."""
    raw = f"{name}\0{int(stamp[0])}\0{int(stamp[1])}".encode("utf-8", "surrogateescape")
    return hashlib.sha256(raw).hexdigest()[:32]


remote.INDEXER = cached_index
