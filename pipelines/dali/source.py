"""An external source that follows the shared per-epoch plan and feeds DALI file *paths*.

NOTE [why an external source]
DALI's file reader shuffles with a bounded buffer (``random_shuffle``), which is not a full
permutation, so it cannot follow ``pipelines.indexing``'s plan. Rebuilding a reader with an
explicit file list every epoch would follow it, but costs a pipeline rebuild per epoch (1.8 s on
an H200 host, ``python -m compare.dali_reader_cost``). This source hands DALI exactly the plan's
batches, in order, as UTF-8 encoded paths; ``fn.io.file.read`` in the graph reads the files in
DALI's C++ threads. An exception here (a bad file under ``on_bad_file="error"``) propagates
through DALI to the caller's ``next()``.

NOTE [validated once]
Every file is checked with ``pipelines.validate.check_image_bytes`` the first time the plan
reaches it: a small thread pool reads it in Python (file reads release the GIL) ahead of the
batch DALI asks for. The verdict (good, or bad with its reason) is kept per dataset index, so
later epochs feed known-good paths with no Python I/O at all, and known-bad files are replaced
(``skip``) or raised (``error``) from the record. The reason: reading every file in Python on
the consumer's critical path capped loader-only throughput at ~12k img/s on an H200 host,
against 18.4k for DALI's own C++ reader with the same graph (the per-batch callback took 7.2 ms
under GIL contention; docs/results/h200/reader-vs-source). With paths, and plain reads instead
of mmap in ``fn.io.file.read`` (``LoaderConfig.dali_use_mmap``), this source gives 22.2k against
the reader's 20.4k (docs/results/h200/reader-vs-source/after-plain-reads). Trade-off: a file that
turns bad after it was checked fails inside DALI's reader or decoder, with DALI's message.

NOTE [feeding cost]
The per-batch feed runs on the consumer's thread (inside ``next()``), so it is kept small:
labels and indices travel as one dense ``N x 2`` array, and the path buffers are handed over
with ``no_copy=True`` (``python -m compare.microbench feed``). ``no_copy`` makes us responsible
for keeping every fed buffer alive until DALI has consumed it: the last ``keep_alive`` batches are
held in a ring (at least ``prefetch_queue_depth`` + 1, per DALI's ``external_source``
documentation).

NOTE [lanes]
With ``dali_pipelines = n`` the loader runs n DALI pipelines side by side; pipeline k is fed
by ``lane(k)`` with the epoch's batches k, k + n, k + 2n, ... and the loader yields them
round-robin, which restores the plan's order. All lanes share one plan, one verdict record and
one read-ahead pool. A lane whose batch is wholly bad moves on to its next batch (that batch is
counted in ``dropped_batches``), so the yielded order then differs from the plan's by that gap.
"""
from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np

from ..validate import DEFAULT_MAX_PIXELS, BadFileError, check_image_bytes


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


_UNKNOWN, _GOOD, _BAD = 0, 1, 2


