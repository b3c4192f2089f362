"""``LoaderBase``: what every backend shares, in the template-method shape of torchdata's
``BaseNode``.

The base owns the placement (rank, world size and device, resolved when the loader is built:
``pipelines.placement``), the listing, the epoch plan (which batches this rank reads this epoch), the
lifecycle (closed checks, ``close()`` twice, the context manager, ``__del__``), epoch
validation, the bad-file rule and the stats bracketing of each epoch. A backend supplies:

* ``_produce(epoch, start)``: ``(Batch, indices)`` for each batch of ``self.plan(epoch)`` from
  position ``start`` on, in order, without decoding the batches before ``start``
  (``indices``: the dataset index of each sample, or ``None`` when not recorded);
* ``_release()``: free its workers, pipelines and memory (called once);
* ``h2d_bytes_per_sample()``: bytes one sample moves from host to device.

Bad files found by a backend are handed to ``_report(files, dropped)`` when the consumer
reaches their batch: raised under ``error``, counted under ``skip``.

NOTE [resume]
``state_dict()`` is small and plain (ints and strings): the epoch, the batches of it the
consumer has received (not what workers or DALI made ahead), and what identifies the plan
(seed, shuffle, policy, batch size, world size, with tar shards the ``shuffle_window``, and the
dataset: its sample count and a hash of the listing, paths taken relative to the root, so the
same dataset mounted elsewhere matches). ``load_state_dict(sd)`` checks the whole state before
it changes anything: a part that is missing, unknown, of the wrong type (a bool where an int
belongs, a float, a string, a list), out of range, or of another plan is one ``ValueError``
naming the field, and the loader is left exactly as it was (its epoch, its pending position,
DALI's pipelines). An accepted state sets ``epoch`` and makes the next ``iter()`` of that
epoch start at the next batch; a ``set_epoch`` to another epoch drops the pending position.
The skipped batches are not decoded. Every backend then yields exactly the batches an
uninterrupted run would: the torch backends seed each sample's augmentation from ``(seed, epoch,
index)``, so a state is positions only and a state saved on rank 0 resumes rank 1 exactly on its
own shard; the DALI backend adds its pipelines' checkpoints (their random generators) to the
state, tagged with the rank, the pipeline count, the augmentation graph and the position they
were taken at (``DaliLoader.state_dict``), and refuses them by name on another rank or graph.
A torch backend ignores a DALI part; a DALI loader given a state without one resumes the same
samples with its own, fresh, random draws.

NOTE [positions]
A position is a batch of the plan, not a batch handed out. A batch whose files are all bad
yields nothing (``skip``); the backend reports it as ``dropped`` with the next batch it yields
(or after its last one), and the base counts it as consumed: the batch handed over is at plan
position ``received + dropped``, so ``state_dict()["batches"]`` after it says where the plan
goes on, and a resumed run joins the uninterrupted one exactly after any dropped batch. The
same position picks the batch's row mask: ``Batch.valid`` is ``False`` for the rows ``PAD``
repeats and for the rows that stand in for a bad file (told from the plan: a stand-in's index
is not the plan's), so the valid rows of an epoch, over all ranks, are each good sample once.

NOTE [one iterator]
One loader serves one iterator at a time, on every backend: ``iter()`` ends the iterator made
before it, if that one is still live, and ``load_state_dict()`` ends the live iterator too (its
state applies at the next ``iter()``). An ended iterator's next ``next()`` raises one
``RuntimeError`` naming what ended it, before it reads anything, so two iterators never split
one epoch between them, and each ``iter()`` gets its whole epoch. The newer ``iter()`` wins,
rather than raising, because training frameworks keep the last epoch's iterator referenced
when they start the next epoch without reading it past ``len()`` (Lightning's fit loop, and
``limit_train_batches``). Backends never see an ended iterator: the base closes its
``_produce`` at once (as a ``break`` does; not whenever the garbage collector reaches an iterator
a framework still holds), checks before it asks ``_produce`` for a batch, and ``_produce`` of the
new one starts as after an early end. ``close()`` ends the live iterator the same way.

NOTE [epochs advance]
An ``iter()`` reads ``epoch`` when its first batch is asked for (so a ``set_epoch`` between
``iter()`` and the first ``next()`` still counts). If an earlier iterator began an epoch (its
first ``next()`` ran: to its end, left early, ended by a later ``iter()``, or raised) and
neither ``set_epoch`` nor ``load_state_dict`` came after that, the new one first advances
``epoch`` by one: each epoch read without ``set_epoch`` is a new one, as each ``iter()`` of a
shuffling ``DataLoader`` is a new permutation. An ``iter()`` never read (Lightning makes one only
to check that the loader is iterable) advances nothing. ``set_epoch(n)`` and an accepted state
name the next epoch exactly, so code that calls ``set_epoch`` every epoch (Lightning's fit loop,
Accelerate, a ``DistributedSampler`` loop) reads the same epochs as before. Between epochs
``epoch`` and ``state_dict()`` still name the epoch read last (``batches == len()`` once it ran
to its end): a state resumes the epoch it was taken in, and a loader resumed from a state taken
at an epoch's end reads the empty rest of that epoch at its first ``iter()`` and the next epoch
at its second, as the uninterrupted loader would at its next ``iter()``.
"""
from __future__ import annotations

