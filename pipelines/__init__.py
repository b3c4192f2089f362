"""Interchangeable GPU-feeding image loaders for PyTorch.

Example:
    >>> from pipelines import AugmentSpec, LoaderConfig, create_loader
    >>> cfg = LoaderConfig(root="data/train", batch_size=256, dtype="bfloat16", channels_last=True)
    >>> with create_loader("dali", cfg) as loader:            # or "pinned", "pageable"
    ...     for epoch in range(90):
    ...         loader.set_epoch(epoch)
    ...         for images, labels in loader:
    ...             ...
"""
from .augment import AugmentSpec, Mode
from .config import BadFilePolicy, LastBatchPolicy, LoaderConfig, OutputDType, PinMode
from .factory import Backend, available_backends, create_loader, dali_available
from .indexing import DatasetRootError, epoch_batches, list_samples, num_batches
from .migrate import InvalidTransformError, TransformError, UnsupportedTransformError
from .types import Batch, BatchLoader
from .validate import BadFileError

__all__ = [
    "AugmentSpec", "Mode", "BadFilePolicy", "BadFileError", "LastBatchPolicy", "LoaderConfig",
    "OutputDType", "PinMode", "Backend",
    "available_backends", "create_loader", "dali_available", "DatasetRootError", "epoch_batches",
    "list_samples", "num_batches", "Batch", "BatchLoader", "InvalidTransformError",
    "TransformError", "UnsupportedTransformError",
]
