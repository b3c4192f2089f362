"""``DaliLoader``: the DALI graph behind the common ``BatchLoader`` contract.

DALI specifics (``DALIGenericIterator``'s ``List[Dict]``, its last-batch handling) stay here; the
caller only sees ``Batch``. The last-batch policy is applied by the shared plan (full batches,
a short last batch under PARTIAL, wrapped padding under PAD), so DALI itself always runs with
``LastBatchPolicy.PARTIAL`` and stops when the source raises ``StopIteration``. With
``dali_pipelines = n`` there are n pipelines and n iterators, fed by the source's lanes (every
n-th batch each) and read round-robin, which yields the plan's order.

NOTE [recovery]
A file can pass the byte check and still fail in DALI's decoder (or vanish after it was
checked). DALI then raises from ``next()`` with a message that names neither the file nor the
batch, and the pipeline that raised cannot be trusted again. The loader then:

1. takes the files of every batch that was fed but not yet yielded (``PlanSource.in_flight``):
   the failing file is among them;
2. decodes them again with a ``DecodeProbe`` (same device and decoder, groups halved around each
   failure) and records each failing file as bad in the source (``PlanSource.mark_bad``);
3. rebuilds the pipelines and restarts each lane at its first position not yet yielded.

The bad file is then handled like any other: replaced and counted under ``skip``, one
``BadFileError`` naming it at its batch under ``error``. If no single file fails alone, the
original DALI error is re-raised. Recovery re-seeds DALI's augmentation, so the random crops of
the rest of that epoch differ from an uninterrupted run; the order and the samples do not.
An epoch that ends early (``break``, an exception) leaves the pipelines with at most
``prefetch`` batches in flight; the next ``iter()`` stops the source and drains only those
(or rebuilds, after a failure), so it always starts clean.
"""
from __future__ import annotations

import gc
from typing import Iterator, List, Optional

import numpy as np
import torch
from nvidia.dali.plugin.base_iterator import LastBatchPolicy as DaliPolicy
from nvidia.dali.plugin.pytorch import DALIGenericIterator

from ..config import BadFilePolicy, LoaderConfig, OutputDType
from ..device import resolve_device
from ..indexing import as_epoch, check_nonempty, config_batches, config_len, list_samples
from ..stats import BadFileStats
from ..types import Batch
from ..validate import BadFileError
from .graph import OUTPUTS, build_pipeline
from .probe import DecodeProbe
from .source import PlanSource


