"""``LoaderConfig``: one frozen, validated description of a loader, shared by every backend."""
from __future__ import annotations

import enum
import operator
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from .augment import AugmentSpec
from .validate import DEFAULT_MAX_PIXELS


class LastBatchPolicy(str, enum.Enum):
    """What happens to the final, incomplete batch of an epoch (per shard).

    Worked example: samples ``[1..7]``, ``batch_size=3``:

    * ``DROP``    → batches ``[1,2,3] [4,5,6]``; sample 7 is not seen this epoch. ``len == 2``.
    * ``PARTIAL`` → batches ``[1,2,3] [4,5,6] [7]``; the last batch is short. ``len == 3``.
    * ``PAD``     → batches ``[1,2,3] [4,5,6] [7,1,2]``; the last batch is filled by wrapping
      around to the start of this epoch's order, so every batch is full. ``len == 3``.
    """

    DROP = "drop"
    PARTIAL = "partial"
    PAD = "pad"


class BadFilePolicy(str, enum.Enum):
    """What a loader does with a file that is not a decodable image (see ``pipelines.validate``).

    * ``ERROR``: raise one ``BadFileError`` in the main process naming the file and the reason.
    * ``SKIP``: replace the sample by the next good sample of the same batch, so batch sizes
      follow the ``LastBatchPolicy``; count it in ``loader.stats`` and warn once per epoch with
      the names. Example: batch ``[a, BAD, c]`` -> ``[a, c, c]`` and ``stats["bad_files"] == 1``.
      A batch with no good sample at all is dropped (and its files counted).
    """

    ERROR = "error"
    SKIP = "skip"


class PinMode(str, enum.Enum):
    """How the ``pinned`` backend gets worker batches into page-locked memory.

    * ``THREAD``: DataLoader's ``pin_memory=True`` pin thread (torch's caching host allocator).
    * ``RING``: a ring of ``prefetch + 1`` pinned buffers allocated once and filled on the
      consumer's thread; a slot is refilled only after its H2D copy has completed (an event).
    """

    THREAD = "thread"
    RING = "ring"


