"""The page cache of a dataset's files: how much of it is resident, and evicting it (``--cold``).

``resident_fraction(paths)`` measures, with ``mincore(2)`` on a mapping of each file, the fraction
of the files' pages that are in this kernel's page cache (weighted by pages, not per file).
``evict(paths)`` drops them with ``posix_fadvise(POSIX_FADV_DONTNEED)`` and measures again: the
returned ``EvictReport`` says whether it took. ``available()`` says whether this OS has both calls.

NOTE: why fadvise, what it cannot do, and why the check after it is the point.

* ``posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`` needs no root, unlike
  ``echo 3 > /proc/sys/vm/drop_caches``, and drops only the dataset's pages, not the whole host's
  cache (the model code, the Python install and everyone else's files stay warm).
* It drops only clean pages that nobody maps. It cannot drop pages that another process has
  mapped or pinned (``mmap``/``mlock``, a loader still holding a mapping), nor dirty pages:
  a dataset that was just generated may still be dirty, so a file whose pages survive the first
  advice is ``fdatasync``-ed (allowed on a read-only descriptor on Linux) and advised again. The
  sync is done only for such files, because on a journalling filesystem each ``fdatasync`` may cost
  a device cache flush even for a clean file, which for a million-file dataset adds minutes.
* What it acts on is this kernel's page cache. A network filesystem (NFS, SMB, FUSE, 9p,
  virtiofs) may keep its own client or server cache; tmpfs/ramfs pages *are* the files, so
  nothing can be dropped there; on overlayfs the advice reaches the underlying file only on
  kernels that forward it (4.19+); ZFS reads go through its ARC, not the page cache, so mincore
  shows nothing resident there even when the data is hot. Storage below the kernel (a VM host's
  cache of its guest's disk image, a SAN, the drive's own DRAM) may still serve "cold" reads from
  memory: cold here means "not in this kernel's page cache", and the report says only that.
* So the advice proves nothing by itself: the ``mincore`` check afterwards is what shows that it
  took. ``EvictReport.took`` is true only when at most ``TOOK_THRESHOLD`` of the files' pages are
  still resident, and a cold run whose eviction did not take must be reported as such, not as
  cold.

Files that cannot be opened (or are not regular files) are skipped by ``resident_fraction`` and
counted by ``evict`` in ``EvictReport.failed`` with the first ``FAILED_NAMES_KEPT`` names, never
silently lost. Empty files have no pages and count for nothing; ``resident_fraction`` of no pages
at all (``[]``, or only empty files) is 0.0: nothing is cached, so there is nothing to evict.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import os
import stat
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Union

__all__ = ["TOOK_THRESHOLD", "FAILED_NAMES_KEPT", "EvictReport", "available", "evict", "resident_fraction"]

PathLike = Union[str, "os.PathLike[str]"]

#: An eviction "took" when at most this fraction of the files' pages is still resident afterwards.
#: Not 0.0: pages mapped or pinned by another process, or re-read by one (a desktop indexer, a
#: backup, another job on the host) between the eviction and the check, are not the run's doing;
#: up to 5% still cached moves a cold run's reads by at most that much, while an eviction that did
#: not work (tmpfs, a network filesystem, a file held mapped) leaves far more.
TOOK_THRESHOLD = 0.05

#: How many names of files that could not be evicted ``EvictReport.failed_names`` keeps.
FAILED_NAMES_KEPT = 5

_UNAVAILABLE = "--cold needs Linux posix_fadvise and mincore"
_PAGE = mmap.PAGESIZE
# mincore is asked about at most this many bytes of a file at a time, so the mapping and the
# per-page vector stay small for any file size (a multiple of the mmap offset granularity).
_WINDOW = (1 << 30) // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
# Only the lowest bit of each byte mincore writes is defined ("resident"); the rest are reserved.
_LOW_BIT = bytes(b & 1 for b in range(256))


@dataclass(frozen=True)
class EvictReport:
    """What ``evict`` did: ``files``/``bytes`` advised, and the resident fraction of their pages
    ``before`` and ``after`` (each file measured right after its own advice); ``failed`` files
    could not be opened or advised (the first
    ``FAILED_NAMES_KEPT`` of them in ``failed_names``); ``took`` is ``after <= TOOK_THRESHOLD``
    (over the files that were advised; a failed file is reported in ``failed``, not in ``took``)."""

    files: int
    bytes: int
    before: float
    after: float
    failed: int
    failed_names: tuple[str, ...]
    took: bool

    def describe(self) -> str:
        """One line for a log or a report."""
        line = (f"page cache: evicted {self.files} files ({self.bytes / 2**30:.2f} GiB), "
                f"resident {self.before:.1%} -> {self.after:.1%}: ")
        line += "took" if self.took else f"did NOT take (more than {TOOK_THRESHOLD:.0%} still cached)"
        if self.failed:
            line += f"; {self.failed} files could not be evicted (e.g. {', '.join(self.failed_names)})"
        return line


@functools.cache
def _mincore():
    """libc's ``mincore``, typed; raises OSError/AttributeError where there is none."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    fn = libc.mincore
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    fn.restype = ctypes.c_int
    return fn


def _mincore_count(mm: mmap.mmap, length: int) -> int:
    """Resident pages among the first ``length`` bytes of the (writable) mapping ``mm``."""
    pages = (length + _PAGE - 1) // _PAGE
    vec = (ctypes.c_ubyte * pages)()
    # from_buffer exports mm's buffer; it must be gone before mm.close() (else BufferError).
    buf = ctypes.c_char.from_buffer(mm)
    try:
        rc = _mincore()(ctypes.addressof(buf), length, vec)
    finally:
        del buf
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mincore: {os.strerror(err)}")
    return bytes(vec).translate(_LOW_BIT).count(1)


