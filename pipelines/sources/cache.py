"""The listing cache: a folder is walked once, then read back from an index file.

NOTE [listing cache]
Walking a large ImageFolder on a network filesystem is slow, and every loader on every rank did
it again (docs/results/cpu/listing-1m.json measures a walk and a cache hit). ``cached_listing``
keeps each folder's listing (paths, labels, classes, and the warnings the walk gave) in
``<cache>/listings/<key>.npz``, keyed by the root's real path, the extensions, ``allow_empty``
and, for a flat folder (no class folders: ``walk_folder(flat=True)``), that. The paths are
stored relative to the root and joined, on every read, onto the root as this caller spells it:
one entry serves a relative root from any working directory, a symlinked root and a second mount
of the same folder, and each gets exactly the paths its own walk would give (so the resume
fingerprint, ``LoaderBase._plan_id``, matches with the cache on or off). The warnings are stored
with the walk's spelling of the root and given back with the caller's. The entry also records
the modification time of the root and of every folder the walk entered (by real path): adding,
removing or renaming a file or a folder changes its parent's mtime, so a later call stats those
folders (a few thousand ``stat`` calls, not a walk) and walks again when any changed or
vanished. Editing a file's bytes changes no listing and keeps the entry. A folder changed in the
last ``RACY_S`` seconds before the walk ended is not trusted (a file system may not tick its
mtime between two quick changes): such a listing is not cached, so the next call walks again.
The cache folder is ``$GPU_FEED_LISTING_CACHE``, else ``$GPU_FEED_CACHE/listings``, else
``$XDG_CACHE_HOME/gpu-feed/listings`` (``~/.cache``); ``GPU_FEED_LISTING_CACHE=off`` turns it
off.

An entry holds the walk's own classes (the sorted class folders): ``LoaderConfig.classes`` is
applied to the listing after it is read (``pipelines.sources.classes``), so one entry serves
every class list, and a listing made for one list is never served to another.

The cache can only cost a walk, never change or refuse a listing. An entry that cannot be read
for any reason (zero bytes, truncated, not an ``.npz``, arrays missing, of the wrong type or of
inconsistent lengths, a label outside the classes) is a miss: the folder is walked and the entry
written again. An entry is written durably (``write_npz``: a temporary file in the cache folder,
flushed and ``fsync``-ed, renamed over the entry with ``os.replace``, then the folder is
``fsync``-ed), so a crash leaves the old entry or the new one, never half of one. An entry that
cannot be written (a read-only cache) costs a walk next time, nothing else. ``VERSION`` is part
of the key: entries of version 1 (absolute paths of the first caller's spelling) are never read.
"""
from __future__ import annotations

import hashlib
import os
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

VERSION = 2  # 2: paths relative to the root (module NOTE)
RACY_S = 2.0  # folders modified this recently are not trusted to show a later change
Listing = tuple[list[str], np.ndarray, list[str]]


def cache_dir() -> Path | None:
    """The listings folder, or ``None`` when the cache is off."""
    env = os.environ.get("GPU_FEED_LISTING_CACHE")
    if env is not None and env.strip().lower() in ("off", "0", "no", "false"):
        return None
    if env:
        return Path(env)
    return cache_base() / "listings"


