"""compare.probes.cold: mincore residency and fadvise eviction of a dataset's files (``--cold``)."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from compare.probes import cold as pagecache
from compare.probes.cold import TOOK_THRESHOLD, available, evict, resident_fraction

linux_only = pytest.mark.skipif(not available(), reason="needs Linux posix_fadvise and mincore")

MIB = 2**20
# Filesystems whose files live in this kernel's page cache and can be dropped from it.
DISK_FS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "jfs", "reiserfs", "bcachefs"}


def fs_type(path) -> str | None:
    """The filesystem type of the mount holding ``path`` (the longest matching mount point)."""
    real = os.path.realpath(path)
    best, kind = "", None
    try:
        lines = open("/proc/self/mountinfo").read().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        point = left.split()[4].encode().decode("unicode_escape")  # "\040" for a space
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, right.split()[0]
    return kind


@pytest.fixture
def disk_dir(tmp_path):
    """A directory on a disk-backed filesystem (not tmpfs, where nothing can be evicted)."""
    if fs_type(tmp_path) in DISK_FS:
        yield tmp_path
        return
    seen = {str(tmp_path): fs_type(tmp_path)}
    for base in ("/var/tmp", os.path.expanduser("~")):
        seen[base] = fs_type(base)
        if os.path.isdir(base) and os.access(base, os.W_OK) and seen[base] in DISK_FS:
            d = tempfile.mkdtemp(prefix="gpu-feed-pagecache-", dir=base)
            try:
                yield Path(d)
            finally:
                shutil.rmtree(d, ignore_errors=True)
            return
    pytest.skip(f"no writable disk-backed directory to evict from (filesystems: {seen})")


def write_files(d: Path, n: int = 3, size: int = 4 * MIB, sync: bool = True, name: str = "f") -> list[Path]:
    paths = []
    for i in range(n):
        p = d / f"{name}{i}.bin"
        with open(p, "wb") as f:
            f.write(os.urandom(size))
            if sync:
                f.flush()
                os.fsync(f.fileno())
        paths.append(p)
    return paths


def read_all(paths) -> None:
    for p in paths:
        with open(p, "rb") as f:
            while f.read(MIB):
                pass


@linux_only
def test_evict_takes_and_reading_brings_the_pages_back(disk_dir):
    paths = write_files(disk_dir)
    read_all(paths)
    assert resident_fraction(paths) > 0.9

    r = evict(paths)
    assert (r.files, r.bytes, r.failed) == (3, 3 * 4 * MIB, 0)
    assert r.took is True and r.after <= TOOK_THRESHOLD
    assert resident_fraction(paths) == pytest.approx(r.after, abs=0.01)
    assert "took" in r.describe()

    read_all(paths)
    assert resident_fraction(paths) > 0.9


@linux_only
def test_fraction_is_weighted_by_pages_and_counts_partial_files(disk_dir):
    [small] = write_files(disk_dir, n=1, size=4096, name="small")
    [big] = write_files(disk_dir, n=1, size=4 * MIB, name="big")
    read_all([small, big])
    evict([big])
    # one cached page out of 1 + 1024: per file it would be 0.5
    assert resident_fraction([small, big]) == pytest.approx(1 / 1025)

    read_all([big])
    fd = os.open(big, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 2 * MIB, os.POSIX_FADV_DONTNEED)  # the first half only
    finally:
        os.close(fd)
    assert 0.45 <= resident_fraction([big]) <= 0.55


@linux_only
def test_missing_and_non_regular_files_are_counted_not_raised(disk_dir):
    paths = write_files(disk_dir, n=1)
    missing = [disk_dir / f"missing{i}.bin" for i in range(3)]
    (disk_dir / "adir").mkdir()
    r = evict(paths + missing + [disk_dir / "adir"])
    assert r.files == 1 and r.took is True
    assert r.failed == len(missing) + 1
    assert "4 files could not be opened" in r.describe()

    read_all(paths)
    assert resident_fraction(paths + missing) == resident_fraction(paths) > 0.9


@linux_only
def test_empty_files_and_no_files(disk_dir):
    empty = disk_dir / "empty.bin"
    empty.touch()
    assert resident_fraction([]) == 0.0
    assert resident_fraction([empty]) == 0.0
    r = evict([empty])
    assert (r.files, r.bytes, r.failed, r.after, r.took) == (1, 0, 0, 0.0, True)
    # an empty file adds no pages: it does not dilute a cached file's fraction
    paths = write_files(disk_dir, n=1)
    read_all(paths)
    assert resident_fraction(paths + [empty]) == resident_fraction(paths) > 0.9
    assert evict([]).files == 0


@linux_only
def test_an_eviction_that_does_not_take_is_reported_as_such():
    # tmpfs pages are the files themselves: DONTNEED cannot drop them, and the check must say so.
    if not os.path.isdir("/dev/shm") or fs_type("/dev/shm") != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    d = Path(tempfile.mkdtemp(prefix="gpu-feed-pagecache-", dir="/dev/shm"))
    try:
        paths = write_files(d, n=1, size=MIB)
        r = evict(paths)
        assert r.files == 1 and r.failed == 0
        assert r.after > TOOK_THRESHOLD and r.took is False
        assert "did NOT take" in r.describe()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_unavailable_os_gets_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(pagecache, "available", lambda: False)
    for fn in (resident_fraction, evict):
        with pytest.raises(RuntimeError, match="^--cold needs Linux posix_fadvise and mincore$"):
            fn([tmp_path / "x"])
