"""An external source of encoded JPEG bytes that follows the shared per-epoch plan.

NOTE [why an external source]
DALI's file reader shuffles with a bounded buffer (``random_shuffle``), which is not a full
permutation, so it cannot follow ``pipelines.indexing``'s plan. Rebuilding a reader with an
explicit file list every epoch would follow it, but costs a pipeline rebuild per epoch. This
source hands DALI the bytes of exactly the plan's batches, in order; files are read ahead by a
small thread pool (file reads release the GIL). An exception while reading (a missing file)
propagates through DALI to the caller's ``next()``.

NOTE [feeding cost]
The per-batch feed runs on the consumer's thread (inside ``next()``), so it is on the critical
path. Two measured choices keep it small (256 JPEGs of the default set, 2-core dev machine,
``python -m compare.microbench feed``): labels and indices travel as one dense ``N x 2`` array
instead of 2 x N one-element arrays (4.2 -> 2.5 ms/batch), and the JPEG buffers are handed over
with ``no_copy=True`` (2.5 -> 1.9 ms/batch). ``no_copy`` makes us responsible for keeping every fed buffer alive until
DALI has consumed it: the last ``keep_alive`` batches are held in a ring (at least
``prefetch_queue_depth`` + 1, per DALI's ``external_source`` documentation).
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


class PlanSource:
    """DALI batch callable: ``source(batch_info) -> (jpegs, meta)``.

    ``jpegs`` is a list of uint8 arrays (the encoded files), ``meta`` an ``N x 2`` int64 array of
    ``(label, dataset index)`` rows. Every file is checked with
    ``pipelines.validate.check_image_bytes`` in the reader threads (the bytes are already in
    memory, so the check costs no I/O); bad files raise ``BadFileError`` or, with
    ``skip=True``, are replaced by the next good sample of the batch (the ``BadFilePolicy``
    rule shared with the torch backends) and listed in ``bad_by_epoch``.

    Args:
        paths, labels: the listing (``pipelines.indexing.list_samples``).
        plan: ``plan(epoch) -> list of index arrays`` (the shared batch plan).
        readahead: batches read ahead of the one DALI asks for.
        threads: reader threads.
        keep_alive: fed batches kept referenced (``no_copy`` lifetime, see the module note).
        skip: skip bad files instead of raising.
        max_pixels: decompression-bomb limit.
    """

    def __init__(self, paths: Sequence[str], labels: np.ndarray,
                 plan: Callable[[int], List[np.ndarray]], readahead: int = 3, threads: int = 4,
                 keep_alive: int = 4, skip: bool = False, max_pixels: int = DEFAULT_MAX_PIXELS):
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
        self._batches: List[np.ndarray] = []
        self._planned_epoch = None
        self._pos = 0
        self._pending: Dict[int, Future] = {}
        self._alive: deque = deque(maxlen=keep_alive)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dali-read")

    def start_epoch(self, epoch: int) -> None:
        """Fix the epoch whose plan the next ``iteration == 0`` call starts."""
        self.epoch = epoch

    def _load(self, idx: np.ndarray):
        jpegs, bad, good = [], [], []
        for k, i in enumerate(idx):
            try:
                data = _read(self.paths[i])
                reason = check_image_bytes(data, self.max_pixels)
            except OSError as e:
                data, reason = b"", f"{type(e).__name__}: {e}"
            if reason is not None:
                if not self.skip:
                    raise BadFileError(self.paths[i], reason)
                bad.append((k, reason))
            else:
                good.append(k)
            jpegs.append(np.frombuffer(data, dtype=np.uint8))
        rows = np.array(idx, dtype=np.int64)  # a copy: idx is the plan itself
        if bad and good:  # replace each bad sample by the next good one (wrapping)
            for n, (k, _) in enumerate(bad):
                r = next((g for g in good if g > k), good[n % len(good)])
                jpegs[k] = jpegs[r]
                rows[k] = rows[r]
        meta = np.ascontiguousarray(np.stack([self.labels[rows], rows], axis=1))
        return jpegs, meta, [(self.paths[idx[k]], why) for k, why in bad], bool(good)

    def __call__(self, info):
        if info.iteration == 0 or self._planned_epoch != self.epoch:
            for f in self._pending.values():
                f.cancel()
            self._pending.clear()
            self._batches = self.plan(self.epoch)
            self._planned_epoch = self.epoch
            self._pos = 0
            self.bad_by_epoch[self.epoch] = []
        while True:
            pos = self._pos
            if pos >= len(self._batches):
                raise StopIteration
            for k in range(pos, min(pos + 1 + self.readahead, len(self._batches))):
                if k not in self._pending:
                    self._pending[k] = self._pool.submit(self._load, self._batches[k])
            jpegs, meta, bad, any_good = self._pending.pop(pos).result()
            self._pos += 1
            self.bad_by_epoch[self.epoch] += bad
            if any_good:
                break
            self.dropped_batches += 1  # every file of this batch was bad: skip the batch
        out = (jpegs, meta)
        self.bytes_read += sum(len(j) for j in jpegs)
        self.samples_read += len(jpegs)
        self._alive.append(out)
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
