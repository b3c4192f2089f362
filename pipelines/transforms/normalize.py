"""uint8 -> normalised float on whichever device the batch is on (the torch backends' last step);
with ``LoaderConfig.dtype="uint8"`` the uint8 batch stays as it is, only its layout set."""
from __future__ import annotations

import torch
from torchvision.transforms.v2 import functional as F

from pipelines.transforms.spec import AugmentSpec


def normalize_uint8(
    images: torch.Tensor, spec: AugmentSpec, dtype: torch.dtype, channels_last: bool
) -> torch.Tensor:
    """Normalise a ``uint8`` ``N x 3 x H x W`` batch; ``dtype=torch.uint8`` keeps its pixels
    (``OutputDType.UINT8``: the model normalises) and only sets the memory format.

    Uses the same torchvision ops as the CPU recipe (``to_dtype(scale=True)`` then ``normalize``)
    so a batch normalised on the GPU equals, bit for bit, one normalised in the workers.
    """
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    if dtype == torch.uint8:
        return images.contiguous() if not channels_last else images
    x = F.to_dtype(images, torch.float32, scale=True)
    x = F.normalize(x, mean=list(spec.mean), std=list(spec.std), inplace=True)
    return x if dtype == torch.float32 else x.to(dtype)


def finish_float(images: torch.Tensor, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    """Cast a transformed batch to the output dtype and memory format.

    A float batch (normalised by the transform) is cast as it is. An integer batch (a user
    Compose with no float conversion) gives its values as floats, uint8 0..255 -> 0.0..255.0,
    as the DALI translation does. With ``dtype=torch.uint8`` only an integer batch comes here
    (``LoaderConfig`` refuses a transform that ends in a float dtype), so the cast is exact.
    """
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    if images.dtype == dtype and images.is_contiguous(memory_format=fmt):
        return images
    return images.to(dtype=dtype, memory_format=fmt)