class PlanSource:
    """DALI batch callable: ``source(batch_info) -> (paths, meta)``.

    ``paths`` is a list of uint8 arrays (UTF-8 file paths, for ``fn.io.file.read``), ``meta`` an
    ``N x 2`` int64 array of ``(label, dataset index)`` rows. Each file is checked with
    ``pipelines.validate.check_image_bytes`` once, on first use (see the module note); bad files
    raise ``BadFileError`` or, with ``skip=True``, are replaced by the next good sample of the
    batch (the ``BadFilePolicy`` rule shared with the torch backends) and listed in
    ``bad_by_epoch``, every epoch they are planned.

    Args:
        paths, labels: the listing (``pipelines.indexing.list_samples``).
        plan: ``plan(epoch) -> list of index arrays`` (the shared batch plan).
        readahead: batches read ahead of the one DALI asks for.
        threads: reader threads.
        keep_alive: fed batches kept referenced per lane (``no_copy`` lifetime, see the module
            note).
        skip: skip bad files instead of raising.
        max_pixels: decompression-bomb limit.
        lanes: pipelines fed side by side (``lane(k)``; NOTE [lanes]).
    """

    def __init__(self, paths: Sequence[str], labels: np.ndarray,
                 plan: Callable[[int], List[np.ndarray]], readahead: int = 3, threads: int = 4,
                 keep_alive: int = 4, skip: bool = False, max_pixels: int = DEFAULT_MAX_PIXELS,
                 lanes: int = 1):
        if not isinstance(lanes, int) or lanes < 1:
            raise ValueError(f"lanes={lanes!r} must be an int >= 1")
        self.paths = list(paths)
        self.labels = labels
        self.plan = plan
        self.readahead = readahead
        self.skip = skip
        self.max_pixels = max_pixels
        self.epoch = 0
        self.bytes_read = 0
        self.samples_read = 0
        self.bad_by_epoch: Dict[int, List[Tuple[str, str]]] = {}
        self.dropped_batches = 0
        self.lanes = lanes
        self._batches: List[np.ndarray] = []
        self._gen = 0            # bumped by start_epoch: one generation per epoch started
        self._planned_gen = -1   # the generation self._batches was planned for
        self._lane_gen = [-1] * lanes
        self._lane_pos = [0] * lanes
        self._pending: Dict[int, Future] = {}
        self._alive: deque = deque(maxlen=keep_alive * lanes)
        self._status = np.zeros(len(self.paths), dtype=np.int8)  # _UNKNOWN / _GOOD / _BAD
        self._size = np.zeros(len(self.paths), dtype=np.int64)    # bytes, once checked
        self._reason: Dict[int, str] = {}
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dali-read")

    def start_epoch(self, epoch: int) -> None:
        """Fix the epoch whose plan the lanes' next ``iteration == 0`` calls start."""
        self.epoch = epoch
        self._gen += 1

    def _check(self, i: int) -> None:
        try:
            data = _read(self.paths[i])
            reason = check_image_bytes(data, self.max_pixels)
        except OSError as e:
            data, reason = b"", f"{type(e).__name__}: {e}"
        self._size[i] = len(data)
        if reason is not None:
            self._reason[i] = reason
        self._status[i] = _BAD if reason is not None else _GOOD  # last: publishes the verdict

    @property
    def files_checked(self) -> int:
        """Files read and checked in Python so far (each at most once)."""
        return int((self._status != _UNKNOWN).sum())

    def _load(self, idx: np.ndarray):
        for i in idx[self._status[idx] == _UNKNOWN]:
            self._check(int(i))
        rows = np.array(idx, dtype=np.int64)  # a copy: idx is the plan itself
        is_bad = self._status[rows] == _BAD
        bad = []
        if is_bad.any():
            ks = np.flatnonzero(is_bad)
            if not self.skip:
                i = int(rows[ks[0]])
                raise BadFileError(self.paths[i], self._reason[i])
            bad = [(self.paths[rows[k]], self._reason[int(rows[k])]) for k in ks]
            good = np.flatnonzero(~is_bad)
            for n, k in enumerate(ks):  # replace each bad sample by the next good one (wrapping)
                if len(good):
                    later = good[good > k]
                    rows[k] = rows[later[0] if len(later) else good[n % len(good)]]
        paths = [np.frombuffer(self.paths[i].encode(), dtype=np.uint8) for i in rows]
        meta = np.ascontiguousarray(np.stack([self.labels[rows], rows], axis=1))
        return paths, meta, bad, not is_bad.all(), int(self._size[rows].sum())

    def lane(self, k: int) -> Callable:
        """The DALI batch callable of pipeline ``k`` of ``lanes``: it serves the epoch's batches
        ``k, k + lanes, k + 2 * lanes, ...`` (see NOTE [lanes])."""
        if not 0 <= k < self.lanes:
            raise ValueError(f"lane k={k!r} must be in [0, lanes={self.lanes})")
        return lambda info: self._serve(k, info)

    def __call__(self, info):
        """The single-pipeline callable (``lanes == 1``)."""
        return self._serve(0, info)

    def _serve(self, k: int, info):
        if info.iteration == 0 or self._lane_gen[k] != self._gen:
            if self._planned_gen != self._gen:  # the first lane to start this epoch plans it
                for f in self._pending.values():
                    f.cancel()
                self._pending.clear()
                self._batches = self.plan(self.epoch)
                self._planned_gen = self._gen
                self.bad_by_epoch[self.epoch] = []
            self._lane_gen[k] = self._gen
            self._lane_pos[k] = k
        while True:
            pos = self._lane_pos[k]
            if pos >= len(self._batches):
                raise StopIteration
            for q in range(pos, min(pos + 1 + self.readahead * self.lanes, len(self._batches))):
                if q not in self._pending:
                    self._pending[q] = self._pool.submit(self._load, self._batches[q])
            paths, meta, bad, any_good, nbytes = self._pending.pop(pos).result()
            self._lane_pos[k] += self.lanes
            self.bad_by_epoch[self.epoch] += bad
            if any_good:
                break
            self.dropped_batches += 1  # every file of this batch was bad: skip the batch
        out = (paths, meta)
        self.bytes_read += nbytes
        self.samples_read += len(paths)
        self._alive.append(out)
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
