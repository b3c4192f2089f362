"""The local spool of remote shards: one fetcher thread copies them, the readers ``pread`` them.

NOTE [spool]
DataLoader workers and DALI's read-ahead threads each call ``reader(i)``; if each fetched its
own byte ranges, the traffic would grow with their count. Instead one ``Fetcher`` thread in
the loader's process follows this rank's plan, the shard order of each epoch, a little ahead
of the consumer (NOTE [ahead] below), and copies each shard it needs whole
(``remote.download``) to a local spool file; ``SpoolReader(i)`` waits for the file of sample
``i``'s shard and reads the sample from it with one ``os.pread``, as ``ShardReader`` does from a
local shard (so DALI's size check, ``validate.decoded_size``, reads spooled bytes as any).

* A reader whose shard is not spooled yet (a worker ahead of the fetcher's plan position, or
  a header read when the loader is built) leaves a request file in the spool's control
  folder; the fetcher serves requests first. Readers never download.
* A reader waits while the fetcher is alive (a heartbeat file it touches at least every
  second, also during a download); a fetcher that stopped beating for ``2 x read_timeout +
  10`` s, or an hour's wait, is a ``TimeoutError`` naming the shard. A shard the fetcher gave up
  on leaves an error file: its readers raise its message at once.
* Without ``LoaderConfig.shard_cache`` the spool is a private temporary folder, deleted at
  ``close()``; a shard leaves it once the consumer has received every batch of the plan that
  reads it (the loader pushes its position, ``at``), so the disk holds the shards of the
  batches in flight plus those copied ahead, whatever the dataset size. With ``shard_cache``
  the shards stay there across epochs and loaders, the least recently used of the cache's own
  copies removed once they hold more than ``shard_cache_bytes`` (never one in use, never a
  file the cache did not write: ``shard_cache`` NOTE [shard cache]).
* NOTE [ahead]: the fetcher copies ahead the shards that the next ``AHEAD`` steps of the plan
  open, however many they are: under a shuffle window of ``W`` shards the first batch of a
  window (and of an epoch) reads from nearly all ``W`` of them, so ``AHEAD`` shards would leave
  the workers waiting for the rest, one copy after another, at every window's start. A shard
  the next epoch opens early that is still spooled is kept, not copied again. The steps
  counted are those of the jobs the fetcher took (not each shard's latest job, which a later
  epoch overwrites: with every shard spooled and opened at each epoch's first step, the walk
  then ran on through the epochs without end and ignored ``close()``). So the spool
  holds the shards of the batches in flight plus those the next window opens first: about
  two windows, whatever the dataset size.
* The fetcher's failures reach the consumer: ``check()`` re-raises the original exception
  at the next batch, and in place of any bad file its readers met (``LoaderBase._report``:
  they failed because of it, so they are not counted and no other shard is blamed), so an
  epoch whose samples all failed raises it too, never ends empty. The failure is set before
  any reader can see it. A shard shorter than its index under ``on_bad_file="skip"`` is not
  a failure: its samples become bad files, counted.
* Stop: ``close()`` (the loader's, a failed build's, or at exit, as after Ctrl-C) sets
  ``stop``; the fetcher's heartbeat raises in the copy and ``remote.download`` starts no
  request and no retry after it. ``close()`` waits up to ``JOIN_S`` for the thread; a read
  already waiting on a stalled server ends within ``read_timeout``, and nothing follows it.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from pipelines.sources import remote, shard_cache

AHEAD = 2  # the future steps that open shards whose shards are copied ahead (NOTE [ahead])
BEAT_S = 0.5
WAIT_S = 3600.0
JOIN_S = 2.0  # how long close() waits for the fetcher thread (module NOTE, Stop)


class SpoolReader:
    """``reader(i) -> bytes``: sample ``i``'s image from the spooled copy of its shard.

    Picklable (DataLoader workers); ``data_dir`` and ``ctl`` are set by the ``Fetcher``."""

    remote = True  # pipelines.sources.root.header_sizes: read the first shard only

    def __init__(self, names: Sequence[str], files: Sequence[str], shard_of: np.ndarray,
                 offsets: np.ndarray, sizes: np.ndarray, stamps: np.ndarray, timeout: float):
        self.names, self.files = tuple(names), tuple(files)
        self.shard_of, self.offsets, self.sizes, self.stamps = shard_of, offsets, sizes, stamps
        self.stall_s = 2 * timeout + 10
        self.data_dir: str | None = None
        self.ctl: str | None = None

    def path(self, s: int) -> str:
        return os.path.join(self.data_dir or "", self.files[s])

    def __call__(self, i: int) -> bytes:
        if self.data_dir is None or self.ctl is None:
            raise RuntimeError("remote shards are read through a loader (create_loader), which "
                               "runs their fetcher")
        s = int(self.shard_of[i])
        path, start, asked = self.path(s), time.monotonic(), False
        nap = 0.002
        while True:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                self._wait(s, start, asked)
                if not asked:
                    _touch(os.path.join(self.ctl, f"{s}.want"))
                    asked = True
                time.sleep(nap)
                nap = min(nap * 2, 0.05)
                continue
            try:
                size = int(self.sizes[i])
                data = os.pread(fd, size, int(self.offsets[i]))
            finally:
                os.close(fd)  # not kept: an evicted shard's space is freed at once
            if len(data) != size:
                raise OSError(f"short read: {len(data)} of {size} bytes of the spooled copy of "
                              f"{self.names[s]!r}")
            return data

    def _wait(self, s: int, start: float, asked: bool) -> None:
        ctl = self.ctl or ""
        for name in (f"{s}.err", "fatal"):
            try:
                with open(os.path.join(ctl, name)) as f:
                    raise OSError(f.read())
            except FileNotFoundError:
                pass
        now = time.monotonic()
        try:
            beat = time.time() - os.stat(os.path.join(ctl, "alive")).st_mtime
        except FileNotFoundError:
            beat = float("inf")
        if asked and (beat > self.stall_s or now - start > WAIT_S):
            raise TimeoutError(f"shard {self.names[s]!r}: waited {now - start:.0f} s for its "
                               "spooled copy; the fetcher " + ("stopped" if beat > self.stall_s
                                                               else "did not deliver it"))


def _touch(path: str) -> None:
    try:
        with open(path, "a"):
            pass
        os.utime(path)
    except OSError:
        pass


class _Stopped(Exception):
    pass


# every fetcher of this process, stopped at exit (Ctrl-C without close(): module NOTE, Stop)
_LIVE: weakref.WeakSet[Fetcher] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for fetcher in list(_LIVE):
        fetcher.close()


class Fetcher:
    """The thread that copies this rank's shards to the spool (module NOTE).

    Args:
        reader: the source's ``SpoolReader`` (its ``data_dir`` and ``ctl`` are set here).
        plan_of: ``plan_of(epoch)``, this rank's batches.
        batches: batches per epoch (``len(loader)``).
        skip_bad: ``on_bad_file="skip"``: a short shard's samples become bad files.
        cache, cache_bytes: ``LoaderConfig.shard_cache`` and ``shard_cache_bytes``.
    """

    def __init__(self, reader: SpoolReader, plan_of: Callable[[int], list[np.ndarray]],
                 batches: int, *, skip_bad: bool, cache: str | None = None,
                 cache_bytes: int | None = None):
        self.reader, self.plan_of, self.batches = reader, plan_of, max(1, batches)
        self.skip_bad, self.cache_bytes = skip_bad, cache_bytes
        self.tmp = tempfile.mkdtemp(prefix="gpu-feed-spool-")
        self.data_dir = cache or self.tmp
        self.cached = cache is not None
        os.makedirs(self.data_dir, exist_ok=True)
        reader.data_dir, reader.ctl = self.data_dir, self.tmp
        n = len(reader.names)
        ends = np.zeros(n, np.int64)
        np.maximum.at(ends, reader.shard_of.astype(np.int64), reader.offsets + reader.sizes)
        self._ends = ends
        self._cond = threading.Condition()
        self._origin: tuple[int, int] | None = None
        self._gen = 0
        self._consumer = -1
        self._live: dict[int, float] = {}  # shard -> the last global step that reads it
        self._opened: set[int] = set()  # steps at which accepted jobs open shards (NOTE [ahead])
        self._have: set[int] = set()
        self._beat_at = 0.0
        self._owned: set[str] = set()  # copies this fetcher knows the cache's ledger lists
        self.stop = threading.Event()
        self._pid = os.getpid()  # a forked copy never stops the parent's thread
        self.error: BaseException | None = None
        self.bytes_fetched = 0
        self._beat(force=True)
        _LIVE.add(self)
        self._thread = threading.Thread(target=self._run, name="gpu-feed-fetch", daemon=True)
        self._thread.start()

    # -- the consumer's side ------------------------------------------------------------------
    def follow(self, epoch: int, start: int) -> None:
        """The consumer starts ``epoch`` at batch ``start``: go on, or walk from there."""
        g = epoch * self.batches + start
        with self._cond:
            if self._origin is None or g != self._consumer:
                self._origin, self._gen = (epoch, start), self._gen + 1
            self._consumer = g
            self._cond.notify_all()

    def at(self, epoch: int, done: int) -> None:
        """The consumer has received ``done`` batches of ``epoch``."""
        with self._cond:
            self._consumer = epoch * self.batches + done
            self._cond.notify_all()

    def check(self) -> None:
        """Raise the fetcher's failure, if any, in the consumer."""
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Stop the copies and the thread (module NOTE, Stop); safe to call twice."""
        if os.getpid() != self._pid:
            return
        _LIVE.discard(self)
        self.stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=JOIN_S)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- the thread ---------------------------------------------------------------------------
    def _beat(self, force: bool = False) -> None:
        if self.stop.is_set():
            raise _Stopped
        now = time.monotonic()
        if force or now - self._beat_at > BEAT_S / 2:
            self._beat_at = now
            _touch(os.path.join(self.tmp, "alive"))

    def _jobs(self, epoch: int, start: int) -> Iterator[tuple[int, int, int]]:
        """``(shard, first step, last step)`` in the order the plan first reads the shards."""
        e, skip = epoch, start
        while True:
            self._beat()  # a stop ends the walk, even where every shard is spooled already
            first: dict[int, int] = {}
            last: dict[int, int] = {}
            for b, idx in enumerate(self.plan_of(e)):
                if b < skip:
                    continue
                for s in np.unique(self.reader.shard_of[idx]).tolist():
                    first.setdefault(s, b)
                    last[s] = b
            base = e * self.batches
            for s in sorted(first, key=first.__getitem__):
                yield s, base + first[s], base + last[s]
            e, skip = e + 1, 0

    def _run(self) -> None:
        try:
            gen = -1
            jobs: Iterator[tuple[int, int, int]] | None = None
            pending: tuple[int, int, int] | None = None
            while True:
                with self._cond:
                    if self._origin is not None and gen != self._gen:
                        gen, jobs, pending = self._gen, self._jobs(*self._origin), None
                        self._live = {s: v for s, v in self._live.items() if v == float("inf")}
                        self._opened = set()
                self._requests()
                self._evict()
                if pending is None and jobs is not None:
                    pending = next(jobs)
                if pending is not None and self._may_fetch(pending[1]):
                    s, g0, g1 = pending
                    self._opened.add(g0)
                    self._live[s] = g1 if self._live.get(s, -1) == float("inf") \
                        else max(self._live.get(s, -1), g1)
                    self._fetch(s)
                    pending = None
                    continue
                self._beat()
                with self._cond:
                    self._cond.wait(0.02)
        except _Stopped:
            return
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer (check)
            if self.stop.is_set():
                return  # what a stop interrupted (a removed folder, a cut copy): no failure
            if self.error is None:
                self.error = e
            try:
                with open(os.path.join(self.tmp, "fatal"), "w") as f:
                    f.write(str(e))
            except OSError:
                pass

    def _may_fetch(self, g0: int) -> bool:
        """Whether the job of a shard first read at global step ``g0`` may start (NOTE [ahead])."""
        ahead = {g for g in self._opened if g > self._consumer}
        self._opened = ahead
        return g0 <= self._consumer + 1 or g0 in ahead or len(ahead) < AHEAD

    def _requests(self) -> None:
        for name in os.listdir(self.tmp):
            if not name.endswith(".want"):
                continue
            s = int(name[:-5])
            if s not in self._live:
                self._live[s] = float("inf")  # kept until the plan's walk reaches it
            self._fetch(s)
            os.unlink(os.path.join(self.tmp, name))

    def _evict(self) -> None:
        done = [s for s in self._have if self._live.get(s, -1) < self._consumer]
        if self.data_dir == self.tmp:
            for s in done:
                remote._unlink(self.reader.path(s))
                self._have.discard(s)
                self._live.pop(s, None)
        elif self.cache_bytes is not None:
            self._trim()

    def _trim(self) -> None:
        """The least recently used of the shard cache's own copies out, down to
        ``cache_bytes`` (``shard_cache`` NOTE [shard cache])."""
        keep = {self.reader.files[s] for s, v in self._live.items() if v >= self._consumer}
        shard_cache.trim(self.data_dir, self.cache_bytes or 0, keep)
        self._have = {s for s in self._have if os.path.exists(self.reader.path(s))}

    def _own(self, file: str) -> None:
        """List ``file``, a copy of this spool's naming, in the shard cache's ledger."""
        if self.cached and file not in self._owned:
            if file not in shard_cache.listed(self.data_dir):
                shard_cache.record(self.data_dir, file)
            self._owned.add(file)

    def _fetch(self, s: int) -> None:
        path, file = self.reader.path(s), self.reader.files[s]
        if os.path.exists(path):
            os.utime(path)  # recently used (shard_cache)
            self._own(file)  # a copy that indexing left here
            self._have.add(s)
            return
        if os.path.exists(os.path.join(self.tmp, f"{s}.err")):
            return
        name, want = self.reader.names[s], int(self.reader.stamps[s][0])
        # a shared cache: a partial file of this process and thread, renamed into place
        part = shard_cache.temp_path(self.data_dir, file) if self.cached else path
        try:
            size = remote.download(name, part, expect=want, beat=self._beat, stop=self.stop)
            if size < self._ends[s]:
                os.unlink(part)
                raise remote.RemoteError(f"shard {name!r}: {size} bytes arrived, its index "
                                         f"reads up to byte {int(self._ends[s])} (the shard "
                                         "changed or ended early); clear the listing cache")
            if part != path:
                self._own(file)  # listed before it appears (NOTE [shard cache])
                os.replace(part, path)
        except remote.RemoteError as e:
            if self.stop.is_set():
                raise _Stopped from None
            skip = self.skip_bad and "ended early" in str(e)
            if not skip:
                self.error = e  # before any reader can see it (module NOTE)
            with open(os.path.join(self.tmp, f"{s}.err"), "w") as f:
                f.write(str(e))
            if skip:
                return  # its samples are bad files, counted (module NOTE)
            raise
        finally:
            if part != path:
                remote._unlink(part)  # gone after the rename; else what a failure left
        self.bytes_fetched += size
        self._have.add(s)
        if self.cached and self.cache_bytes is not None:
            self._trim()
