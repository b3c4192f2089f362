"""Interchangeable GPU-feeding image loaders for PyTorch.

Example:
    >>> from pipelines import DaliOptions, LoaderConfig, create_loader
    >>> cfg = LoaderConfig(root="data/train", batch_size=256, dtype="bfloat16", channels_last=True)
    >>> with create_loader("dali", cfg, options=DaliOptions(queue_depth=3)) as loader:
    ...     for epoch in range(90):
    ...         loader.set_epoch(epoch)
    ...         for images, labels in loader:
    ...             ...
"""
from .augment import AugmentSpec, Mode
from .config import (BadFilePolicy, CpuBinding, Decoder, DecodeOn, LastBatchPolicy, LoaderConfig,
                     OutputDType, default_workers, usable_cores)
from .device import HW_JPEG_DECODERS
from .distributed import Placement, local_world_size, placement
from .factory import (Backend, available_backends, create_loader, dali_available, options_for,
                      preload)
from .indexing import (DatasetRootError, check_nonempty, epoch_batches, list_samples, num_batches,
                       sample_seed)
from .loader import LoaderBase
from .migrate import (InvalidTransformError, TransformError, UnsupportedTransformError,
                      check_transform, from_torchvision)
from .mix import MixSpec
from .options import DaliOptions, Options, TorchOptions
from .recipe import Recipe
from .shards import ShardError, shard_paths
from .sources import Source, SourceKind, list_dataset, open_source, source_kind
from .torch_backend.decode import jpeg_library, reduced_decode, scaled_crop
from .torch_backend.shm import HEADROOM as SHM_HEADROOM
from .torch_backend.shm import fit_to_shm, shm_free_bytes, shm_need
from .types import Batch, BatchLoader
from .validate import BadFileError, check_image_bytes

__all__ = [
    "AugmentSpec", "Mode", "BadFilePolicy", "BadFileError", "LastBatchPolicy", "LoaderConfig",
    "OutputDType", "CpuBinding", "Decoder", "DecodeOn", "scaled_crop", "jpeg_library", "reduced_decode",
    "Backend",
    "DaliOptions", "Options", "TorchOptions", "LoaderBase",
    "Recipe", "available_backends", "create_loader", "dali_available", "options_for", "preload",
    "DatasetRootError", "check_nonempty", "epoch_batches", "list_samples", "num_batches",
    "sample_seed",
    "Batch", "BatchLoader", "InvalidTransformError", "TransformError",
    "UnsupportedTransformError", "check_transform", "from_torchvision", "check_image_bytes",
    "default_workers", "usable_cores", "SHM_HEADROOM", "fit_to_shm", "shm_free_bytes",
    "shm_need", "Placement", "placement", "local_world_size", "list_dataset", "Source",
    "SourceKind", "open_source", "source_kind", "ShardError", "shard_paths",
    "MixSpec", "HW_JPEG_DECODERS",
]


def __getattr__(name: str):
    # decode_rgb needs torchvision.io: imported on first use, so the DALI path does not pay it
    if name == "decode_rgb":
        from .torch_backend.dataset import decode_rgb

        return decode_rgb
    raise AttributeError(f"module 'pipelines' has no attribute {name!r}")
