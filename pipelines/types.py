"""The one contract every backend honours: a ``Batch`` and the ``BatchLoader`` protocol."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch


class _Pair(NamedTuple):
    images: torch.Tensor
    labels: torch.Tensor


class Batch(_Pair):
    """One batch, identical in form for every backend: ``images, labels = batch``.

    Attributes:
        images: ``N x 3 x H x W`` on the configured device, normalised, in the configured dtype
            (``channels_last`` strides when asked for); with ``AugmentSpec(views=k)``,
            ``(N * k) x 3 x H x W``, the views of a sample adjacent.
        labels: the targets on the same device (``LoaderConfig.target``): ``int64`` class ids
            of length ``N`` by default; with ``LoaderConfig.mix``, float32 ``N x C`` soft
            targets whose rows sum to 1 (``pipelines.transforms.mix``).
        indices: the dataset index of each row, ``int64`` on the device (a padded batch repeats
            indices; a skipped bad file's row holds the sample that replaced it).
        valid: ``bool`` on the device, ``False`` for the rows that ``last_batch="pad"``
            repeats to give every rank equal steps and for the rows that stand in for a bad
            file (``on_bad_file="skip"``): each good sample is valid once per epoch over the
            ranks; mask the others out of evaluation metrics (docs/loader.md#evaluation).

    ``indices`` and ``valid`` are made on the device when first read, so a loop that never
    reads them pays nothing for them. ``batch.to(device)`` moves the batch and keeps both: it is
    what Lightning's and Accelerate's device transfer call. A ``Batch`` rebuilt from its two
    fields (``Batch(images, labels)``, ``_make``) has neither, and reading either raises
    ``AttributeError`` rather than counting every row as valid.
    """

    _idx: Any = None    # numpy int64, the rows' dataset indices
    _ok: Any = None     # numpy bool, or None: every row valid
    _device: Any = None

    def __new__(cls, images: torch.Tensor, labels: torch.Tensor, indices: Any = None,
                valid: Any = None) -> Batch:
        self = super().__new__(cls, images, labels)
        self._idx, self._ok, self._device = indices, valid, images.device
        return self

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """This batch on ``device``, ``indices`` and ``valid`` kept (the transfer hook that
        Lightning's ``move_data_to_device`` and Accelerate's ``send_to_device`` call).

        Args:
            device: where ``images`` and ``labels`` go (and ``indices``/``valid`` are made).
            non_blocking: passed to ``Tensor.to``.

        Returns:
            A new ``Batch``; its ``indices`` and ``valid`` are those of this one.
        """
        return Batch(self.images.to(device, non_blocking=non_blocking),
                     self.labels.to(device, non_blocking=non_blocking), self._idx, self._ok)

    def _made(self, what: str) -> None:
        if self._idx is None:
            raise AttributeError(
                f"this batch has no {what}: it was not made by a loader, or was rebuilt from "
                "(images, labels); move a batch with batch.to(device), which keeps them")

    @property
    def indices(self) -> torch.Tensor:
        got = self.__dict__.get("_indices_t")
        if got is None:
            self._made("indices")
            got = torch.as_tensor(np.asarray(self._idx, dtype=np.int64)).to(self._device)
            self.__dict__["_indices_t"] = got
        return got

    @property
    def valid(self) -> torch.Tensor:
        got = self.__dict__.get("_valid_t")
        if got is None:
            self._made("valid")
            n = len(self.labels)  # not images: with AugmentSpec.views, N * views rows
            ok = np.ones(n, bool) if self._ok is None else np.asarray(self._ok, bool)
            got = torch.as_tensor(ok).to(self._device)
            self.__dict__["_valid_t"] = got
        return got


@runtime_checkable
class BatchLoader(Protocol):
    """What ``create_loader`` returns: the documented contract (README, docs/loader.md), and
    nothing else. ``for images, labels in loader`` works for every backend.

    Attributes:
        classes: the class names, index = label.
        paths: the listing: dataset index ``i`` is ``paths[i]`` (remote roots redacted).
        stats: the bad files skipped (``pipelines.stats.BadFileStats``).
        epoch: the epoch being read, or read last; the next ``iter()`` reads the one after it,
            unless ``set_epoch`` or ``load_state_dict`` named one since (then that one).
        resolution: the output ``(height, width)`` of the epoch the next ``iter()`` runs.
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

    What the comparison suite reads besides this (bytes per sample over PCIe) is not part of
    the contract: ``pipelines.types.Measured``.
    """

    epoch: int

    @property
    def classes(self) -> Sequence[str]: ...

    @property
    def paths(self) -> Sequence[str]: ...

    @property
    def stats(self) -> Any: ...

    @property
    def last_indices(self) -> np.ndarray | None: ...

    @property
    def last_batch_indices(self) -> np.ndarray | None: ...

    @property
    def resolution(self) -> tuple[int, int]: ...

    def __iter__(self) -> Iterator[Batch]: ...

    def __len__(self) -> int: ...

    def set_epoch(self, epoch: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def set_resolution(self, size: int | tuple[int, int], epoch: int | None = None) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> BatchLoader: ...

    def __exit__(self, *exc: object) -> None: ...


@runtime_checkable
class Measured(Protocol):
    """The hook the comparison suite reads from a loader, outside the user's contract."""

    def h2d_bytes_per_sample(self) -> float | None:
        """Bytes one sample moves from host to device (0 on the CPU, ``None`` if unknown)."""
        ...
