"""The shard cache's own files: the ledger of the copies it wrote, and the trim that removes
only those.

NOTE [shard cache]
``LoaderConfig.shard_cache`` is a folder of the user's, which may hold anything else. The cache
names each copy of a remote shard itself (``remote_index.spool_key``: 32 hex digits and
``.tar``), writes it through a temporary file of its own process and thread (``temp_path``,
then an atomic rename: ranks that share a cache on a host never write the same partial file)
and lists the name in the ledger, ``.gpu-feed-shards`` in that folder, before the rename.
``trim`` removes only files that are both named so and listed: a ``.tar`` of the user's, a file
named like a copy but not listed, and any other file stay, whatever the bound. A copy that
indexing left in the folder (``remote_index``) is listed when the spool first uses it. A
ledger line whose file is gone is harmless; the ledger is rewritten without them when they
outnumber the copies (a line lost to a concurrent rewrite only keeps that copy from being
trimmed until the spool uses it again).
"""
from __future__ import annotations

import os
import re
import threading

LEDGER = ".gpu-feed-shards"
_NAME = re.compile(r"[0-9a-f]{32}\.tar")


def temp_path(folder: str, name: str) -> str:
    """A file in ``folder`` for copy ``name`` that only this process and thread writes."""
    return os.path.join(folder, f".{name}.{os.getpid()}-{threading.get_ident()}.tmp")


def record(folder: str, name: str) -> None:
    """List copy ``name`` in ``folder``'s ledger (one short append: atomic between ranks)."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"name={name!r} is not a shard cache entry (32 hex digits, .tar)")
    with open(os.path.join(folder, LEDGER), "a") as f:
        f.write(name + "\n")


def listed(folder: str) -> set[str]:
    """The copies ``folder``'s ledger lists (names only; some may be gone)."""
    try:
        with open(os.path.join(folder, LEDGER)) as f:
            return {line.strip() for line in f if _NAME.fullmatch(line.strip())}
    except FileNotFoundError:
        return set()


def trim(folder: str, limit: int, keep: set[str]) -> None:
    """Remove the least recently used of ``folder``'s own copies (listed in its ledger) until
    they hold at most ``limit`` bytes; never one in ``keep``, never any other file."""
    entries = []
    names = listed(folder)
    for name in names:
        try:
            st = os.stat(os.path.join(folder, name))
        except FileNotFoundError:
            continue
        entries.append((st.st_mtime, st.st_size, name))
    total = sum(size for _, size, _ in entries)
    for _, size, name in sorted(entries):
        if total <= limit:
            break
        if name not in keep:
            try:
                os.unlink(os.path.join(folder, name))
            except FileNotFoundError:
                pass
            total -= size
    if len(names) > 2 * len(entries) + 64:
        _rewrite(folder)


def _rewrite(folder: str) -> None:
    """The ledger without the lines of copies that are gone (temporary file, then rename)."""
    alive = sorted(n for n in listed(folder) if os.path.exists(os.path.join(folder, n)))
    tmp = temp_path(folder, LEDGER)
    try:
        with open(tmp, "w") as f:
            f.writelines(n + "\n" for n in alive)
        os.replace(tmp, os.path.join(folder, LEDGER))
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
