"""The one contract every backend honours: a ``Batch`` and the ``BatchLoader`` protocol."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch


class Batch(NamedTuple):
    """One batch, identical in form for every backend.

    Attributes:
        images: ``N x 3 x H x W`` on the configured device, normalised, in the configured dtype
            (``channels_last`` strides when asked for).
        labels: ``int64`` tensor of length ``N`` on the same device; with
            ``LoaderConfig.mix``, float32 ``N x C`` soft targets whose rows sum to 1
            (``pipelines.mix``).
    """

    images: torch.Tensor
    labels: torch.Tensor


@runtime_checkable
class BatchLoader(Protocol):
    """What ``create_loader`` returns. ``for images, labels in loader`` works for every backend.

    Attributes:
        classes: the class names, index = label.
        stats: the bad files skipped (``pipelines.stats.BadFileStats``).
        last_indices: the dataset index of every sample of the last full epoch, when
            ``LoaderConfig.debug_indices`` is set (else ``None``): an int64 numpy array, the
            epoch's batches concatenated in the order they were yielded.
        last_batch_indices: the dataset index of each sample of the batch yielded last, when
            ``LoaderConfig.debug_indices`` is set (else ``None``): an int64 numpy array of
            ``len(batch)``, row ``i`` being ``batch.images[i]``'s sample (an index into the
            listing, the order of ``classes`` and the sorted files; a padded last batch repeats
            indices, a skipped bad file's row holds the sample that replaced it). Read it right
            after each batch: the next batch replaces it.

    Example (which files were in a batch)::

        loader = create_loader("pinned", LoaderConfig(root, debug_indices=True))
        for images, labels in loader:
            files = [loader.paths[i] for i in loader.last_batch_indices]
    """

    classes: list[str]
    stats: Any
    last_indices: Any | None
    last_batch_indices: Any | None

    def __iter__(self) -> Iterator[Batch]: ...

    def __len__(self) -> int: ...

    def set_epoch(self, epoch: int) -> None: ...

    def close(self) -> None: ...

    def h2d_bytes_per_sample(self) -> float | None: ...

    def __enter__(self) -> BatchLoader: ...

    def __exit__(self, *exc: object) -> None: ...
