"""``LoaderBase``: what every backend shares, in the template-method shape of torchdata's
``BaseNode``.

The base owns the placement (rank, world size and device, resolved when the loader is built:
``pipelines.distributed``), the listing, the epoch plan (which batches this rank reads this epoch), the
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
(seed, shuffle, policy, batch size, world size, and the dataset: its sample count and a hash
of the listing, paths taken relative to the root, so the same dataset mounted elsewhere
matches). ``load_state_dict(sd)`` refuses a state of another plan with one error naming
the field, sets ``epoch`` and makes the next ``iter()`` of that epoch start at the next batch;
a ``set_epoch`` to another epoch drops the pending position. The skipped batches are not
decoded. Every backend then yields exactly the batches an uninterrupted run would: the torch
backends seed each sample's augmentation from ``(seed, epoch, index)``, and the DALI backend adds
its pipelines' checkpoints (their random generators) to the state (``DaliLoader.state_dict``).
"""
from __future__ import annotations

import functools
import hashlib
import os
import warnings
import weakref
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .config import BadFilePolicy, LastBatchPolicy, LoaderConfig
from .distributed import check_unchanged, from_rank0, resolve
from .indexing import as_epoch, check_nonempty, config_batches, config_len, unequal_steps
from .mix import mix_batch, mix_rng
from .options import Options
from .recipe import Recipe
from .sources import open_source
from .stats import BadFileStats
from .types import Batch
from .validate import BadFileError


