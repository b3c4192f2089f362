"""Interchangeable GPU-feeding image loaders for PyTorch.

The package root holds what a training loop needs: ``create_loader``, its config and options,
the batch and loader types, and the errors a user may catch. Everything else is imported from
its module (for example ``from pipelines.torch_backend.shm import fit_to_shm``).

Example:
    >>> from pipelines import DaliOptions, LoaderConfig, create_loader
    >>> cfg = LoaderConfig(root="data/train", batch_size=256, dtype="bfloat16", channels_last=True)
    >>> with create_loader("dali", cfg, options=DaliOptions(queue_depth=3)) as loader:
    ...     for epoch in range(90):
    ...         loader.set_epoch(epoch)
    ...         for images, labels in loader:
    ...             ...
"""
from pipelines.config import BadFilePolicy, LastBatchPolicy, LoaderConfig
from pipelines.factory import Backend, available_backends, create_loader, dali_available
from pipelines.options import DaliOptions, TorchOptions
from pipelines.sources.folder import DatasetRootError
from pipelines.sources.validate import BadFileError
from pipelines.transforms.migrate import (
    InvalidTransformError,
    TransformError,
    UnsupportedTransformError,
    from_torchvision,
)
from pipelines.transforms.mix import MixSpec
from pipelines.transforms.spec import AugmentSpec
from pipelines.types import Batch, BatchLoader

__all__ = [
    "AugmentSpec",
    "Backend",
    "BadFileError",
    "BadFilePolicy",
    "Batch",
    "BatchLoader",
    "DaliOptions",
    "DatasetRootError",
    "InvalidTransformError",
    "LastBatchPolicy",
    "LoaderConfig",
    "MixSpec",
    "TorchOptions",
    "TransformError",
    "UnsupportedTransformError",
    "available_backends",
    "create_loader",
    "dali_available",
    "from_torchvision",
]
