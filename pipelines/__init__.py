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
from .augment import AugmentSpec
from .config import BadFilePolicy, LastBatchPolicy, LoaderConfig
from .factory import Backend, available_backends, create_loader, dali_available
from .listing import DatasetRootError
from .migrate import InvalidTransformError, TransformError, UnsupportedTransformError, from_torchvision
from .mix import MixSpec
from .options import DaliOptions, TorchOptions
from .types import Batch, BatchLoader
from .validate import BadFileError

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