import functools
import hashlib
import operator
import os
import reprlib
import warnings
import weakref
from collections.abc import Generator, Iterator, Sequence
from typing import Any, cast

import numpy as np
import torch

from pipelines.config import BadFilePolicy, LastBatchPolicy, LoaderConfig, resolve
from pipelines.distributed import from_rank0
from pipelines.epoch_plan import (
    MAX_EPOCH,
    as_epoch,
    check_nonempty,
    config_batches,
    config_len,
    config_plan,
    unequal_steps,
)
from pipelines.options import Options
from pipelines.placement import check_unchanged
from pipelines.resolution import Resolutions
from pipelines.sources.root import open_source, root_base
from pipelines.sources.targets import build_targets
from pipelines.sources.validate import BadFileError
from pipelines.stats import BadFileStats
from pipelines.transforms.mix import mix_batch, mix_rng
from pipelines.transforms.plan import TransformPlan
from pipelines.types import Batch

STATE_VERSION = 1


def _show(value: Any) -> str:
    """``repr(value)``, cut short (a state may hold anything)."""
    return reprlib.repr(value)


def _same_value(got: Any, want: Any) -> bool:
    """``got == want`` of the same kind: ``True`` is not ``1``, ``9.0`` is not ``9``."""
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if isinstance(want, int):
        try:
            return operator.index(got) == want
        except TypeError:
            return False
    return type(got) is type(want) and got == want


def _state_int(name: str, value: Any, lo: int, hi: int, span: str = "") -> int:
    """``value`` as an int in ``[lo, hi)``, or a ``ValueError`` naming the state's ``name``."""
    try:
        v = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        v = None
    if v is None or not lo <= v < hi:
        raise ValueError(f"load_state_dict: {name}={_show(value)} must be an int in "
                         f"{span or f'[{lo}, {hi})'}")
    return v


def _valid_rows(planned: tuple[list[np.ndarray], list[np.ndarray]], at: int,
                indices: Any) -> np.ndarray | None:
    """The ``Batch.valid`` rows of the batch at plan position ``at`` (NOTE [positions]):
    ``False`` where ``PAD`` repeats a sample and where a row stands in for a bad file (its
    index is not the plan's: a stand-in is another, good, sample); ``None`` when all are
    valid."""
    batches, valid = planned
    got = np.asarray(indices, dtype=np.int64).reshape(-1)
    if at >= len(batches) or len(batches[at]) != len(got):  # pragma: no cover - a backend bug
        raise RuntimeError(f"batch {at} of {len(got)} rows does not match the epoch's plan")
    ok = valid[at] & (got == batches[at])
    return None if ok.all() else ok


