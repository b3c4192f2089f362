"""What the two torch backends share: the listing, the DataLoader, the lifecycle."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Tuple

import numpy as np
import torch

from ..config import BadFilePolicy, LoaderConfig
from ..indexing import as_epoch, check_nonempty, list_samples
from ..stats import BadFileStats
from ..types import Batch
from ..validate import BadFileError
from . import shm
from .dataset import Bad, JpegDataset, PlanBatchSampler, collate_skipping


@dataclass
class _Bad:
    """The bad files that travel with one batch (and the wholly-bad batches dropped before it)."""

    files: List[Tuple[str, str]] = field(default_factory=list)
    dropped: int = 0


class TorchLoaderBase:
    """A DataLoader over the shared epoch plan. Subclasses turn its CPU batches into ``Batch``.

    Args:
        config: the ``LoaderConfig``.
        normalize_in_workers: ``True`` runs float32 ``Normalize`` in the workers (pageable
            recipe); ``False`` keeps uint8 and normalises later.
        pin_memory: let DataLoader's pin thread copy batches into pinned memory.
    """

    def __init__(self, config: LoaderConfig, *, normalize_in_workers: bool, pin_memory: bool):
        self.config = config
        paths, labels, self.classes = list_samples(config.root,
                                                   allow_empty=config.allow_empty_classes)
        check_nonempty(len(paths), config)
        if config.transform is not None:
            from ..migrate import split_compose

            uint8_part, self.float_part = split_compose(config.transform)
            transform = config.transform if normalize_in_workers else uint8_part
        else:
            self.float_part = None
            transform = config.augment.to_torchvision(normalize=normalize_in_workers)
        self.dataset = JpegDataset(paths, labels, transform, config.seed,
                                   max_pixels=config.max_image_pixels)
        self.stats = BadFileStats()
        self.sampler = PlanBatchSampler(len(paths), config)
        batch_bytes = config.batch_size * self._sample_bytes(
            3 * config.augment.size ** 2 * (4 if normalize_in_workers else 1))
        nw, prefetch = shm.fitted(config.num_workers, config.prefetch, batch_bytes)
        self.num_workers, self.prefetch_factor = nw, prefetch
        self.loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_sampler=self.sampler,
            collate_fn=collate_skipping,
            num_workers=nw,
            pin_memory=pin_memory,
            persistent_workers=config.persistent_workers and nw > 0,
            prefetch_factor=prefetch if nw > 0 else None,
        )
        self.last_indices: Optional[np.ndarray] = None
        self._indices: list = []
        self._closed = False

    def _sample_bytes(self, fallback: int, probes: int = 3) -> int:
        """Bytes of one worker output, measured on the first good samples (the user's transform
        decides the size and dtype); ``fallback`` when none of the first files decodes."""
        sizes = []
        for i in range(min(len(self.dataset), 4 * probes)):
            item = self.dataset[(0, i)]
            if not isinstance(item, Bad) and isinstance(item[0], torch.Tensor):
                sizes.append(item[0].numel() * item[0].element_size())
                if len(sizes) == probes:
                    break
        return max(sizes) if sizes else fallback

    # -- contract -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.epoch = as_epoch(epoch)

    def __iter__(self) -> Iterator[Batch]:
        if self._closed:
            raise RuntimeError("this loader is closed; create a new one with create_loader()")
        self._indices = []
        self.stats.start_epoch(self.sampler.epoch)
        for batch, bad in self._batches(self._cpu_batches()):
            self._report(bad)
            yield batch
        self.stats.end_epoch()
        if self.config.debug_indices:
            self.last_indices = (np.concatenate(self._indices) if self._indices
                                 else np.empty(0, np.int64))

    def _report(self, bad) -> None:
        """Raise (``error``) or count (``skip``) the bad files of the batch being handed out.

        Bad files travel with their batch (``bad`` is a ``_Bad`` record), so they are reported
        when the consumer reaches that batch, also when the batches are prefetched ahead."""
        if not bad.files:
            return
        if self.config.on_bad_file is BadFilePolicy.ERROR:
            raise BadFileError(*bad.files[0])
        self.stats.add(bad.files)
        self.stats.dropped_batches += bad.dropped

    def _cpu_batches(self):
        """``(images, labels, _Bad)`` per batch; a batch with no good sample is not yielded, its
        bad files ride with the next batch (or come last, with no batch)."""
        carry = _Bad()
        for images, labels, idx, bad in self.loader:
            carry.files += bad
            if images is None:
                carry.dropped += 1
                continue
            if self.config.debug_indices:
                self._indices.append(idx.numpy())
            yield images, labels, carry
            carry = _Bad()
        if carry.files:
            self._report(carry)

    def _batches(self, cpu_batches) -> Iterator:  # pragma: no cover - abstract
        """``(Batch, _Bad)`` for each ``(images, labels, _Bad)`` of ``cpu_batches``."""
        raise NotImplementedError

    def close(self) -> None:
        """Shut the worker processes down. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        it = getattr(self.loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self.loader._iterator = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