def cache_base() -> Path:
    """The project's cache folder: ``$GPU_FEED_CACHE``, else ``$XDG_CACHE_HOME/gpu-feed``
    (``~/.cache``)."""
    return Path(os.environ.get("GPU_FEED_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "gpu-feed"))


def _key(root: str, extensions: tuple[str, ...], allow_empty: bool, flat: bool = False) -> str:
    raw = f"{VERSION}\0{os.path.realpath(root)}\0{','.join(extensions)}\0{allow_empty}"
    raw += "\0flat" if flat else ""  # a flat listing (no classes) is not a class listing
    return hashlib.sha256(raw.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def _mtimes(dirs: Iterable[str]) -> np.ndarray | None:
    out = []
    for d in dirs:
        try:
            out.append(os.stat(d).st_mtime_ns)
        except OSError:
            return None
    return np.asarray(out, dtype=np.int64)


def _join(items: Iterable[str]) -> np.ndarray:
    return np.frombuffer("\0".join(items).encode("utf-8", "surrogateescape"), dtype=np.uint8)


def _split(blob: np.ndarray) -> list[str]:
    if not isinstance(blob, np.ndarray) or blob.dtype != np.uint8 or blob.ndim != 1:
        raise ValueError("not a string blob")
    text = blob.tobytes().decode("utf-8", "surrogateescape")
    return text.split("\0") if text else []


def _prefix(root) -> str:
    """What every path of ``walk_folder(root)`` starts with: the root as ``Path`` spells it,
    and a separator."""
    return os.path.join(os.fspath(Path(root)), "")


def _respell(note: str, old: str, new: str) -> str:
    """A walk's warning about the root spelled ``old`` (a ``_prefix``), as the walk of the root
    spelled ``new`` would have given it."""
    if old == new:
        return note
    note = note.replace(f"root={old.rstrip(os.sep) or os.sep!r}", f"root={new.rstrip(os.sep) or os.sep!r}")
    return re.sub(r"(?:(?<=\s)|^)" + re.escape(old), lambda m: new, note)


def write_npz(file: Path, **arrays) -> None:
    """Write ``file`` durably (module NOTE): a temporary file beside it, flushed and fsync-ed,
    then ``os.replace``-d over it, then the folder fsync-ed where the OS allows. Raises
    ``OSError`` when the folder cannot be written (the temporary file is removed)."""
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.{os.getpid()}.{threading.get_ident()}."
                         f"{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, file)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # the rename itself survives a crash once the folder is synced
        dfd = os.open(file.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass  # some file systems (and every Windows folder) refuse: the entry is still whole
    finally:
        os.close(dfd)


def _load(file: Path, prefix: str) -> tuple[Listing, list[str]] | None:
    """The entry's listing, its paths joined onto ``prefix``, and its warnings; ``None`` when
    the entry is missing, stale or damaged in any way (module NOTE: never an error)."""
    try:  # opened here: np.load leaks its own handle when the zip is damaged
        with open(file, "rb") as f, np.load(f, allow_pickle=False) as z:
            dirs = _split(z["dirs"])
            mtimes = z["mtimes"]
            if mtimes.dtype != np.int64 or mtimes.shape != (len(dirs),):
                return None
            now = _mtimes(dirs)
            if now is None or not np.array_equal(now, mtimes):
                return None
            rel = _split(z["paths"])
            labels = z["labels"]
            classes = _split(z["classes"])
            old = _split(z["root"])
            notes = _split(z["warnings"])
    except Exception:  # noqa: BLE001 - zero bytes, truncated, garbage, missing arrays: a miss
        return None
    if (len(old) != 1 or not rel or labels.dtype != np.int64 or labels.shape != (len(rel),)
            or int(labels.min()) < 0 or int(labels.max()) >= max(len(classes), 1)
            or any(not r or os.path.isabs(r) for r in rel)):
        return None
    paths = [prefix + r for r in rel]
    return (paths, labels.copy(), classes), [_respell(n, old[0], prefix) for n in notes]


def _save(file: Path, prefix: str, listing: Listing, dirs: list[str], notes: list[str]) -> None:
    mt = _mtimes(dirs)
    if mt is None or int(mt.max(initial=0)) > time.time_ns() - int(RACY_S * 1e9):
        return  # vanished, or too fresh to trust (module NOTE)
    paths, labels, classes = listing
    if not all(p.startswith(prefix) for p in paths):
        return  # not a walk of this root: nothing to store relative to it
    rel = [p[len(prefix):] for p in paths]
    try:
        write_npz(file, root=_join([prefix]), paths=_join(rel),
                  labels=np.asarray(labels, np.int64), classes=_join(classes), dirs=_join(dirs),
                  mtimes=mt, warnings=_join(notes))
    except (OSError, ValueError):
        pass  # a read-only cache: the next call walks again (module NOTE)


def cached_listing(root, extensions: tuple[str, ...], allow_empty: bool,
                   walk: Callable[[], tuple[Listing, list[str]]], flat: bool = False) -> Listing:
    """The listing of ``root``: from the cache when every folder it saw is unchanged, else
    from ``walk()`` (which returns the listing and the folders it entered), then cached. The
    paths are those ``walk()`` gives for ``root`` as spelled here, whichever spelling made the
    entry (module NOTE). The walk's warnings are given again when the listing comes from the
    cache. ``flat``: the walk lists a folder without classes (a key of its own)."""
    try:
        prefix = _prefix(root)
    except TypeError:  # not a path: the walk says so
        return walk()[0]
    folder = cache_dir()
    file = folder / f"{_key(str(root), extensions, allow_empty, flat)}.npz" if folder else None
    hit = _load(file, prefix) if file is not None else None
    if hit is not None:
        listing, notes = hit
        for note in notes:
            warnings.warn(note, RuntimeWarning, stacklevel=3)
        return listing
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        listing, dirs = walk()
    notes = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if file is not None:
        _save(file, prefix, listing, [os.path.realpath(root)] + dirs, notes)
    return listing
