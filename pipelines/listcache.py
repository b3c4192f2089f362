"""The listing cache: a folder is walked once, then read back from an index file.

NOTE [listing cache]
Walking a large ImageFolder on a network filesystem is slow, and every loader on every rank did
it again (docs/results/cpu/listing-1m.json measures a walk and a cache hit). ``cached_listing``
keeps each folder's listing (paths, labels, classes, and the warnings the walk gave) in
``<cache>/listings/<key>.npz``, keyed by the root's real path, the extensions and
``allow_empty``. The entry also records the modification time of the root and of every folder
the walk entered: adding, removing or renaming a file or a folder changes its parent's mtime, so
a later call stats those folders (a few thousand ``stat`` calls, not a walk) and walks again
when any changed or vanished. Editing a file's bytes changes no listing and keeps the entry. A
folder changed in the last ``RACY_S`` seconds before the walk ended is not trusted (a file
system may not tick its mtime between two quick changes): such a listing is not cached, so the
next call walks again. The cache folder is ``$GPU_FEED_LISTING_CACHE``, else
``$GPU_FEED_CACHE/listings``, else ``$XDG_CACHE_HOME/gpu-feed/listings`` (``~/.cache``);
``GPU_FEED_LISTING_CACHE=off`` turns it off. An entry that cannot be written (a read-only cache)
costs a walk next time, nothing else.
"""
from __future__ import annotations

import hashlib
import os
import time
import warnings
from pathlib import Path
from typing import Callable, Iterable, List, Optional, Tuple

import numpy as np

VERSION = 1
RACY_S = 2.0  # folders modified this recently are not trusted to show a later change
Listing = Tuple[List[str], np.ndarray, List[str]]


def cache_dir() -> Optional[Path]:
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


def _key(root: str, extensions: Tuple[str, ...], allow_empty: bool) -> str:
    raw = f"{VERSION}\0{os.path.realpath(root)}\0{','.join(extensions)}\0{allow_empty}"
    return hashlib.sha256(raw.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def _mtimes(dirs: Iterable[str]) -> Optional[np.ndarray]:
    out = []
    for d in dirs:
        try:
            out.append(os.stat(d).st_mtime_ns)
        except OSError:
            return None
    return np.asarray(out, dtype=np.int64)


def _join(items: Iterable[str]) -> np.ndarray:
    return np.frombuffer("\0".join(items).encode("utf-8", "surrogateescape"), dtype=np.uint8)


def _split(blob: np.ndarray) -> List[str]:
    text = blob.tobytes().decode("utf-8", "surrogateescape")
    return text.split("\0") if text else []


def _load(file: Path) -> Optional[Tuple[Listing, List[str]]]:
    try:
        with np.load(file) as z:
            dirs = _split(z["dirs"])
            now = _mtimes(dirs)
            if now is None or not np.array_equal(now, z["mtimes"]):
                return None
            listing = (_split(z["paths"]), z["labels"].astype(np.int64), _split(z["classes"]))
            return listing, _split(z["warnings"])
    except (OSError, ValueError, KeyError, UnicodeDecodeError):
        return None


def _save(file: Path, listing: Listing, dirs: List[str], notes: List[str]) -> None:
    mt = _mtimes(dirs)
    if mt is None or int(mt.max(initial=0)) > time.time_ns() - int(RACY_S * 1e9):
        return  # vanished, or too fresh to trust (module NOTE)
    paths, labels, classes = listing
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp.npz")
        np.savez(tmp, paths=_join(paths), labels=np.asarray(labels, np.int64),
                 classes=_join(classes), dirs=_join(dirs), mtimes=mt, warnings=_join(notes))
        os.replace(tmp, file)
    except OSError:
        pass  # a read-only cache: the next call walks again (module NOTE)


def cached_listing(root, extensions: Tuple[str, ...], allow_empty: bool,
                   walk: Callable[[], Tuple[Listing, List[str]]]) -> Listing:
    """The listing of ``root``: from the cache when every folder it saw is unchanged, else
    from ``walk()`` (which returns the listing and the folders it entered), then cached. The
    walk's warnings are given again when the listing comes from the cache."""
    folder = cache_dir()
    file = folder / f"{_key(str(root), extensions, allow_empty)}.npz" if folder else None
    hit = _load(file) if file is not None and file.exists() else None
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
        _save(file, listing, [os.path.realpath(root)] + dirs, notes)
    return listing
