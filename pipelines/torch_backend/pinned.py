"""``pinned``: uint8 batches in pinned memory, async H2D on side streams, normalise on the GPU."""
from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterator

import torch

from pipelines.config import LoaderConfig
from pipelines.device import resolve_device
from pipelines.options import TorchOptions
from pipelines.torch_backend.base import TorchLoaderBase, _Bad
from pipelines.torch_backend.prefetch import CudaPrefetcher
from pipelines.transforms.migrate import TransformError
from pipelines.transforms.normalize import finish_float, normalize_uint8
from pipelines.types import Batch


class PinnedLoader(TorchLoaderBase):
    """Workers return uint8 batches, pinned by DataLoader's pin thread (torch's caching host
    allocator).

    * ``streams >= 1``: :class:`CudaPrefetcher` keeps ``queue_depth`` batches in flight on
      ``streams`` high-priority side streams, normalising there.
    * ``streams == 0``: pin-memory only; ``non_blocking`` copy and normalisation on the
      consumer's stream, no prefetch (the seeds' "pin_memory only" row).
    * No CUDA or ``device="cpu"``: runs as a plain loader (normalise in the main process), with
      one warning.
    """

    def __init__(self, config: LoaderConfig, options: TorchOptions):
        device = resolve_device(config, "pinned")
        self.on_cuda = device.type == "cuda"
        super().__init__(config, options, in_workers="head", pin_memory=self.on_cuda)
        depth, streams = options.queue_depth, options.streams
        self.device = device
        r = self.transform_plan
        if r.tail is not None:  # the user's own ToDtype/Normalize tail, on the GPU
            self._finish = functools.partial(_user_tail, tail=r.tail, dtype=config.dtype.torch,
                                             channels_last=config.channels_last)
        else:
            self._finish = functools.partial(
                normalize_uint8, spec=r.spec,
                dtype=config.dtype.torch, channels_last=config.channels_last,
            )
        self._held = _HoldErrors(self._finish)  # no reference back to self: no cycle
        self._prefetcher = (
            CudaPrefetcher(self.device, streams, depth, self._held)
            if self.on_cuda and streams > 0 else None
        )

    def _batches(self, cpu_batches) -> Iterator[tuple[Batch, _Bad]]:
        if self._prefetcher is not None:
            self._held.errors.clear()
            for batch, bad in self._prefetcher(cpu_batches):
                err = self._held.errors.popleft()
                if err is not None:
                    raise err
                yield batch, bad
            return
        for images, labels, bad in cpu_batches:
            if self.on_cuda:
                images = images.to(self.device, non_blocking=True)
                labels = labels.to(self.device, non_blocking=True)
            yield Batch(self._finish(images), labels), bad


class _HoldErrors:
    """``finish`` for the prefetcher, which runs it batches ahead: a ``TransformError`` of the
    user's tail is held (one entry per batch in ``errors``) and raised when the consumer
    reaches that batch, as a bad file is."""

    def __init__(self, finish):
        self.finish = finish
        self.errors: deque = deque()

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        try:
            out, err = self.finish(images), None
        except TransformError as e:
            out, err = images.new_empty(0), e
        self.errors.append(err)
        return out


def _user_tail(images: torch.Tensor, tail, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    """The user's batchable tail (``pipelines.transforms.migrate.split_compose``) on the device batch;
    its errors are ``TransformError`` naming the step."""
    x = tail(images.as_subclass(torch.Tensor), where=f"a batch on {images.device}")
    return finish_float(x.as_subclass(torch.Tensor), dtype, channels_last)
