"""``--cold``: evict the dataset's files from the page cache (``posix_fadvise``, no root)
before each timed window, and check with ``mincore(2)`` that it took. See docs/benchmarking.md.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import os
import stat
import sys
from dataclasses import dataclass

from . import Probe

#: An eviction "took" when at most this share of the pages is still resident afterwards.
TOOK_THRESHOLD = 0.05
COLD_SHARE = 0.5  # a row with less of its window read cold than this is warned about
_UNAVAILABLE = "--cold needs Linux posix_fadvise and mincore"


@dataclass(frozen=True)
class EvictReport:
    """One eviction: files and bytes advised, the share still resident ``after``, and more."""

    files: int
    bytes: int
    after: float
    failed: int
    took: bool

    def describe(self) -> str:
        line = (f"page cache: evicted {self.files} files ({self.bytes / 2**30:.2f} GiB), "
                f"{self.after:.1%} still resident: ")
        line += "took" if self.took else "did NOT take (files just written? run sync)"
        return line + (f"; {self.failed} files could not be opened" if self.failed else "")


@functools.cache
def _mincore():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    fn = libc.mincore
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    return fn


def _resident_pages(fd: int, size: int) -> tuple[int, int]:
    """(resident, total) pages of the open file ``fd``, through an untouched private mapping."""
    if size == 0:
        return 0, 0
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    mm = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    buf = ctypes.c_char.from_buffer(mm)  # must be gone before mm.close()
    try:
        if _mincore()(ctypes.addressof(buf), size, vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
    finally:
        del buf
        mm.close()
    return sum(b & 1 for b in vec), pages  # only the lowest bit is defined


def _each(paths, fn) -> tuple[list, int]:
    """``fn(fd, size)`` for each regular file of ``paths`` that opens: (results, failures)."""
    out, failed = [], 0
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            failed += 1
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(f"not a regular file: {p}")
            out.append(fn(fd, st.st_size))
        except (OSError, ValueError):  # ValueError: the file shrank under the mapping
            failed += 1
        finally:
            os.close(fd)
    return out, failed


@functools.cache
def available() -> bool:
    """Whether this OS has ``posix_fadvise`` and ``mincore`` (Linux)."""
    try:
        return sys.platform.startswith("linux") and hasattr(os, "posix_fadvise") and _mincore()
    except (OSError, AttributeError):
        return False


def resident_fraction(paths) -> float:
    """Share of the pages of ``paths`` in the page cache (0.0 for none)."""
    if not available():
        raise RuntimeError(_UNAVAILABLE)
    got = _each(paths, _resident_pages)[0]
    total = sum(t for _, t in got)
    return sum(r for r, _ in got) / total if total else 0.0


def evict(paths) -> EvictReport:
    """Advise every file of ``paths`` out of the page cache, then check once what stayed."""
    if not available():
        raise RuntimeError(_UNAVAILABLE)
    paths = list(paths)

    def advise(fd, size):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return size

    sizes, failed = _each(paths, advise)
    after = resident_fraction(paths)
    return EvictReport(len(sizes), sum(sizes), after, failed, after <= TOOK_THRESHOLD)


@functools.cache
def _evictor(root: str):
    from pipelines.sources.root import SourceKind, open_source, source_kind
    from pipelines.sources.shards import shard_paths

    files = (shard_paths(root) if source_kind(root) is SourceKind.SHARDS else open_source(root).names)
    return functools.partial(evict, [str(p) for p in files])


class Cold(Probe):
    name = "cold"
    fields = ("cold_resident",)  # the share of the pages still cached after the eviction
    mode = ("page cache", "warm", "cold (--cold)")

    def add_arguments(self, add) -> None:
        add("--cold", action="store_true", lab=True,
            help="evict the dataset's files from the page cache before each timed window and "
                 "check that it took (compare.probes.cold); refused where it cannot (tmpfs)")

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
        got = [r.probes.get("cold_resident") for r in v.repeats]
        took = bool(got) and all(x is not None and x <= TOOK_THRESHOLD for x in got)
        return " (cold)" if took else " (NOT cold: the eviction did not take)"

    def warnings(self, res) -> list[str]:
        """Rows whose window mostly re-read files: too small a dataset for a cold window."""
        s, w = res.setup, []
        data = s.get("dataset")
        images = data.get("num_images") if isinstance(data, dict) else None
        batch, world = s.get("batch_size") or 0, s.get("world_size") or 1
        for v in res.variants:
            steps = max((r.steps or 0 for r in v.repeats), default=0)
            if not (s.get("cold") and images and batch and steps):
                continue
            settle = max((r.settle_batches or 0 for r in v.repeats), default=0)
            first = ((v.queue_batches or 0) + (s.get("warmup") or 0) + settle) * batch
            share = min(1.0, max(0.0, (images / world - first) / (steps * batch)))
            if share < COLD_SHARE:
                w.append(f"{v.label}: at most {100 * share:.0f}% of its window was read cold "
                         f"({first} samples were read between the eviction and the window); a "
                         f"cold window needs at least {(first + steps * batch) * world} images")
        return w


PROBE = Cold()
