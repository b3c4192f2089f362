"""What the two torch backends share: the DataLoader over the plan, sized to /dev/shm."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, List, Optional, Tuple

import torch

from ..config import LoaderConfig
from ..loader import LoaderBase
from ..options import TorchOptions
from . import shm
from .dataset import Bad, JpegDataset, PlanBatchSampler, collate_skipping


@dataclass
class _Bad:
    """What travels with one batch: its bad files (and the wholly-bad batches dropped before
    it) and its dataset indices."""

    files: List[Tuple[str, str]] = field(default_factory=list)
    dropped: int = 0
    indices: Any = None


class TorchLoaderBase(LoaderBase):
    """A DataLoader over the shared epoch plan. Subclasses turn its CPU batches into ``Batch``.

    Args:
        config: the ``LoaderConfig``.
        options: the ``TorchOptions``.
        in_workers: ``"full"`` runs the whole recipe in the workers, normalised float32
            included (pageable recipe); ``"head"`` keeps uint8 and normalises later.
        pin_memory: let DataLoader's pin thread copy batches into pinned memory.
    """

    def __init__(self, config: LoaderConfig, options: TorchOptions, *, in_workers: str,
                 pin_memory: bool):
        super().__init__(config, options)
        r = self.recipe
        self.dataset = JpegDataset(self.paths, self.labels, r.full if in_workers == "full"
                                   else r.head, config.seed, max_pixels=config.max_image_pixels)
        self.sampler = PlanBatchSampler(self.plan_of, len(self))
        self.sample_bytes = r.sample_bytes(in_workers=in_workers) or self._measured_bytes()
        nw, prefetch = shm.fitted(config.num_workers, options.prefetch_factor,
                                  config.batch_size * self.sample_bytes)
        self.num_workers, self.prefetch_factor = nw, prefetch
        self.loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_sampler=self.sampler,
            collate_fn=collate_skipping,
            num_workers=nw,
            pin_memory=pin_memory,
            persistent_workers=options.persistent_workers and nw > 0,
            prefetch_factor=prefetch if nw > 0 else None,
        )

    def _measured_bytes(self, probes: int = 3) -> int:
        """Bytes of one worker output, measured on the first good samples, when the recipe
        cannot tell (an output size that depends on the image); 1 when none decodes."""
        sizes = []
        for i in range(min(len(self.dataset), 4 * probes)):
            item = self.dataset[(0, i)]
            if not isinstance(item, Bad) and isinstance(item[0], torch.Tensor):
                sizes.append(item[0].numel() * item[0].element_size())
                if len(sizes) == probes:
                    break
        return max(sizes) if sizes else 1

    def h2d_bytes_per_sample(self) -> Optional[float]:
        if not self.on_cuda:
            return 0.0
        return self.sample_bytes + 8.0  # the image and its int64 label

    def _produce(self, epoch: int):
        self.sampler.epoch = epoch
        for batch, bad in self._batches(self._cpu_batches()):
            self._report(bad.files, bad.dropped)
            yield batch, bad.indices

    def _cpu_batches(self):
        """``(images, labels, _Bad)`` per batch; a batch with no good sample is not yielded, its
        bad files ride with the next batch (or come last, with no batch)."""
        carry = _Bad()
        for images, labels, idx, bad in self.loader:
            carry.files += bad
            if images is None:
                carry.dropped += 1
                continue
            carry.indices = idx.numpy()
            yield images, labels, carry
            carry = _Bad()
        if carry.files:
            self._report(carry.files, carry.dropped)

    def _batches(self, cpu_batches) -> Iterator:  # pragma: no cover - abstract
        """``(Batch, _Bad)`` for each ``(images, labels, _Bad)`` of ``cpu_batches``."""
        raise NotImplementedError

    def _release(self) -> None:
        """Shut the worker processes down."""
        it = getattr(self.loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self.loader._iterator = None
