"""What the two torch backends share: the DataLoader over the plan, sized to /dev/shm.

NOTE [epochs without a drain]
A DataLoader iterator normally ends with its epoch: the queue drains, and the next epoch starts
with every worker building its first batch from nothing: the training loop stalls at every epoch
start, and with short epochs, as on many ranks, that dominates (docs/results/h200x2). Here one
DataLoader iterator runs over the plan of epoch after epoch (``PlanBatchSampler``), and each
``iter()`` of the loader takes exactly ``len()`` batches from it, so the workers decode the next
epoch's first batches while the consumer finishes this one. The stream is kept only while the
consumer follows it: an ``iter()`` for another epoch than the next one, after an epoch that
was left early or failed, or of an epoch whose size was set after its first keys went out
(``pipelines.resolution`` NOTE [sizes ahead]), starts a fresh stream at that epoch (the batches
made ahead are dropped). Samples are keyed by ``(epoch, index)``, so what a batch holds and its
augmentation do not depend on when it was made.
"""
from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from pipelines.config import CpuBinding, Decoder, LoaderConfig, OutputDType
from pipelines.loader import LoaderBase
from pipelines.options import TorchOptions
from pipelines.torch_backend import affinity, shm
from pipelines.torch_backend.dataset import Bad, JpegDataset, PlanBatchSampler, collate_skipping
from pipelines.torch_backend.decode import default_decoder
from pipelines.types import Batch