class DaliLoader:
    """Decode and augment with DALI (GPU when the config's device is CUDA, CPU operators otherwise)."""

    def __init__(self, config: LoaderConfig):
        self.config = config
        self.paths, self.labels, self.classes = list_samples(
            config.root, allow_empty=config.allow_empty_classes)
        check_nonempty(len(self.paths), config)
        self.device = resolve_device(config, "dali")
        self.gpu = self.device.type == "cuda"
        self.device_id = (self.device.index if self.device.index is not None
                          else torch.cuda.current_device()) if self.gpu else None
        n = config.dali_pipelines
        self.source = PlanSource(self.paths, self.labels, self._plan,
                                 readahead=config.prefetch + 1,
                                 threads=min(8, max(2, config.num_workers // 2)),
                                 keep_alive=config.prefetch + 2,
                                 max_pixels=config.max_image_pixels, lanes=n)
        self.stats = BadFileStats()
        self.pipes: list = []
        self._its: Optional[List[DALIGenericIterator]] = None
        self._build()
        self._probe: Optional[DecodeProbe] = None
        self._epoch = 0
        self._in_epoch = False
        self._broken = False
        self._closed = False
        self.recoveries = 0
        self.last_indices: Optional[np.ndarray] = None

    def _plan(self, epoch: int):
        return config_batches(len(self.paths), self.config, epoch)

    def _build(self) -> None:
        self.pipes = [build_pipeline(self.config, self.source.lane(k), self.device_id, lane=k)
                      for k in range(self.config.dali_pipelines)]
        self._its = None

    def _iterators(self) -> List[DALIGenericIterator]:
        return [DALIGenericIterator(p, list(OUTPUTS), size=-1, auto_reset=False,
                                    last_batch_policy=DaliPolicy.PARTIAL,
                                    prepare_first_batch=False) for p in self.pipes]

    # -- contract -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return config_len(len(self.paths), self.config)

    def set_epoch(self, epoch: int) -> None:
        self._epoch = as_epoch(epoch)

    def _start(self) -> None:
        """Make the pipelines ready for a new epoch (module NOTE [recovery])."""
        if self._broken:
            self._rebuild()
        elif self._its is not None and self._in_epoch:  # the last epoch ended early
            self.source.stop()
            try:
                for it in self._its:
                    for _ in it:
                        pass
            except Exception:  # a failure in a batch nobody will see: start from scratch
                self._rebuild()
        self._in_epoch = False
        self.source.start_epoch(self._epoch)
        if self._its is None:
            self._its = self._iterators()
        else:
            for it in self._its:
                it.reset()

    def _rebuild(self) -> None:
        self._its = None
        self.pipes = []
        gc.collect()
        self._build()
        self._broken = False

    def _recover(self, err: Exception) -> None:
        """Find the file behind a DALI failure, record it, restart the lanes (NOTE [recovery])."""
        self._broken = True
        items = {}
        for k in range(self.config.dali_pipelines):
            for fed in self.source.in_flight(k):
                for i in fed.rows.tolist():
                    items.setdefault(i, self.paths[i])
        if self._probe is None:
            kw = {"hw_decoder_load": self.config.dali_hw_decoder_load} if self.gpu else {}
            self._probe = DecodeProbe(self.config.batch_size, self.device_id, kw)
        found = self._probe.failing(sorted(items.items()), on_bad=self.source.mark_bad)
        if not found:
            raise RuntimeError(
                f"DALI failed in epoch {self._epoch} and no file of the {len(items)} in flight "
                f"fails to decode alone; DALI said: {err}") from err
        resume = self.source.resume_positions()
        self._rebuild()
        self.recoveries += 1
        self.source.start_epoch(self._epoch, resume=resume)
        self._its = self._iterators()

    def _account(self, k: int) -> None:
        """Count (``skip``) or raise (``error``) the bad files of lane ``k``'s next batch."""
        fed = self.source.take(k)
        if fed is None or not fed.bad:
            return
        if self.config.on_bad_file is BadFilePolicy.ERROR:
            raise BadFileError(*fed.bad[0])
        self.stats.add(fed.bad)
        self.stats.dropped_batches += fed.dropped

    def __iter__(self) -> Iterator[Batch]:
        if self._closed:
            raise RuntimeError("this loader is closed; create a new one with create_loader()")
        self._start()
        self._in_epoch = True
        self.stats.start_epoch(self._epoch)
        want_idx = self.config.debug_indices
        seen = []
        cast = self.config.dtype is OutputDType.BFLOAT16
        n = len(self._its)
        live = [True] * n
        turn = 0
        while any(live):
            k = turn % n
            if not live[k]:
                turn += 1
                continue
            try:
                out = next(self._its[k])
            except StopIteration:
                live[k] = False
                while self.source.in_flight(k):  # trailing wholly-bad batches
                    self._account(k)
                continue
            except Exception as e:  # a DALI failure: find the file, rebuild, retry this lane
                self._recover(e)
                continue
            turn += 1
            self._account(k)
            d = out[0]
            x, y = d["images"], d["labels"].view(-1)
            if self.config.channels_last:
                x = x.permute(0, 3, 1, 2)  # NHWC memory == NCHW with channels_last strides
            if cast:
                x = x.to(torch.bfloat16, memory_format=torch.preserve_format)
            if want_idx:
                seen.append(d["indices"].view(-1).cpu().numpy())
            yield Batch(x, y)
        self._in_epoch = False
        self.stats.end_epoch()
        if want_idx:
            self.last_indices = np.concatenate(seen) if seen else np.empty(0, np.int64)

    def close(self) -> None:
        """Release the pipeline, its threads and its GPU memory. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._its = None
        self.source.close()
        self.pipes = []
        self._probe = None
        gc.collect()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
