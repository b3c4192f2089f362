"""An external source that follows the shared per-epoch plan and feeds DALI file *paths*.

NOTE [why an external source]
DALI's file reader shuffles with a bounded buffer (``random_shuffle``), which is not a full
permutation, so it cannot follow ``pipelines.epoch_plan``'s plan. Rebuilding a reader with an
explicit file list every epoch would follow it, but costs a pipeline rebuild per epoch
(docs/results/h200/reader-vs-source in git history). This source hands DALI exactly the plan's batches, in
order, as file-system encoded paths (``os.fsencode``, so any name the file system allows works);
``fn.io.file.read`` in the graph reads the files in DALI's C++ threads.

NOTE [validated once]
Every file is checked with ``pipelines.sources.validate.check_image_bytes`` the first time the plan
reaches it: a small thread pool reads it in Python (file reads release the GIL) ahead of the
batch DALI asks for. The verdict (good, or bad with its reason) is kept per dataset index, so
later epochs feed known-good paths with no Python I/O at all. Reading every file in Python on the
consumer's critical path capped the loader-only rate well below DALI's own reader
(docs/results/h200/reader-vs-source in git history). A file that turns bad after it was checked, or that
passes the check and fails in DALI's decoder, is found by the loader's recovery
(``pipelines.dali.loader`` NOTE [recovery]) and recorded here with :meth:`mark_bad`.

NOTE [bad files are reported where they are yielded]
The source never raises for a bad file: DALI calls it ``queue_depth`` batches ahead of the
consumer, so a raise here would reach the caller batches too early. A bad file is replaced by
the next good sample of its batch (the ``BadFilePolicy`` rule shared with the torch backends),
and the batch's bad files travel in its :class:`Fed` record. The loader takes the records in
the order DALI yields the batches (:meth:`take`) and, at the batch that holds the bad file,
counts it (``skip``) or raises one ``BadFileError`` (``error``), as the torch backends do. A
batch whose files are all bad is not fed; its record rides with the next fed batch of the lane
(or is left for :meth:`take` after the lane's ``StopIteration``).

NOTE [feeding cost]
The per-batch feed runs on the consumer's thread (inside ``next()``), so it is kept small:
the read-ahead pool makes each batch's fed arrays with its checks and draws (``_load``), so a
call only takes a ready batch; labels and indices travel as one dense ``N x 2`` array, and
the path buffers are handed over with ``no_copy=True`` (``python -m tools.microbench feed``).
``no_copy`` makes us responsible for keeping every fed buffer alive until DALI has consumed
it: the last ``keep_alive`` batches are held in a ring (at least ``prefetch_queue_depth`` + 1,
per DALI's ``external_source`` documentation).

NOTE [bytes]
Tar shards (``read`` given: ``Source.read``, one ``os.pread`` per sample) cannot be read by
path, so the source feeds the encoded bytes instead: the read-ahead pool reads every batch's
samples, in every epoch, ``readahead`` batches ahead of DALI, and the graph skips
``fn.io.file.read`` (``build_pipeline(encoded=True)``). A read that fails marks the sample bad.

NOTE [lanes]
With ``DaliOptions.pipelines = n`` the loader runs n DALI pipelines side by side; pipeline k is fed
by ``lane(k)`` with the epoch's batches k, k + n, k + 2n, ... and the loader yields them
round-robin, which restores the plan's order. All lanes share one plan, one verdict record and
one read-ahead pool. A lane whose batch is wholly bad moves on to its next batch (that batch is
counted in ``dropped_batches``), so the yielded order then differs from the plan's by that gap.

NOTE [draws]
Each fed batch carries a row of random numbers per sample (``pipelines.transforms.draws`` NOTE [one
plan]), made by the read-ahead pool with the batch: a crop window needs the decoded image's
size, which ``_check`` reads from the header when it first checks the file; with
``AugmentSpec``'s recipe the row also carries its epoch's output size (``size_of``, fixed when
the epoch's first batch is fed: ``pipelines.resolution`` NOTE [sizes ahead]). The raw generator
outputs behind the rows cost a fixed number of numpy steps per call, so they are made for
``_BLOCK`` samples of the plan at once. A bad sample replaced by another takes that sample's
draws with its file, as the torch backends repeat the other sample's output.

NOTE [running on]
A lane that reaches the end of its epoch raises ``StopIteration``, and its pipeline starts the
next epoch empty: the consumer's first batch of it waits for a whole batch's read, decode and
augmentation. With a target set (``run_on``), a lane goes on with the target epoch's batches
instead, so DALI makes them while the consumer finishes this epoch, as DALI's own reader does
across epochs. The target is usually the next epoch, or the same one again for a consumer that
repeats it. Every fed batch's record carries its pass (``Fed.round``: the current epoch's is
``PlanSource.round``, the target's the one after), and the loader yields a lane's batches of
the current pass only (``pipelines.dali.loader`` NOTE [running on]). A lane crosses only while
it still holds a fed batch of its pass that the loader has not taken, so the batch the loader
asks DALI for next is always one of the pass it is reading (DALI returns its batches in the
order they were fed), and only once: a lane already in the target stops at its end.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from pipelines.sources.validate import DEFAULT_MAX_PIXELS, check_image_bytes, decoded_size, jpeg_size
from pipelines.transforms.draws import DrawPlan


def _frame_size(data: bytes) -> tuple[int, int]:
    """``(height, width)`` from a JPEG's frame header, else ``(1, 1)``: a window that fits
    any image."""
    wh = jpeg_size(data)
    return (wh[1], wh[0]) if wh else (1, 1)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


_UNKNOWN, _GOOD, _BAD = 0, 1, 2
_BLOCK = 4096  # samples whose raw draws are made at once (``pipelines.transforms.draws.mt_raws``)
_KEEP_BLOCKS = 8


@dataclass
class Fed:
    """What one fed batch (or a lane's trailing wholly-bad batches) stands for.

    Attributes:
        positions: the plan positions it covers: wholly-bad batches skipped before it, then its own
            (empty ``rows`` for a trailing record).
        rows: the dataset indices DALI was given (bad samples already replaced).
        bad: ``(path, reason)`` of every bad file in ``positions``.
        dropped: how many of ``positions`` were wholly bad and not fed.
        round: the pass over an epoch it belongs to (``PlanSource.round``; NOTE [running on]).
    """

    positions: list[int]
    rows: np.ndarray
    bad: list[tuple[str, str]] = field(default_factory=list)
    dropped: int = 0
    round: int = 0

    @classmethod
    def empty(cls, round: int = 0) -> Fed:
        return cls([], np.empty(0, np.int64), round=round)


_SPENT = ()  # a ``Lane``'s warm-up batch, once served


class Lane:
    """Pipeline ``k``'s batch callable (``PlanSource.lane``): ``warm``, if given, alone, then
    ``StopIteration`` until ``serve()``, then the source's lane ``k``."""

    __slots__ = ("source", "k", "warm")

    def __init__(self, source: PlanSource, k: int, warm: tuple | None = None):
        self.source, self.k, self.warm = source, k, warm

    def serve(self) -> None:
        """From now on, serve the source's lane ``k`` (drop the warm-up batch)."""
        self.warm = None

    def __call__(self, info):
        if self.warm is None:
            return self.source._serve(self.k, info)
        warm, self.warm = self.warm, _SPENT
        if warm is _SPENT:
            raise StopIteration
        return warm


class PlanSource:
    """DALI batch callable: ``source(batch_info) -> (paths, meta, draws)``.

    ``paths`` is a list of uint8 arrays (``os.fsencode`` file paths, for ``fn.io.file.read``),
    ``meta`` an ``N x 2`` int64 array of ``(label, dataset index)`` rows, ``draws`` the
    ``N x width`` float32 rows of each sample's random numbers (NOTE [draws]). Each file is
    checked with ``pipelines.sources.validate.check_image_bytes`` once, on first use (see the module
    note).

    Args:
        paths, labels: the listing (``pipelines.epoch_plan.list_samples``).
        plan: ``plan(epoch) -> list of index arrays`` (the shared batch plan).
        readahead: batches read ahead of the one DALI asks for.
        threads: reader threads.
        keep_alive: fed batches kept referenced per lane (``no_copy`` lifetime, see the module
            note).
        max_pixels: decompression-bomb limit.
        lanes: pipelines fed side by side (``lane(k)``; NOTE [lanes]).
        size_of: ``size_of(epoch) -> (height, width, resize)``, the output size the rows
            carry when the graph feeds it (``pipelines.resolution`` NOTE [sizes ahead]): asked
            when the epoch's first batch is fed, then kept for the epoch (``fed_size``).
    """

    def __init__(self, paths: Sequence[str], labels: np.ndarray,
                 plan: Callable[[int], list[np.ndarray]], readahead: int = 3, threads: int = 4,
                 keep_alive: int = 4, max_pixels: int = DEFAULT_MAX_PIXELS, lanes: int = 1,
                 read: Callable[[int], bytes] | None = None,
                 size_of: Callable[[int], tuple[int, int, int]] | None = None):
        if not isinstance(lanes, int) or lanes < 1:
            raise ValueError(f"lanes={lanes!r} must be an int >= 1")
        self.paths = list(paths)
        self.read = read  # NOTE [bytes]: feed encoded bytes, not paths
        self.labels = labels
        self.plan = plan
        self.readahead = readahead
        self.max_pixels = max_pixels
        self.epoch = 0
        self.bytes_read = 0
        self.samples_read = 0
        self.lanes = lanes
        self._plans: dict[int, list[np.ndarray]] = {}  # epoch -> its batches (this one, target)
        self._gen = 0            # bumped by start_epoch: one generation per epoch started
        self._planned_gen = -1   # the generation self._plans was made for
        self._lane_gen = [-1] * lanes
        self._lane_epoch = [0] * lanes  # the epoch each lane feeds (NOTE [running on])
        self._lane_round = [0] * lanes  # and its pass: self.round, or the next once it crossed
        self.round = 0  # the current pass: bumped by start_epoch and continue_into
        self._lane_pos = [0] * lanes
        self._target: int | None = None  # the epoch lanes run on into (NOTE [running on])
        self._start_pos: list[int] = list(range(lanes))
        self._stopped = False
        self._carry: list[Fed] = [Fed.empty() for _ in range(lanes)]
        self._fed: list[deque[Fed]] = [deque() for _ in range(lanes)]
        self._pending: dict[tuple[int, int], Future] = {}  # (epoch, position) -> its read
        self._keep_alive = keep_alive
        self._alive: deque = deque(maxlen=keep_alive * lanes)
        self._status = np.zeros(len(self.paths), dtype=np.int8)  # _UNKNOWN / _GOOD / _BAD
        self._size = np.zeros(len(self.paths), dtype=np.int64)    # bytes, once checked
        self._reason: dict[int, str] = {}
        self._hw = np.zeros((len(self.paths), 2), dtype=np.int64)  # decoded (h, w), once checked
        self._draws = DrawPlan(())  # NOTE [draws]: set by draw() once the graph is built
        self._seed = 0
        self.size_of = size_of
        self._sizes: dict[int, tuple[int, int, int]] = {}  # epoch -> the size it is fed at
        self._raws: OrderedDict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._raws_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dali-read")

    # -- epoch control (the loader's side) ---------------------------------------------------
    def start_epoch(self, epoch: int, resume: Sequence[int] | None = None,
                    size: tuple[int, int, int] | None = None, lanes: int | None = None) -> None:
        """Fix the epoch whose plan the lanes' next calls serve.

        Args:
            epoch: the epoch.
            resume: per lane, the plan position to start from (default ``k`` for lane ``k``); the
                loader's recovery passes the first position each lane had not yet yielded.
            size: the epoch's output size (``size_of``); ``None``: the one it was fed at so
                far, if any (a restart within the epoch). Other epochs' are asked again.
            lanes: a new lane count (the DALI tuner's switch to another pipeline count:
                ``pipelines.dali.calibrate`` NOTE [calibration]); ``None``: unchanged. The
                pipelines of the old count must be drained first.
        """
        if lanes is not None and lanes != self.lanes:
            if not isinstance(lanes, int) or lanes < 1:
                raise ValueError(f"lanes={lanes!r} must be an int >= 1")
            self.lanes = lanes
            self._lane_gen, self._lane_epoch = [-1] * lanes, [0] * lanes
            self._lane_round, self._lane_pos = [0] * lanes, [0] * lanes
            self._alive = deque(self._alive, maxlen=self._keep_alive * lanes)
        self._sizes = {epoch: size} if size is not None else {
            e: v for e, v in self._sizes.items() if e == epoch}
        self.epoch = epoch
        self._gen += 1
        self._stopped = False
        self._start_pos = list(resume) if resume is not None else list(range(self.lanes))
        self.round += 1
        self._fed = [deque() for _ in range(self.lanes)]
        self._carry = [Fed.empty(self.round) for _ in range(self.lanes)]

    def run_on(self, target: int | None) -> None:
        """The epoch a lane goes on with at the end of the current one, or ``None``: it stops
        (NOTE [running on])."""
        self._target = target

    @property
    def target(self) -> int | None:
        """The epoch lanes run on into (``run_on``)."""
        return self._target

    def continue_into(self, epoch: int) -> None:
        """Make ``epoch``, which every lane ran on into, the current epoch, keeping each lane's
        place and records (no new generation: the pipelines were not reset)."""
        self.epoch = epoch
        self.round += 1

    def peek(self, k: int) -> Fed | None:
        """The record of the oldest batch of lane ``k`` not yet taken, left in place."""
        return self._fed[k][0] if self._fed[k] else None

    def stop(self) -> None:
        """End the epoch early: every later call raises ``StopIteration``, so draining an
        iterator yields only the batches DALI already holds."""
        self._stopped = True
        self._cancel_pending()

    def take(self, k: int) -> Fed | None:
        """The record of the oldest batch of lane ``k`` not yet taken, or ``None``."""
        return self._fed[k].popleft() if self._fed[k] else None

    def in_flight(self, k: int) -> list[Fed]:
        """Lane ``k``'s records not yet taken: batches DALI holds or is working on."""
        return list(self._fed[k])

    def resume_positions(self) -> list[int]:
        """Per lane, the first plan position not yet taken (where a rebuilt pipeline starts).
        A lane that ran on into the next epoch (NOTE [running on]) and has nothing left of this
        one gets a position past this epoch's end."""
        out = []
        for k in range(self.lanes):
            mine = [f for f in self._fed[k] if f.round == self.round]
            if mine:
                out.append(mine[0].positions[0])
            elif self._carry[k].positions and self._carry[k].round == self.round:
                out.append(self._carry[k].positions[0])
            elif self._lane_gen[k] != self._gen:
                out.append(self._start_pos[k])
            elif self._lane_round[k] != self.round:
                out.append(len(self._plan(self.epoch)) + k)
            else:
                out.append(self._lane_pos[k])
        return out

    def fed_size(self, epoch: int) -> tuple[int, int, int] | None:
        """The output size ``epoch``'s batches are fed at, or ``None`` before its first."""
        return self._sizes.get(epoch)

    def _out_size(self, epoch: int) -> tuple[int, int, int] | None:
        """``epoch``'s output size, asked of ``size_of`` once (NOTE [draws])."""
        if not self._draws.carries_size:
            return None
        if epoch not in self._sizes:
            if self.size_of is None:
                raise RuntimeError("the graph feeds the output size, but the source has no "
                                   "size_of")
            self._sizes = {e: v for e, v in self._sizes.items() if e in (self.epoch, self._target)}
            self._sizes[epoch] = self.size_of(epoch)
        return self._sizes[epoch]

    def draw(self, plan: DrawPlan, seed: int) -> None:
        """Fill the rows of draws by ``plan`` (the built graph's layout), from ``seed``."""
        if plan != self._draws or seed != self._seed:
            with self._raws_lock:
                self._raws.clear()
            self._draws, self._seed = plan, seed

    def mark_bad(self, index: int, reason: str) -> None:
        """Record dataset index ``index`` as bad (found outside the byte check)."""
        self._reason[index] = reason
        self._status[index] = _BAD

    # -- checking ---------------------------------------------------------------------------
    def _check(self, i: int) -> bytes:
        try:
            data = self.read(i) if self.read is not None else _read(self.paths[i])
            reason = check_image_bytes(data, self.max_pixels)
            if reason is None:  # a header PIL cannot read: the decoder decides (NOTE [draws])
                self._hw[i] = decoded_size(data) or _frame_size(data)
        except OSError as e:
            data, reason = b"", f"{type(e).__name__}: {e}"
        self._size[i] = len(data)
        if reason is not None:
            self._reason[i] = reason
        self._status[i] = _BAD if reason is not None else _GOOD  # last: publishes the verdict
        return data

    @property
    def files_checked(self) -> int:
        """Files read and checked in Python so far (each at most once)."""
        return int((self._status != _UNKNOWN).sum())

    def _raws_of(self, epoch: int, pos: int, batches: list[np.ndarray]) -> np.ndarray:
        """The raw generator outputs of batch ``pos``'s samples (NOTE [draws]), made for
        ``_BLOCK`` samples' worth of batches at once and kept for a few blocks."""
        per = max(1, _BLOCK // max(1, len(batches[0])))
        block = pos // per
        key = (epoch, block)
        with self._raws_lock:
            got = self._raws.get(key)
            if got is None:
                part = batches[block * per:(block + 1) * per]
                idx = np.concatenate(part) if part else np.empty(0, np.int64)
                starts = np.cumsum([0] + [len(b) for b in part])
                got = (self._draws.raws(self._seed, epoch, idx), starts)
                self._raws[key] = got
                while len(self._raws) > _KEEP_BLOCKS:
                    self._raws.popitem(last=False)
            raws, starts = got
        k = pos - block * per
        return raws[starts[k]:starts[k + 1]]

    def _load(self, epoch: int, pos: int, batches: list[np.ndarray], size=None):
        """Batch ``pos`` of ``epoch`` as the lane serves it, made in the read-ahead pool (NOTE
        [feeding cost]): ``(rows, bad, fed, nbytes)``, ``fed`` the ``(paths, meta, draws)``
        DALI is given (``None``: every file was bad), ``nbytes`` the files' bytes."""
        idx = batches[pos]
        data: dict[int, bytes] = {}
        for i in idx[self._status[idx] == _UNKNOWN]:
            data[int(i)] = self._check(int(i))
        if self.read is not None:  # NOTE [bytes]: every epoch reads the samples here
            for i in np.unique(idx).tolist():
                if i not in data and self._status[i] == _GOOD:
                    try:
                        data[i] = self.read(i)
                    except OSError as e:
                        self.mark_bad(i, f"{type(e).__name__}: {e}")
        rows = np.array(idx, dtype=np.int64)  # a copy: idx is the plan itself
        is_bad = self._status[rows] == _BAD
        bad = []
        take = np.arange(len(rows))  # the sample whose draws each place gets
        if is_bad.any():
            ks = np.flatnonzero(is_bad)
            bad = [(self.paths[rows[k]], self._reason[int(rows[k])]) for k in ks]
            good = np.flatnonzero(~is_bad)
            for n, k in enumerate(ks):  # replace each bad sample by the next good one (wrapping)
                if len(good):
                    later = good[good > k]
                    take[k] = later[0] if len(later) else good[n % len(good)]
                    rows[k] = rows[take[k]]
        if is_bad.all():
            return rows, bad, None, 0
        if self.read is not None:  # NOTE [bytes]
            paths = [np.frombuffer(data[i], dtype=np.uint8) for i in rows.tolist()]
        else:
            paths = [np.frombuffer(os.fsencode(self.paths[i]), dtype=np.uint8)
                     for i in rows.tolist()]
        meta = np.stack([self.labels[rows], rows], axis=1).astype(np.int64, copy=False)
        plan = self._draws
        raws = self._raws_of(epoch, pos, batches)[take]
        draws = plan.rows(raws, self._hw[rows] if plan.needs_size else None, size)
        return rows, bad, (paths, np.ascontiguousarray(meta), draws), int(self._size[rows].sum())

    # -- serving (DALI's side) ------------------------------------------------------------------
    def lane(self, k: int, ahead: bool = False) -> Lane:
        """The DALI batch callable of pipeline ``k``: it serves the epoch's batches ``k,
        k + lanes, k + 2 * lanes, ...`` (see NOTE [lanes]). ``ahead``: for pipelines built
        ahead of a switch to another count (``pipelines.dali.calibrate`` NOTE
        [calibration]), so ``k`` may reach past the lanes running now; it serves the last
        batch fed (``last_fed``, a warm-up) alone, then the end of the data, until
        ``Lane.serve()``."""
        if not 0 <= k < (k + 1 if ahead else self.lanes):
            raise ValueError(f"lane k={k!r} must be in [0, lanes={self.lanes})")
        return Lane(self, k, (self.last_fed() or _SPENT) if ahead else None)

    def last_fed(self) -> tuple | None:
        """The last batch fed to any lane, kept alive (``no_copy``), or ``None``."""
        return self._alive[-1] if self._alive else None

    def _cancel_pending(self) -> None:
        for f in self._pending.values():
            f.cancel()
        self._pending.clear()

    def _plan(self, epoch: int) -> list[np.ndarray]:
        """``epoch``'s batches, planned once per generation; only the current epoch's and the
        target's are kept."""
        if epoch not in self._plans:
            self._plans = {e: b for e, b in self._plans.items() if e in (self.epoch, self._target)}
            self._plans[epoch] = self.plan(epoch)
        return self._plans[epoch]

    def _may_cross(self, k: int) -> bool:
        """Whether lane ``k``, at the end of its epoch, goes on with the target (NOTE
        [running on]): a target is set, the lane is in the current pass, and the loader has a
        fed batch of it still to take."""
        return (self._target is not None and self._lane_round[k] == self.round
                and any(f.round == self.round and len(f.rows) for f in self._fed[k]))

    def _serve(self, k: int, info):
        if self._stopped:
            raise StopIteration
        if info.iteration == 0 or self._lane_gen[k] != self._gen:
            if self._planned_gen != self._gen:  # the first lane to start this epoch plans it
                self._cancel_pending()
                self._plans = {}
                self._planned_gen = self._gen
            self._lane_gen[k] = self._gen
            self._lane_epoch[k], self._lane_round[k] = self.epoch, self.round
            self._lane_pos[k] = self._start_pos[k]
        carry = self._carry[k]
        while True:
            epoch, pos = self._lane_epoch[k], self._lane_pos[k]
            batches = self._plan(epoch)
            if pos >= len(batches):
                if carry.positions:  # trailing wholly-bad batches: the loader takes them last
                    self._fed[k].append(carry)
                    carry = self._carry[k] = Fed.empty(carry.round)
                if not self._may_cross(k):
                    raise StopIteration
                # _may_cross: a target is set
                self._lane_epoch[k], self._lane_pos[k] = cast(int, self._target), k
                self._lane_round[k] += 1
                carry = self._carry[k] = Fed.empty(self._lane_round[k])
                continue
            for q in range(pos, min(pos + 1 + self.readahead * self.lanes, len(batches))):
                if (epoch, q) not in self._pending:
                    self._pending[(epoch, q)] = self._pool.submit(self._load, epoch, q, batches,
                                                                  self._out_size(epoch))
            rows, bad, out, nbytes = self._pending.pop((epoch, pos)).result()
            self._lane_pos[k] += self.lanes
            carry.positions.append(pos)
            carry.bad += bad
            if out is not None:
                break
            carry.dropped += 1  # every file of this batch was bad: skip the batch
        carry.rows = rows
        self._fed[k].append(carry)
        self._carry[k] = Fed.empty(carry.round)
        self.bytes_read += nbytes
        self.samples_read += len(rows)
        self._alive.append(out)
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