class OutputDType(str, enum.Enum):
    """The dtype of ``Batch.images``."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"

    @property
    def torch(self) -> torch.dtype:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
            self.value
        ]


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_workers() -> int:
    """``LoaderConfig.num_workers`` when not given: the usable cores minus two (for the main
    process and the pin thread), at least one."""
    n = usable_cores()
    return max(1, n - 2) if n > 2 else n


def _dist_rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def int_option(name: str, value, lo: int, hi: int | None = None) -> int:
    """``value`` as an int in ``[lo, hi)`` (numpy integers welcome, bools refused), or a
    ``ValueError`` naming ``name``."""
    try:
        v = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        v = None
    if v is None or v < lo or (hi is not None and v >= hi):
        span = f">= {lo}" if hi is None else f"in [{lo}, {hi})"
        raise ValueError(f"{name}={value!r} must be an int {span}")
    return v


def _enum(cls, name: str, value):
    try:
        return cls(value)
    except ValueError:
        raise ValueError(
            f"{name}={value!r} is not valid; choose one of {[m.value for m in cls]}"
        ) from None


@dataclass(frozen=True)
class LoaderConfig:
    """Everything a loader needs. Invalid values raise ``ValueError`` naming the option.

    Args:
        root: dataset root in ImageFolder layout (one sub-folder per class, ``.jpg``/``.jpeg``).
        batch_size: samples per batch (per rank).
        augment: the ``AugmentSpec`` every backend is built from.
        shuffle: shuffle each epoch with a permutation drawn from ``(seed, epoch)``.
        seed: base seed for the order and for the augmentation, an int in ``[0, 2**32)``.
        last_batch: a ``LastBatchPolicy`` (or its name).
        num_workers: CPU workers (torch backends) or decoder threads (DALI). Default: cores - 2.
        prefetch: batches in flight ahead of the consumer (H2D prefetch depth for ``pinned``,
            DALI's ``prefetch_queue_depth``).
        dtype: an ``OutputDType`` (or its name) for ``Batch.images``.
        channels_last: return images with channels-last strides.
        device: ``"cuda"``, ``"cuda:N"`` or ``"cpu"``.
        rank, world_size: the shard to read. Default: from ``torch.distributed`` when initialised.
        streams: ``pinned`` only; side CUDA streams for H2D copies. ``0`` means pin-memory only,
            copies on the consumer's stream (the "pin_memory only" recipe).
        pin_mode: ``pinned`` only; a ``PinMode`` (or ``"thread"`` / ``"ring"``). Default
            ``"thread"``, chosen from docs/results/h200/pin-ring.
        persistent_workers: keep DataLoader workers alive between epochs (torch backends).
        dali_hw_decoder_load: share of JPEGs sent to the hardware JPEG decoder (0..1, DALI only).
            Default 0.0, chosen from a measured table (docs/results/h200/dali-hw-decoder): on an
            H200 with ResNet-50 training, 0.0 reached 95.5% of the ceiling against 91.8% (0.65)
            and 92.5% (1.0), because the hardware path adds periodic ~70 ms stalls (wait p95).
            A second run (docs/results/h200/dali-train-tuning) gave 95.8% (0.0) against 91.6%
            (1.0), and the current code 97.7 / 92.7 / 91.2% for 0.0 / 0.65 / 1.0
            (docs/results/h200/dali-hw-table-train). For loader-bound work (light models, eval,
            offline preprocessing) use 1.0: 21-24k img/s loader-only against 10-11k at 0.0
            (docs/results/h200/dali-hw-table-loader, loader-only-dali-final).
        dali_pipelines: DALI pipelines run side by side, each with ``num_workers // n``
            threads and every n-th batch of the plan, yielded in the plan's order (each has
            its own augmentation seed, so the random crops differ from a one-pipeline run).
            Default 1. With the hardware decoder 2 adds 5-15% loader-only (22.8k vs 21.4k img/s
            on the H200, docs/results/h200/loader-only-dali-final); for ResNet-50 training it
            did not help (96.1% of the ceiling against 97.6%).
        dali_use_mmap: read JPEGs by mapping them (``fn.io.file.read``'s default) instead of
            ``read()``. Default False: on the H200 host (a VM) mapping 256 small files per batch
            cost a quarter of the loader-only rate (14.7k vs 20.2k img/s, docs/results/h200/
            loader-only-mmap and dali-io-probe). DALI notes
            mapping can help a little on local disks; it rarely helps on network filesystems.
        dali_device_memory_padding, dali_host_memory_padding: nvJPEG buffer padding in bytes.
        dali_preallocate_width_hint, dali_preallocate_height_hint: decoder preallocation hints.
        on_bad_file: a ``BadFilePolicy`` (or ``"error"`` / ``"skip"``).
        max_image_pixels: images with more pixels are refused as decompression bombs.
        transform: your own torchvision transform instead of ``augment``: a v2 ``Compose``, a
            single v2 or v1 transform, an ``nn.Sequential`` of transforms or a v1 ``Compose``
            (stored as one flat v2 ``Compose``; anything else is a ``TypeError``). A sequence
            torchvision itself would refuse on the decoded uint8 image (``Normalize`` before
            any float conversion, ...) raises ``InvalidTransformError`` here. The torch
            backends run it as it is (``pinned`` runs its ``ToDtype``/``Normalize`` tail on
            the GPU); the DALI backend runs its translation or refuses it when the loader is
            built (``pipelines.migrate``). A Compose with no float conversion gives the uint8
            values as floats (0.0..255.0) in every backend.
        allow_empty_classes: keep class folders that hold no image (their class index is kept)
            instead of raising, as ``ImageFolder(allow_empty=True)``.
        debug_indices: also record the dataset index of every yielded sample in
            ``loader.last_indices`` (used by the contract tests).
    """

    root: str | os.PathLike
    batch_size: int = 256
    augment: AugmentSpec = field(default_factory=AugmentSpec)
    shuffle: bool = True
    seed: int = 0
    last_batch: LastBatchPolicy = LastBatchPolicy.PARTIAL
    num_workers: int | None = None
    prefetch: int = 2
    dtype: OutputDType = OutputDType.FLOAT32
    channels_last: bool = False
    device: str = "cuda"
    rank: int | None = None
    world_size: int | None = None
    streams: int = 1
    pin_mode: PinMode = PinMode.THREAD
    persistent_workers: bool = True
    dali_hw_decoder_load: float = 0.0
    dali_pipelines: int = 1
    dali_use_mmap: bool = False
    dali_device_memory_padding: int = 211025920
    dali_host_memory_padding: int = 140544512
    dali_preallocate_width_hint: int = 0
    dali_preallocate_height_hint: int = 0
    on_bad_file: BadFilePolicy = BadFilePolicy.ERROR
    max_image_pixels: int = DEFAULT_MAX_PIXELS
    transform: Any = None
    allow_empty_classes: bool = False
    debug_indices: bool = False

    def __post_init__(self) -> None:
        s = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        if self.root is None or (isinstance(self.root, str) and not self.root.strip()):
            raise ValueError(f"root={self.root!r} must name a dataset folder")
        if not isinstance(self.root, (str, os.PathLike)):
            raise TypeError(f"root={self.root!r} must be a str or os.PathLike")
        s("root", Path(self.root))
        if self.transform is not None:  # stored as a flat v2 Compose; see pipelines.migrate
            from .migrate import check_transform

            s("transform", check_transform(self.transform))
        if not isinstance(self.augment, AugmentSpec):
            raise TypeError(f"augment={self.augment!r} must be an AugmentSpec")
        s("last_batch", _enum(LastBatchPolicy, "last_batch", self.last_batch))
        s("dtype", _enum(OutputDType, "dtype", self.dtype))
        s("on_bad_file", _enum(BadFilePolicy, "on_bad_file", self.on_bad_file))
        s("pin_mode", _enum(PinMode, "pin_mode", self.pin_mode))
        for k in ("shuffle", "channels_last", "persistent_workers", "dali_use_mmap",
                  "debug_indices", "allow_empty_classes"):
            if not isinstance(getattr(self, k), bool):
                raise ValueError(f"{k}={getattr(self, k)!r} must be a bool")
        s("seed", int_option("seed", self.seed, 0, 2**32))
        s("max_image_pixels", int_option("max_image_pixels", self.max_image_pixels, 1))
        s("batch_size", int_option("batch_size", self.batch_size, 1))
        if self.num_workers is None:
            s("num_workers", default_workers())
        s("num_workers", int_option("num_workers", self.num_workers, 0))
        s("prefetch", int_option("prefetch", self.prefetch, 1))
        s("streams", int_option("streams", self.streams, 0))
        s("dali_pipelines", int_option("dali_pipelines", self.dali_pipelines, 1))
        try:
            dev = torch.device(self.device)
        except (RuntimeError, TypeError):
            raise ValueError(f"device={self.device!r} is not a valid torch device") from None
        if dev.type not in ("cuda", "cpu"):
            raise ValueError(f"device={self.device!r} must be 'cpu' or 'cuda[:N]'")
        if self.rank is None or self.world_size is None:
            r, w = _dist_rank_world()
            s("rank", r if self.rank is None else self.rank)
            s("world_size", w if self.world_size is None else self.world_size)
        s("world_size", int_option("world_size", self.world_size, 1))
        s("rank", int_option("rank", self.rank, 0))
        if self.rank >= self.world_size:
            raise ValueError(f"rank={self.rank!r} must be in [0, world_size={self.world_size})")
        if (isinstance(self.dali_hw_decoder_load, bool)
                or not isinstance(self.dali_hw_decoder_load, (int, float))
                or not 0.0 <= self.dali_hw_decoder_load <= 1.0):
            raise ValueError(
                f"dali_hw_decoder_load={self.dali_hw_decoder_load!r} must be in [0, 1]"
            )
        if self.num_workers and self.dali_pipelines > self.num_workers:
            raise ValueError(f"dali_pipelines={self.dali_pipelines!r} must be <= num_workers="
                             f"{self.num_workers} (each pipeline needs a thread)")
        for k in ("dali_device_memory_padding", "dali_host_memory_padding",
                  "dali_preallocate_width_hint", "dali_preallocate_height_hint"):
            s(k, int_option(k, getattr(self, k), 0))

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def wants_cuda(self) -> bool:
        return self.torch_device.type == "cuda"

    def replace(self, **changes) -> "LoaderConfig":
        """A copy with ``changes`` applied (and validated again)."""
        return replace(self, **changes)
