"""``pageable``: the default recipe, kept faithful as the baseline.

Workers decode, augment and normalise to float32 on the CPU; batches arrive in pageable memory
and are copied to the device with a blocking ``.to(device)``. Nothing here is optimised, on
purpose: it is what everything else is compared against.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch

from pipelines.config import LoaderConfig
from pipelines.device import resolve_device
from pipelines.options import TorchOptions
from pipelines.torch_backend.base import TorchLoaderBase, _Bad
from pipelines.transforms.normalize import finish_float
from pipelines.types import Batch


class PageableLoader(TorchLoaderBase):
    def __init__(self, config: LoaderConfig, options: TorchOptions):
        self.device = resolve_device(config, "pageable")
        self.on_cuda = self.device.type == "cuda"
        super().__init__(config, options.for_backend("pageable"), in_workers="full",
                         pin_memory=False)
        self.dtype = config.dtype.torch

    def _batches(self, cpu_batches) -> Iterator[tuple[Batch, _Bad]]:
        for images, labels, bad in cpu_batches:
            images = images.as_subclass(torch.Tensor).to(self.device)  # blocking, from pageable memory
            labels = labels.to(self.device)
            yield Batch(finish_float(images, self.dtype, self.config.channels_last), labels), bad