def _ended(by: str) -> RuntimeError:
    if by == "iter()":
        return RuntimeError("this iterator ended when a later iter() of its loader began: one "
                            "loader serves one iterator at a time; read "
                            "the newest iterator, or make a second loader for a second stream")
    if by == "close()":
        return RuntimeError("this iterator's loader is closed; create a new one with "
                            "create_loader()")
    return RuntimeError("this iterator ended when load_state_dict() was called; the state "
                        "applies at the next iter(): start a new one")


# NOTE [forked copies]
# A DataLoader worker is a fork of the process that made it, so it holds a copy of every
# loader that process had, closed or not, garbage or not. When its garbage collector frees
# such a copy, ``__del__`` must not release what belongs to the parent: DALI's pipelines
# wait forever in their shutdown for threads that do not exist in the fork (the worker then
# never delivers, and the parent waits on it). So each live loader is kept alive in a forked
# child for the child's life, and marked closed there.
_LIVE: weakref.WeakSet[LoaderBase] = weakref.WeakSet()
_FORKED: list[LoaderBase] = []


def _after_fork_in_child() -> None:
    for loader in list(_LIVE):
        loader._closed = True  # a forked copy never releases the parent's workers or pipelines
        _FORKED.append(loader)  # and is never freed in the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _checked(produce, fetch):
    """``produce``'s items; with a remote source, the fetcher's failure (the cause of any
    reader's) is raised in its place (``pipelines.sources.spool`` NOTE [spool])."""
    if fetch is None:
        yield from produce
        return
    try:
        for item in produce:
            fetch.check()
            yield item
    except Exception:
        fetch.check()
        raise