class EpochHook:
    """``loader.sampler``: what training frameworks call at each epoch start.

    Lightning's fit loop (and code written for ``DistributedSampler``) calls
    ``dataloader.sampler.set_epoch(epoch)``; this forwards it to ``loader.set_epoch``, so the
    epoch advances with no call in the user's code. It holds the loader weakly (no cycle)."""

    def __init__(self, loader: "LoaderBase"):
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
    """

    def __init__(self, config: LoaderConfig, options: Options):
        self._closed = True  # until built: __del__ of a half-built loader does nothing
        config, self.placement = resolve(config)
        self.config = config
        self.options = options
        self.data_source = from_rank0(functools.partial(  # NOTE [listing once]
            open_source, config.root, allow_empty=config.allow_empty_classes,
            extensions=config.extensions, skip_bad=config.on_bad_file is BadFilePolicy.SKIP),
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
        self.recipe = Recipe.of(config.augment, config.transform)
        self.mix = config.mix  # a MixSpec or None (pipelines.mix)
        if self.mix is not None and self.mix.num_classes not in (None, len(self.classes)):
            raise ValueError(f"mix: num_classes={self.mix.num_classes} but the dataset has "
                             f"{len(self.classes)} classes; leave num_classes=None to use them")
        self.stats = BadFileStats()
        self.last_indices: Optional[np.ndarray] = None
        self.epoch = 0
        self.sampler = EpochHook(self)  # Lightning's per-epoch set_epoch call lands here
        self._pos: Tuple[int, int] = (0, 0)  # (epoch, batches the consumer has received)
        self.last_batch_indices: Optional[np.ndarray] = None  # with debug_indices
        self._resume: Optional[Tuple[int, int]] = None  # from load_state_dict (NOTE [resume])
        self._listing_hash: Optional[str] = None
        self._closed = False

    # -- what the backend supplies ------------------------------------------------------------
    def _produce(self, epoch: int, start: int) -> Iterator[Tuple[Batch, object]]:  # pragma: no cover
        raise NotImplementedError

    def _release(self) -> None:  # pragma: no cover
        raise NotImplementedError

    def h2d_bytes_per_sample(self) -> Optional[float]:  # pragma: no cover
        """Bytes one sample moves from host to device (0 on the CPU, ``None`` if unknown)."""
        raise NotImplementedError

    # -- the plan -----------------------------------------------------------------------------
    def plan(self, epoch: int) -> List[np.ndarray]:
        """The dataset indices of each batch this rank reads in ``epoch``."""
        return self.plan_of(epoch)

    def __len__(self) -> int:
        return config_len(len(self.paths), self.config)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next ``iter()`` reads (its order and augmentation seeds)."""
        self.epoch = as_epoch(epoch)
        if self._resume is not None and self._resume[0] != self.epoch:
            self._resume = None

    # -- resume (NOTE [resume]) ---------------------------------------------------------------
    def _plan_id(self) -> Dict[str, Any]:
        c = self.config
        if self._listing_hash is None:  # paths relative to the root: a moved dataset matches
            root = str(c.root)
            base = root if os.path.isdir(root) else os.path.dirname(root)
            h = hashlib.sha256()
            for path, label in zip(self.paths, np.asarray(self.labels).tolist()):
                rel = os.path.relpath(path, base)
                h.update(f"{rel}\0{label}\n".encode("utf-8", "surrogateescape"))
            self._listing_hash = h.hexdigest()
        return {"samples": len(self.paths), "listing": self._listing_hash,
                "world_size": c.world_size, "batch_size": c.batch_size, "seed": c.seed,
                "shuffle": c.shuffle, "last_batch": c.last_batch.value}

    @property
    def position(self) -> Tuple[int, int]:
        """``(epoch, batches of it the consumer has received)``, as ``state_dict`` saves it."""
        return self._pos

    def state_dict(self) -> Dict[str, Any]:
        """Where the consumer is: the epoch, the batches of it received, and the plan's
        identity. Plain ints, bools and strings (``torch.save`` and JSON both hold it)."""
        epoch, done = self._resume if self._resume is not None else self._pos
        if self._resume is None and epoch != self.epoch:  # set_epoch since: nothing read yet
            epoch, done = self.epoch, 0
        return {"version": 1, "epoch": epoch, "batches": done, **self._plan_id()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resume at ``state``: ``epoch`` is set and the next ``iter()`` of that epoch starts
        at the first batch the saved consumer had not received.

        Raises:
            ValueError: a state of another dataset, world size, batch size, seed, shuffle or
                last-batch policy (naming the field), or one that is not a loader state.
        """
        if not isinstance(state, dict) or state.get("version") != 1:
            raise ValueError(f"load_state_dict: {type(state).__name__} is not a state from "
                             "state_dict() (version 1)")
        mine = self._plan_id()
        for k, v in mine.items():
            if state.get(k) != v:
                what = "dataset" if k in ("samples", "listing") else k
                raise ValueError(f"load_state_dict: {what} differs: the state has {k}="
                                 f"{state.get(k)!r}, this loader {v!r}; resume with the same "
                                 f"{what} or start afresh")
        epoch = as_epoch(state.get("epoch"))
        done = state.get("batches")
        if not isinstance(done, int) or isinstance(done, bool) or not 0 <= done <= len(self):
            raise ValueError(f"load_state_dict: batches={done!r} must be an int in "
                             f"[0, len()={len(self)}]")
        self.epoch = epoch
        self._resume = (epoch, done)

    # -- the epoch ----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        if self._closed:
            raise RuntimeError("this loader is closed; create a new one with create_loader()")
        check_unchanged(self.placement)
        epoch = self.epoch
        start = self._resume[1] if self._resume is not None and self._resume[0] == epoch else 0
        self._resume = None
        self._pos = (epoch, start)
        self.stats.start_epoch(epoch)
        seen: Optional[list] = [] if self.config.debug_indices else None
        c = self.config
        for batch, indices in self._produce(epoch, start):
            if self.mix is not None:  # on the device, the same for every backend
                batch = Batch(*mix_batch(batch.images, batch.labels, self.mix, len(self.classes),
                                         mix_rng(c.seed, epoch, c.rank, self._pos[1])))
            if seen is not None and indices is not None:
                seen.append(np.asarray(indices, dtype=np.int64).reshape(-1))
                self.last_batch_indices = seen[-1]
            self._pos = (epoch, self._pos[1] + 1)  # counted as handed over
            yield batch
        self.stats.end_epoch()
        if seen is not None:
            self.last_indices = np.concatenate(seen) if seen else np.empty(0, np.int64)

    def _report(self, files: Sequence[Tuple[str, str]], dropped: int = 0) -> None:
        """Raise (``error``) or count (``skip``) the bad files of the batch being handed out
        (and ``dropped`` batches that had no good sample)."""
        if not files:
            return
        if self.config.on_bad_file is BadFilePolicy.ERROR:
            raise BadFileError(*files[0])
        self.stats.add(files)
        self.stats.dropped_batches += dropped

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release the backend's workers, pipelines and memory. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
