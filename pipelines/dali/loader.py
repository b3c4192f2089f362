"""``DaliLoader``: the DALI graph behind the common ``BatchLoader`` contract.

DALI specifics (``DALIGenericIterator``'s ``List[Dict]``, its last-batch handling) stay here; the
caller only sees ``Batch``. The last-batch policy is applied by the shared plan (full batches,
a short last batch under PARTIAL, wrapped padding under PAD), so DALI itself always runs with
``LastBatchPolicy.PARTIAL`` and stops when the source raises ``StopIteration``. With
``dali_pipelines = n`` there are n pipelines and n iterators, fed by the source's lanes (every
n-th batch each) and read round-robin, which yields the plan's order.
"""
from __future__ import annotations

import gc
import warnings
from typing import Iterator, List, Optional

import numpy as np
import torch
from nvidia.dali.plugin.base_iterator import LastBatchPolicy as DaliPolicy
from nvidia.dali.plugin.pytorch import DALIGenericIterator

from ..config import BadFilePolicy, LoaderConfig, OutputDType
from ..indexing import config_batches, config_len, list_samples
from ..stats import BadFileStats
from ..types import Batch
from .graph import OUTPUTS, build_pipeline
from .source import PlanSource


class DaliLoader:
    """Decode and augment with DALI (GPU when the config's device is CUDA, CPU operators otherwise)."""

    def __init__(self, config: LoaderConfig):
        self.config = config
        self.paths, self.labels, self.classes = list_samples(config.root)
        self.gpu = config.wants_cuda and torch.cuda.is_available()
        if config.wants_cuda and not self.gpu:
            warnings.warn("backend='dali': CUDA is not available, running DALI's CPU operators",
                          RuntimeWarning, stacklevel=3)
        self.device = config.torch_device if self.gpu else torch.device("cpu")
        device_id = (self.device.index if self.device.index is not None
                     else torch.cuda.current_device()) if self.gpu else None
        n = config.dali_pipelines
        self.source = PlanSource(self.paths, self.labels, self._plan,
                                 readahead=config.prefetch + 1,
                                 threads=min(8, max(2, config.num_workers // 2)),
                                 keep_alive=config.prefetch + 2,
                                 skip=config.on_bad_file is BadFilePolicy.SKIP,
                                 max_pixels=config.max_image_pixels, lanes=n)
        self.stats = BadFileStats()
        self.pipes = [build_pipeline(config, self.source.lane(k), device_id, lane=k)
                      for k in range(n)]
        self._its: Optional[List[DALIGenericIterator]] = None
        self._epoch = 0
        self._in_epoch = False
        self._closed = False
        self.last_indices: Optional[np.ndarray] = None

    def _plan(self, epoch: int):
        return config_batches(len(self.paths), self.config, epoch)

    # -- contract -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return config_len(len(self.paths), self.config)

    def set_epoch(self, epoch: int) -> None:
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch={epoch!r} must be an int >= 0")
        self._epoch = epoch

    def _start(self) -> List[DALIGenericIterator]:
        if self._its is None:
            self.source.start_epoch(self._epoch)
            self._its = [DALIGenericIterator(
                p, list(OUTPUTS), size=-1, auto_reset=False,
                last_batch_policy=DaliPolicy.PARTIAL, prepare_first_batch=False,
            ) for p in self.pipes]
        else:
            if self._in_epoch:  # the caller broke out early: finish the old epoch first
                for it in self._its:
                    for _ in it:
                        pass
            self.source.start_epoch(self._epoch)
            for it in self._its:
                it.reset()
        return self._its

    @staticmethod
    def _round_robin(its: List[DALIGenericIterator]):
        """Batches from the pipelines in turn: lane k holds the plan's batches k, k + n, ...
        (``PlanSource`` NOTE [lanes]), so taking one from each in turn restores the plan's order;
        a lane that runs out first simply drops out."""
        live = list(its)
        while live:
            for it in list(live):
                try:
                    yield next(it)
                except StopIteration:
                    live.remove(it)

    def __iter__(self) -> Iterator[Batch]:
        if self._closed:
            raise RuntimeError("this loader is closed; create a new one with create_loader()")
        its = self._start()
        self._in_epoch = True
        self.stats.start_epoch(self._epoch)
        dropped0 = self.source.dropped_batches
        want_idx = self.config.debug_indices
        seen = []
        cast = self.config.dtype is OutputDType.BFLOAT16
        for out in self._round_robin(its):
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
        self.stats.add(self.source.bad_by_epoch.pop(self._epoch, []))
        self.stats.dropped_batches += self.source.dropped_batches - dropped0
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
        gc.collect()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