def _stops_fetcher_on_failure(init):
    """``init`` that, when it raises, closes the fetcher the half-built loader started, at once
    (not when the loader is collected, which the caller's traceback delays)."""
    @functools.wraps(init)
    def build(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except BaseException:
            fetch = self.__dict__.get("_fetch")
            if fetch is not None:
                fetch.close()
            raise
    return build


class EpochHook:
    """``loader.sampler``: what training frameworks call at each epoch start.

    Lightning's fit loop (and code written for ``DistributedSampler``) calls
    ``dataloader.sampler.set_epoch(epoch)``; this forwards it to ``loader.set_epoch``, so the
    epoch advances with no call in the user's code. It holds the loader weakly (no cycle)."""

    def __init__(self, loader: LoaderBase):
        self._loader = weakref.ref(loader)

    def set_epoch(self, epoch: int) -> None:
        loader = self._loader()
        if loader is not None:
            loader.set_epoch(epoch)


class LoaderBase:
    """The shared half of every backend (module doc). Subclasses call ``super().__init__``
    first, then build their machinery.

    Args:
        config: the ``LoaderConfig``; ``self.config`` is it resolved (rank, world size,
            ``last_batch``, device), ``self.placement`` says where they came from.
        options: the backend's validated options (``TorchOptions`` or ``DaliOptions``).

    Attributes:
        paths, labels, classes: the listing (dataset index ``i`` is ``paths[i]``).
        epoch: the epoch being read, or read last; the next ``iter()`` reads the one after it
            unless ``set_epoch`` or ``load_state_dict`` named it since (NOTE [epochs advance]).
        sampler: the hook Lightning calls ``set_epoch`` on at each epoch (``EpochHook``).
        batch_sampler: ``None``: a framework looking for a ``DataLoader``'s batch sampler (as
            Lightning does for every loader it is given) finds that there is none to wrap.
        position: ``(epoch, plan positions of it consumed)`` (NOTE [positions]).
        last_indices, last_batch_indices: with ``LoaderConfig.debug_indices``, the dataset
            indices of the last full epoch and of the batch yielded last (``BatchLoader``).
    """

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:  # a failed build stops the spool's fetcher
            cls.__init__ = _stops_fetcher_on_failure(cls.__dict__["__init__"])  # type: ignore[method-assign]

    def __init__(self, config: LoaderConfig, options: Options):
        self._closed = True  # until built: __del__ of a half-built loader does nothing
        config, self.placement = resolve(config)
        self.config = config
        self.options = options
        self.data_source = from_rank0(functools.partial(  # NOTE [listing once]
            open_source, config.root, allow_empty=config.allow_empty_classes,
            extensions=config.extensions, skip_bad=config.on_bad_file is BadFilePolicy.SKIP,
            target=config.target, storage=config.storage(), classes=config.classes),
            self.placement)
        self.paths, self.labels, self.classes = (self.data_source.names, self.data_source.labels,
                                                 self.data_source.classes)
        check_nonempty(len(self.paths), config)
        uneven = unequal_steps(len(self.paths), config)
        if uneven and config.last_batch is LastBatchPolicy.PARTIAL:
            warnings.warn(
                f"last_batch='partial' with world_size={config.world_size}: ranks get "
                f"{uneven[0]} or {uneven[1]} batches per epoch, and in a DDP loop the ranks "
                "with more wait forever in all-reduce at their last step (a hang); use the "
                "default (pad) or 'drop' for training", RuntimeWarning, stacklevel=4)
        # the plan as a function that holds no reference to the loader (workers, samplers and
        # DALI's feed keep it; a reference back would make a cycle and delay close())
        self.plan_of = functools.partial(config_batches, len(self.paths), config,
                                         groups=self.data_source.groups)
        self._plan_valid = functools.partial(config_plan, len(self.paths), config,
                                             groups=self.data_source.groups)
        read = self.data_source.read  # tar shards: a target_fn gets SHARD.tar/MEMBER
        self.targets = build_targets(config.target, self.paths, root_base(config.root),
                                     self.data_source.targets,
                                     shards=getattr(read, "shards", getattr(read, "names", None)),
                                     shard_of=getattr(read, "shard_of", None))
        self._fetch = self._fetcher()  # remote shards: pipelines.sources.spool NOTE [spool]
        self.transform_plan = TransformPlan.of(config.augment, config.transform)
        # set_resolution: each epoch's size, and the recipe of the epoch running (or run last)
        self._sizes = Resolutions(config.augment, fixed=config.transform is not None,
                                  max_pixels=config.max_image_pixels)
        self._res = config.augment
        self.mix = config.mix  # a MixSpec or None (pipelines.transforms.mix)
        if self.mix is not None and self.mix.num_classes not in (None, len(self.classes)):
            raise ValueError(f"mix: num_classes={self.mix.num_classes} but the dataset has "
                             f"{len(self.classes)} classes; leave num_classes=None to use them")
        self.stats = BadFileStats()
        self.stats.add(self.data_source.skipped)  # classes outside LoaderConfig.classes
        self.last_indices: np.ndarray | None = None
        self.epoch = 0
        self._advance = False  # an epoch began since set_epoch: NOTE [epochs advance]
        self.sampler = EpochHook(self)  # Lightning's per-epoch set_epoch call lands here
        self._pos: tuple[int, int] = (0, 0)  # (epoch, plan positions consumed: NOTE [positions])
        self._dropped = 0  # wholly-bad batches reported since the last hand-over
        self._bad_rows = False  # the batch being handed over had bad files
        self.last_batch_indices: np.ndarray | None = None  # with debug_indices
        self._resume: tuple[int, int] | None = None  # from load_state_dict (NOTE [resume])
        self._listing_hash: str | None = None
        self._token = 0  # bumped by iter() and load_state_dict() (NOTE [one iterator])
        self._ended_by = ""  # which of them bumped it last
        self._live: Generator | None = None  # the live iterator's _produce
        self._closed = False
        _LIVE.add(self)  # NOTE [forked copies]

    def _fetcher(self):
        """The spool's fetcher when the source is remote shards, else ``None``."""
        from pipelines.sources.spool import Fetcher, SpoolReader

        read = self.data_source.read
        if not isinstance(read, SpoolReader):
            return None
        from pipelines.sources import remote

        c = self.config
        remote.register(c.root, c.storage())  # the real URLs here (rank 0 may have listed)
        return Fetcher(read, self.plan_of, len(self), skip_bad=c.on_bad_file is BadFilePolicy.SKIP,
                       cache=c.shard_cache, cache_bytes=c.shard_cache_bytes)

    # -- what the backend supplies ------------------------------------------------------------
    def _produce(  # pragma: no cover
            self, epoch: int, start: int) -> Generator[tuple[Batch, object], None, None]:
        raise NotImplementedError

    def _release(self) -> None:  # pragma: no cover
        raise NotImplementedError

    def h2d_bytes_per_sample(self) -> float | None:  # pragma: no cover
        """Bytes one sample moves from host to device (0 on the CPU, ``None`` if unknown)."""
        raise NotImplementedError

    # -- the plan -----------------------------------------------------------------------------
    def plan(self, epoch: int) -> list[np.ndarray]:
        """The dataset indices of each batch this rank reads in ``epoch``."""
        return self.plan_of(epoch)

    def __len__(self) -> int:
        return config_len(len(self.paths), self.config)

    #: no ``DataLoader`` batch sampler to inspect or wrap (Lightning reads it for every loader)
    batch_sampler = None

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next ``iter()`` reads (its order and augmentation seeds). Without it,
        each ``iter()`` after the first reads the epoch after the last one begun (NOTE [epochs
        advance])."""
        self.epoch = as_epoch(epoch)
        self._advance = False
        if self._resume is not None and self._resume[0] != self.epoch:
            self._resume = None

    # -- resume (NOTE [resume]) ---------------------------------------------------------------
    def _plan_id(self) -> dict[str, Any]:
        c = self.config
        if self._listing_hash is None:  # paths relative to the root: a moved dataset matches
            base = root_base(c.root)
            h = hashlib.sha256()
            for path, label in zip(self.paths, np.asarray(self.labels).tolist()):
                rel = os.path.relpath(path, base)
                h.update(f"{rel}\0{label}\n".encode("utf-8", "surrogateescape"))
            self._listing_hash = h.hexdigest()
        ids = {"samples": len(self.paths), "listing": self._listing_hash,
               "world_size": c.world_size, "batch_size": c.batch_size, "seed": c.seed,
               "shuffle": c.shuffle, "last_batch": cast(LastBatchPolicy, c.last_batch).value}
        if self.data_source.groups is not None:  # tar shards: the window shapes the plan
            ids["shuffle_window"] = c.shuffle_window
        return ids

    @property
    def position(self) -> tuple[int, int]:
        """``(epoch, plan positions of it consumed)``, as ``state_dict`` saves it: the batches
        the consumer has received and the wholly-bad ones dropped before them (NOTE
        [positions])."""
        return self._pos

    def state_dict(self) -> dict[str, Any]:
        """Where the consumer is: the epoch, the batches of it received, and the plan's
        identity. Plain ints, bools and strings (``torch.save`` and JSON both hold it)."""
        epoch, done = self._resume if self._resume is not None else self._pos
        if self._resume is None and epoch != self.epoch:  # set_epoch since: nothing read yet
            epoch, done = self.epoch, 0
        state = {"version": STATE_VERSION, "epoch": epoch, "batches": done, **self._plan_id()}
        # set_resolution: the size of the epoch the state resumes (the one that ran, when it is
        # that epoch's position, else the one its next iter() takes) and of those after it
        ran = self._resume is None and 0 < done < len(self)
        state.update(self._sizes.saved(epoch, self._res if ran else self._sizes.at(epoch)))
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state``: ``epoch`` is set and the next ``iter()`` of that epoch starts
        at the first batch the saved consumer had not received. The whole state is checked
        first; a refused state changes nothing. A live iterator ends (NOTE [one iterator]).

        Raises:
            ValueError: naming the field: a part missing, unknown, of the wrong type or out of
                range, or of another plan (dataset, world size, batch size, seed, shuffle,
                last-batch policy, shuffle window).
        """
        epoch, done = self._checked(state)
        sizes = self._sizes.checked(state, epoch)
        self._end_live("load_state_dict()")
        self._sizes.load(*sizes)
        self.epoch = epoch
        self._advance = False
        self._resume = (epoch, done)

    def _checked(self, state: Any) -> tuple[int, int]:
        """``(epoch, batches)`` of ``state`` once every field the base owns is checked, or a
        ``ValueError`` naming the first bad one; nothing is changed."""
        if not isinstance(state, dict):
            raise ValueError(f"load_state_dict: state={_show(state)} is not a dict from "
                             "state_dict()")
        mine = self._plan_id()
        known = {"version", "epoch", "batches", *mine, *self._extra_keys}
        for k in ("version", *mine, "epoch", "batches"):  # the dataset's first: it says most
            if k not in state:
                raise ValueError(f"load_state_dict: the state has no '{k}' field; pass a "
                                 "state from state_dict() as it is")
            if k == "version" and not _same_value(state[k], STATE_VERSION):
                raise ValueError(f"load_state_dict: version={_show(state[k])} is not "
                                 f"{STATE_VERSION}, the version of this loader's states")
            v = mine.get(k)
            if k in mine and not _same_value(state[k], v):
                what = "dataset" if k in ("samples", "listing") else k
                raise ValueError(f"load_state_dict: {what} differs: the state has {k}="
                                 f"{_show(state[k])}, this loader {v!r}; resume with the same "
                                 f"{what} or start afresh")
        for k in state:
            if k not in known:
                raise ValueError(f"load_state_dict: the state has an unknown field {_show(k)} "
                                 f"(this loader's state_dict() has {sorted(known)}); pass a "
                                 "state from state_dict() as it is")
        epoch = _state_int("epoch", state["epoch"], 0, MAX_EPOCH)
        done = _state_int("batches", state["batches"], 0, len(self) + 1,
                          f"[0, len()={len(self)}]")
        return epoch, done

    #: parts a state may hold besides the base's: ``dali``, the pipeline checkpoints that
    #: states of earlier versions carried, is accepted and ignored (a state is the position
    #: only: pipelines.transforms.draws NOTE [one plan])
    _extra_keys: tuple[str, ...] = ("dali", "resolution", "resolution_schedule")

    # -- progressive resizing (pipelines.resolution NOTE [sizes ahead]) ----------------------
    def set_resolution(self, size: int | tuple[int, int], epoch: int | None = None) -> None:
        """Make the output ``size`` (an int, or ``(height, width)``) that of the epochs from the
        next ``iter()`` on, or, with ``epoch``, from that epoch on: the ``AugmentSpec`` recipe
        at that size, the same draws, on every backend. An epoch that has begun keeps its size.
        Sizes are saved in ``state_dict``. Workers and pipelines are kept; what was made ahead
        of an epoch at another size is dropped at its ``iter()``, so announce a size before the
        epoch before it ends (``epoch=``) and nothing is dropped.

        Example: ``set_resolution(128, epoch=4)`` and ``set_resolution(160, epoch=8)`` on a
        loader built at 96: epochs 0-3 at 96, 4-7 at 128, 8 on at 160; a later
        ``set_resolution(96)`` makes it 96 for every epoch again.

        Args:
            size: an int (square) or ``(height, width)``.
            epoch: the first epoch at ``size`` (up to the next epoch given a size); ``None``:
                every epoch, from the next ``iter()`` on.

        Raises:
            ValueError: naming ``size``, ``epoch``, or ``transform`` (a user Compose has its
                own sizes).
        """
        self._sizes.set(size, epoch)

    @property
    def resolution(self) -> tuple[int, int]:
        """The output ``(height, width)`` of the epoch the next ``iter()`` runs."""
        return self._sizes.at(self.epoch + self._advance).hw

    # -- the epoch (NOTE [one iterator]) ------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        if self._closed:
            raise RuntimeError("this loader is closed; create a new one with create_loader()")
        check_unchanged(self.placement)
        self._end_live("iter()")
        return self._epoch(self._token)

    def _end_live(self, by: str) -> None:
        """End the live iterator, if any: its next ``next()`` raises, naming ``by``. Its
        backend half is closed now, as a ``break`` would (not whenever the garbage collector
        gets to an iterator a framework still holds), so it never runs beside the next one."""
        self._token += 1
        self._ended_by = by
        live, self._live = self._live, None
        if live is not None:
            live.close()

    def _epoch(self, token: int) -> Iterator[Batch]:
        if token != self._token:
            raise _ended(self._ended_by)
        if self._advance:  # an epoch began and nothing named the next: NOTE [epochs advance]
            self.epoch = as_epoch(self.epoch + 1)
        self._advance = True
        epoch = self.epoch
        self._res = self._sizes.at(epoch)  # the backend makes the epoch at this size
        start = self._resume[1] if self._resume is not None and self._resume[0] == epoch else 0
        self._resume = None
        self._pos = (epoch, start)
        self.stats.start_epoch(epoch)
        fetch = self._fetch
        if fetch is not None:
            fetch.follow(epoch, start)
        seen: list | None = [] if self.config.debug_indices else None
        c = self.config
        padded = c.last_batch is LastBatchPolicy.PAD
        planned: tuple[list[np.ndarray], list[np.ndarray]] | None = None  # made when needed
        self._dropped, self._bad_rows = 0, False
        self._live = produce = self._produce(epoch, start)
        try:
            for batch, indices in _checked(produce, fetch):
                at = self._pos[1] + self._dropped  # this batch's plan position (NOTE [positions])
                ok = None
                if (padded or self._bad_rows) and indices is not None:
                    if planned is None:
                        planned = self._plan_valid(epoch)
                    ok = _valid_rows(planned, at, indices)
                self._dropped, self._bad_rows = 0, False
                images, labels = batch.images, batch.labels
                if self.targets is not None:  # pipelines.sources.targets: gathered by index
                    labels = self.targets[torch.as_tensor(np.asarray(indices, np.int64))].to(
                        images.device, non_blocking=True)
                if self.mix is not None:  # on the device, the same for every backend
                    images, labels = mix_batch(images, labels, self.mix, len(self.classes),
                                               mix_rng(c.seed, epoch, cast(int, c.rank), at))
                batch = Batch(images, labels, indices, ok)
                if seen is not None and indices is not None:
                    seen.append(np.asarray(indices, dtype=np.int64).reshape(-1))
                    self.last_batch_indices = seen[-1]
                self._pos = (epoch, at + 1)  # counted as handed over
                if fetch is not None:
                    fetch.at(*self._pos)
                yield batch
                if token != self._token:  # iter() or load_state_dict() since: read nothing more
                    raise _ended(self._ended_by)
            # trailing wholly-bad batches, reported after the last batch: consumed too
            self._pos, self._dropped = (epoch, self._pos[1] + self._dropped), 0
        finally:  # a break, an error or an end: the backend half ends with it
            if self._live is produce:
                self._live = None
            produce.close()
        self.stats.end_epoch()
        if seen is not None:
            self.last_indices = np.concatenate(seen) if seen else np.empty(0, np.int64)

    def _report(self, files: Sequence[tuple[str, str]], dropped: int = 0) -> None:
        """Raise (``error``) or count (``skip``) the bad files of the batch being handed out
        (and ``dropped`` batches before it that had no good sample: plan positions it
        consumes, NOTE [positions]). A backend calls it before it yields that batch, or after
        its last batch for trailing ``dropped`` ones."""
        if not files:
            return
        fetch = getattr(self, "_fetch", None)
        if fetch is not None:  # its readers failed because the fetcher did: its error instead
            fetch.check()
        if self.config.on_bad_file is BadFilePolicy.ERROR:
            raise BadFileError(*files[0])
        self.stats.add(files)
        self.stats.dropped_batches += dropped
        self._dropped += dropped
        self._bad_rows = True

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release the backend's workers, pipelines and memory. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self._end_live("close()")
        finally:
            try:
                self._release()
            finally:
                if getattr(self, "_fetch", None) is not None:
                    self._fetch.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
