"""The one contract every backend honours: a ``Batch`` and the ``BatchLoader`` protocol."""
from __future__ import annotations

from typing import Iterator, NamedTuple, Protocol, runtime_checkable

import torch


class Batch(NamedTuple):
    """One batch, identical in form for every backend.

    Attributes:
        images: ``N x 3 x H x W`` on the configured device, normalised, in the configured dtype
            (``channels_last`` strides when asked for).
        labels: ``int64`` tensor of length ``N`` on the same device.
    """

    images: torch.Tensor
    labels: torch.Tensor


@runtime_checkable
class BatchLoader(Protocol):
    """What ``create_loader`` returns. ``for images, labels in loader`` works for every backend."""

    def __iter__(self) -> Iterator[Batch]: ...

    def __len__(self) -> int: ...

    def set_epoch(self, epoch: int) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> "BatchLoader": ...

    def __exit__(self, *exc: object) -> None: ...