@dataclass
class _Bad:
    """What travels with one batch: its bad files (and the wholly-bad batches dropped before
    it) and its dataset indices."""

    files: list[tuple[str, str]] = field(default_factory=list)
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

    on_cuda: bool  # set by each subclass before it calls __init__

    def __init__(self, config: LoaderConfig, options: TorchOptions, *, in_workers: str,
                 pin_memory: bool):
        super().__init__(config, options)
        r = self.transform_plan
        # dtype="uint8": AugmentSpec's recipe without its normalisation (the head) in the workers
        part = "head" if config.dtype is OutputDType.UINT8 and config.transform is None \
            else in_workers
        steps = r.full if part == "full" else r.head
        self.decoder = self._decoder(options, in_workers, steps)
        self.dataset = JpegDataset(self.paths, self.labels, steps, config.seed,
                                   max_pixels=config.max_image_pixels,
                                   read=None if self.data_source.by_path
                                   else self.data_source.read,
                                   decoder=self.decoder, views=r.views)
        if config.transform is None:  # set_resolution: the recipe at another size, in workers
            self.dataset.sized = functools.partial(_sized_steps, config.augment, part)
        self.plan_sampler = PlanBatchSampler(self.plan_of, len(self))
        if config.transform is None:  # set_resolution: each epoch's size goes with its keys
            self.plan_sampler.size_of = functools.partial(_key_size, self._sizes)
        self._stream: Iterator[Any] | None = None  # the DataLoader iterator over epoch after epoch (NOTE)
        self._next: int | None = None  # the epoch the stream reaches next, at its start
        self.sample_bytes = r.sample_bytes(in_workers=part) or self._measured_bytes()
        nw, prefetch = shm.fitted(cast(int, config.num_workers), options.prefetch_factor,
                                  config.batch_size * self.sample_bytes)
        self.num_workers, self.prefetch_factor = nw, prefetch
        self.worker_cores = self._worker_cores(options)  # None: as inherited
        self.epoch_stream = self._tuned(options.epoch_stream, in_workers)
        self.plan_sampler.one_epoch = not self.epoch_stream
        self.loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_sampler=self.plan_sampler,
            collate_fn=(collate_skipping if r.views == 1
                        else functools.partial(collate_skipping, views=r.views)),
            num_workers=nw,
            pin_memory=pin_memory,
            # one stream serves every epoch (NOTE); persistent workers only matter when it
            # restarts (an epoch left early, set_epoch to another epoch)
            persistent_workers=self._tuned(options.persistent_workers, in_workers) and nw > 0,
            prefetch_factor=prefetch if nw > 0 else None,
            worker_init_fn=(functools.partial(affinity.bind_worker, cores=self.worker_cores)
                            if self.worker_cores is not None and nw > 0 else None),
        )

    @staticmethod
    def _tuned(value: bool | None, in_workers: str) -> bool:
        """A ``TorchOptions`` switch, or its default: off for the baseline (``full`` recipe in
        the workers: the default recipe, untuned), on for ``pinned``."""
        return value if value is not None else in_workers != "full"

    def _decoder(self, options: TorchOptions, in_workers: str, steps) -> Decoder:
        """``TorchOptions.decoder``, or the backend's default: PIL for the baseline (``full``
        recipe in the workers); for ``pinned``, torchvision's decoder, or the scaled one for a
        dataset of photos of a megapixel or more (NOTE [the default decoder] in ``decode``)."""
        if options.decoder is not None:
            return options.decoder
        if in_workers == "full":
            return Decoder.PIL
        return Decoder(default_decoder(steps, self.data_source))

    def _worker_cores(self, options: TorchOptions):
        """The cores the workers are bound to (``TorchOptions.cpu_binding``), ``None`` for the
        inherited affinity (no binding asked, or one local rank)."""
        p = self.placement
        if options.cpu_binding is not CpuBinding.RANK or p.local_world_size <= 1:
            return None
        if not affinity.can_bind():
            raise ValueError("cpu_binding='rank' needs os.sched_setaffinity (Linux); use "
                             "cpu_binding='none'")
        if p.local_rank is None:
            raise ValueError(f"cpu_binding='rank' needs LOCAL_RANK in the environment (torchrun "
                             f"sets it) with LOCAL_WORLD_SIZE={p.local_world_size}")
        return affinity.rank_cores(p.local_rank, p.local_world_size)

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

    def h2d_bytes_per_sample(self) -> float | None:
        if not self.on_cuda:
            return 0.0
        return self.sample_bytes + 8.0  # the image and its int64 label

    def _produce(self, epoch: int, start: int):
        tail = _Bad()  # the epoch's trailing wholly-bad batches: reported after its last batch
        for batch, bad in self._batches(self._cpu_batches(self._stream_at(epoch, start), tail)):
            self._report(bad.files, bad.dropped)
            yield batch, bad.indices
        self._report(tail.files, tail.dropped)

    def _stream_at(self, epoch: int, start: int):
        """The DataLoader items of ``epoch`` from batch ``start`` on, from the running stream
        when it is there (NOTE) and its keys of ``epoch`` went out at the epoch's size
        (``pipelines.resolution`` NOTE [sizes ahead]); a restart at ``start`` > 0 never decodes
        the batches before."""
        sent = self.plan_sampler.sent
        want = _key_size(self._sizes, epoch)
        if self._stream is None or self._next != epoch or start or sent.get(epoch, want) != want:
            self._stop_stream()
            self.plan_sampler.start, self.plan_sampler.skip = epoch, start
            self._stream = iter(self.loader)
        self._next = None  # until this epoch has been taken whole
        stream = self._stream
        for _ in range(len(self) - start):
            try:
                item = next(stream)
            except BaseException:
                self._stop_stream()
                raise
            yield item
        if not self.epoch_stream:  # a plain DataLoader: the epoch's iterator ends with it
            self._stop_stream()
            return
        self._next = epoch + 1

    def _stop_stream(self) -> None:
        """Drop the stream: persistent workers are kept (the next ``iter(self.loader)`` resets
        them and discards what they made ahead), others are shut down."""
        it, self._stream, self._next = self._stream, None, None
        if it is None or self.loader.persistent_workers:
            return
        if hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self.loader._iterator = None

    def _cpu_batches(self, items, tail: _Bad):
        """``(images, labels, _Bad)`` per batch; a batch with no good sample is not yielded, its
        bad files ride with the next batch, or, after the last, are left in ``tail`` for the
        consumer's side to report once it has taken every batch (a prefetcher drains this
        generator batches ahead of the consumer: reported here, they would count as positions
        before the batches still in flight)."""
        carry = _Bad()
        for images, labels, idx, bad in items:
            carry.files += bad
            if images is None:
                carry.dropped += 1
                continue
            carry.indices = idx  # numpy (collate_skipping)
            yield images, labels, carry
            carry = _Bad()
        tail.files, tail.dropped = carry.files, carry.dropped

    def _batches(self, cpu_batches) -> Iterator[tuple[Batch, _Bad]]:  # pragma: no cover - abstract
        """``(Batch, _Bad)`` for each ``(images, labels, _Bad)`` of ``cpu_batches``."""
        raise NotImplementedError

    def _release(self) -> None:
        """Shut the worker processes down."""
        self._stop_stream()
        it = getattr(self.loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self.loader._iterator = None


def _key_size(sizes, epoch: int) -> tuple[int, int] | None:
    """The size the keys of ``epoch`` carry: ``None`` for the config's own
    (``pipelines.resolution.Resolutions``)."""
    hw = sizes.at(epoch).hw
    return None if hw == sizes.own.hw else hw


def _sized_steps(spec, in_workers: str, hw: tuple[int, int]):
    """The workers' part of the ``AugmentSpec`` recipe at output size ``hw``."""
    from pipelines.transforms.plan import TransformPlan

    r = TransformPlan.of(spec.at_size(hw))
    return r.full if in_workers == "full" else r.head