@functools.cache
def available() -> bool:
    """Whether this OS has ``posix_fadvise`` and a working ``mincore`` (Linux)."""
    if not sys.platform.startswith("linux") or not hasattr(os, "posix_fadvise"):
        return False
    try:
        mm = mmap.mmap(-1, _PAGE)
        try:
            mm[0] = 1  # touched, so the page is resident: a working mincore must say so
            return _mincore_count(mm, _PAGE) == 1
        finally:
            mm.close()
    except (OSError, AttributeError, ValueError, TypeError):
        return False


def _require() -> None:
    if not available():
        raise RuntimeError(_UNAVAILABLE)


def _fd_pages(fd: int, size: int) -> tuple[int, int]:
    """(resident, total) pages of the open file ``fd`` of ``size`` bytes."""
    resident = 0
    for off in range(0, size, _WINDOW):
        length = min(_WINDOW, size - off)
        # ACCESS_COPY (a private mapping) makes the buffer writable, which from_buffer needs; the
        # mapping is never touched, so it faults nothing in and copies nothing, and mincore on a
        # private file mapping reports the file's page cache.
        mm = mmap.mmap(fd, length, access=mmap.ACCESS_COPY, offset=off)
        try:
            resident += _mincore_count(mm, length)
        finally:
            mm.close()
    return resident, (size + _PAGE - 1) // _PAGE


def _open_regular(path: PathLike) -> tuple[int, int]:
    """(fd, size) of a regular file opened read-only; OSError otherwise (the fd then closed)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"not a regular file: {os.fsdecode(path)}")
        return fd, st.st_size
    except BaseException:
        os.close(fd)
        raise


def _pages(paths: Iterable[PathLike]) -> tuple[int, int]:
    """(resident, total) pages over ``paths``, skipping files that cannot be opened or mapped."""
    resident = total = 0
    for p in paths:
        try:
            fd, size = _open_regular(p)
        except OSError:
            continue
        try:
            r, t = _fd_pages(fd, size)
        except (OSError, ValueError):  # ValueError: the file shrank under the mapping
            continue
        finally:
            os.close(fd)
        resident += r
        total += t
    return resident, total


def _fraction(resident: int, total: int) -> float:
    return resident / total if total else 0.0


def resident_fraction(paths: Iterable[PathLike]) -> float:
    """Fraction of the pages of ``paths`` that are in the page cache, weighted by pages.

    Files that cannot be opened, are not regular files or are empty count for nothing; with no
    pages at all the answer is 0.0. Raises RuntimeError where ``available()`` is false."""
    _require()
    return _fraction(*_pages(paths))


def _evict_one(path: PathLike) -> tuple[int, int, int, int]:
    """Advise ``path`` out of the page cache; (size, resident pages before, resident pages
    right after, total pages)."""
    fd, size = _open_regular(path)
    try:
        resident, total = _fd_pages(fd, size)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if resident and _fd_pages(fd, size)[0]:
            try:
                os.fdatasync(fd)
            except OSError:
                pass  # a filesystem without it (EINVAL): the check after says whether it mattered
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        left = _fd_pages(fd, size)[0] if resident else 0
    finally:
        os.close(fd)
    return size, resident, left, total


def evict(paths: Iterable[PathLike]) -> EvictReport:
    """Drop the page cache of ``paths`` (``POSIX_FADV_DONTNEED``, no root needed) and check with
    ``mincore`` that it took; see the module NOTE for what this can and cannot evict.

    A file whose pages survive the advice (dirty, e.g. a dataset just written) is ``fdatasync``-ed
    and advised again. Files that cannot be opened or advised are counted in ``failed``; nothing
    raises for a single file. Raises RuntimeError where ``available()`` is false."""
    _require()
    done: list[PathLike] = []
    nbytes = before = left = total = failed = 0
    failed_names: list[str] = []
    for p in paths:
        try:
            size, r, k, t = _evict_one(p)
        except (OSError, ValueError):  # ValueError: the file shrank under the mapping
            failed += 1
            if len(failed_names) < FAILED_NAMES_KEPT:
                failed_names.append(os.fsdecode(p))
            continue
        done.append(p)
        nbytes += size
        before += r
        left += k
        total += t
    # Measured per file, right after its advice: what the eviction left. A loader that is running
    # (its workers refill their queue) reads files back in while the rest are being evicted, and
    # those are the run's own cold reads, not pages the eviction failed to drop.
    after = _fraction(left, total)
    return EvictReport(files=len(done), bytes=nbytes, before=_fraction(before, total), after=after,
                       failed=failed, failed_names=tuple(failed_names), took=after <= TOOK_THRESHOLD)


def dataset_files(root: PathLike) -> list:
    """The files a loader reads for the dataset at ``root``: its tar shards, or each image file
    of a folder or a file list (``pipelines.sources.root.open_source``)."""
    from pipelines.sources.root import SourceKind, open_source, source_kind
    from pipelines.sources.shards import shard_paths

    if source_kind(root) is SourceKind.SHARDS:
        return [str(p) for p in shard_paths(root)]
    return [str(p) for p in open_source(root).names]


def evictor(root: PathLike):
    """A callable that evicts the dataset at ``root`` (``evict``) and returns its report;
    ``RuntimeError`` at once where this OS cannot (``available``)."""
    _require()
    return functools.partial(evict, dataset_files(root))
