"""``--cold``: evict the dataset's files from the page cache before each timed window.

``resident_fraction(paths)`` measures with ``mincore(2)`` the share of the files' pages in this
kernel's page cache (weighted by pages); ``evict(paths)`` drops them with
``posix_fadvise(POSIX_FADV_DONTNEED)`` and measures again, and its ``EvictReport`` says whether
it took. ``available()``: whether this OS has both calls.

NOTE [cold]
fadvise needs no root and drops only the dataset's clean, unmapped pages; a file whose pages
survive it (just written, dirty) is ``fdatasync``-ed and advised again. tmpfs pages are the
files, a network filesystem or ZFS keeps its own cache, and storage below the kernel may still
serve reads from memory: "cold" means "not in this kernel's page cache". So the advice proves
nothing by itself; the ``mincore`` check after it does: ``took`` only when at most
``TOOK_THRESHOLD`` of the pages are still resident, and the report marks a row cold only
where every eviction took. Files that cannot be opened are counted in ``failed``.
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

from . import Probe

PathLike = Union[str, "os.PathLike[str]"]

#: An eviction "took" when at most this share of the pages is still resident afterwards (not
#: 0: another process may map or re-read a few; a failed eviction leaves far more).
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


@functools.cache
def _evictor(root: str):
    return functools.partial(evict, dataset_files(root))


COLD_SHARE = 0.5  # a row with less of its window read cold than this is warned about


class Cold(Probe):
    name = "cold"
    fields = ("cold_resident",)  # the share of the pages still cached after the eviction
    mode = ("page cache", "warm", "cold (--cold)")

    def add_arguments(self, add) -> None:
        add("--cold", action="store_true", lab=True,
            help="evict the dataset's files from the page cache before each timed window "
                 "(posix_fadvise, no root) and check with mincore that it took "
                 "(compare.probes.cold); refused where it cannot take (tmpfs)")

    def check(self, setting, root) -> None:
        if not available():
            raise ValueError(_UNAVAILABLE)
        trial = _evictor(root)()
        if trial.files and not trial.took:
            raise ValueError(f"--cold: the page cache of {root} cannot be evicted here "
                             f"({trial.describe()}); a tmpfs or a network filesystem keeps "
                             "the files in memory: drop --cold, or put the data on a local disk")

    def before_window(self, setting, root):
        return {"cold_resident": round(_evictor(root)().after, 4)}

    def row_suffix(self, res, v) -> str:
        if not res.setup.get("cold"):
            return ""
        return " (cold)" if is_cold(res, v) else " (NOT cold: the eviction did not take)"

    def warnings(self, res) -> list[str]:
        w = []
        for v in res.variants:
            stale = [x for x in _resident(v) if x is not None and x > TOOK_THRESHOLD]
            if stale:
                w.append(f"{v.label}: the page-cache eviction did not take "
                         f"({100 * max(stale):.1f}% of the dataset still cached after it): this "
                         "row is not a cold run")
            c = cold_share(res, v)
            if c is not None and c[0] < COLD_SHARE:
                w.append(f"{v.label}: at most {100 * c[0]:.0f}% of its window was read cold: "
                         "the dataset is smaller than what the loader reads after the eviction. "
                         f"A cold window needs at least {c[2]} images")
        return w

    def summary_lines(self, res) -> list[str]:
        if not res.setup.get("cold"):
            return []
        lines = ["**Cold page cache** (`--cold`): the dataset's files were evicted before each "
                 "timed window, then the loader's queue, filled from files read before, was "
                 "drained. A window that reads more than the dataset reads files again, from "
                 "the page cache:", ""]
        for v in res.variants:
            c = cold_share(res, v)
            if c is not None:
                lines.append(f"- {v.label}: at most {100 * c[0]:.0f}% of the window read cold "
                             f"({c[1]} samples were read between the eviction and the window)")
        return lines + [""]


def _resident(v) -> list:
    return [r.probes.get("cold_resident") for r in v.repeats]


def is_cold(res, v) -> bool:
    """Whether row ``v`` of a ``--cold`` run was timed cold: every repeat's eviction took."""
    got = _resident(v)
    return (bool(res.setup.get("cold")) and bool(got)
            and all(x is not None and x <= TOOK_THRESHOLD for x in got))


def cold_share(res, v) -> tuple[float, int, int] | None:
    """``(share, read first, images needed)`` for row ``v`` of a ``--cold`` run: the largest
    share of its window that can have been read from disk, the samples read between the
    eviction and the window (the drained queue, the warm-up and settling), and the dataset size
    a wholly cold window needs (a rank reads ``num_images / world_size``); ``None``: unknown."""
    s = res.setup
    data = s.get("dataset")
    images = data.get("num_images") if isinstance(data, dict) else None
    batch, warmup, world = s.get("batch_size") or 0, s.get("warmup") or 0, s.get("world_size") or 1
    steps = max((r.steps or 0 for r in v.repeats), default=0)
    if not (s.get("cold") and images and batch and steps):
        return None
    settle = max((r.settle_batches or 0 for r in v.repeats), default=0)
    first = ((v.queue_batches or 0) + warmup + settle) * batch
    share = (images / world - first) / (steps * batch)
    return min(1.0, max(0.0, share)), first, (first + steps * batch) * world


PROBE = Cold()
