"""``LoaderConfig``: one frozen, validated description of a loader, shared by every backend."""
from __future__ import annotations

import enum
import operator
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

import torch

from pipelines.placement import Placement, local_device, local_world_size, placement
from pipelines.sources.folder import IMAGE_EXTENSIONS, check_extensions
from pipelines.sources.validate import DEFAULT_MAX_PIXELS
from pipelines.transforms.mix import as_mix_spec
from pipelines.transforms.spec import AugmentSpec, check_views


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
    """What a loader does with a file that is not a decodable image (see ``pipelines.sources.validate``).

    * ``ERROR``: raise one ``BadFileError`` in the main process naming the file and the reason.
    * ``SKIP``: replace the sample by the next good sample of the same batch, so batch sizes
      follow the ``LastBatchPolicy``; count it in ``loader.stats`` and warn once per epoch with
      the names. Example: batch ``[a, BAD, c]`` -> ``[a, c, c]`` and ``stats["bad_files"] == 1``.
      A batch with no good sample at all is dropped (and its files counted).
    """

    ERROR = "error"
    SKIP = "skip"


class CpuBinding(str, enum.Enum):
    """Which cores a ``pinned`` loader's DataLoader workers may run on
    (``TorchOptions.cpu_binding``; ``pipelines.torch_backend.affinity``).

    * ``NONE``: the process's own affinity, as inherited (every rank's workers share the host).
    * ``RANK``: this local rank's slice of the usable cores: they are split into
      ``LOCAL_WORLD_SIZE`` contiguous slices and rank ``LOCAL_RANK`` takes its own, so the ranks
      of a host do not compete for each other's cores. One local rank: no change.
    """

    NONE = "none"
    RANK = "rank"


class Decoder(str, enum.Enum):
    """How a torch backend's workers decode JPEGs (``TorchOptions.decoder``;
    ``pipelines.torch_backend.decode``).

    * ``PIL``: ``PIL.Image.open(...).convert("RGB")``, as ``torchvision.datasets.ImageFolder``'s
      default loader, and the transforms get the PIL image (the default recipe; ``pageable``'s
      default).
    * ``TORCHVISION``: ``torchvision.io.decode_image`` (libjpeg-turbo) to a uint8 tensor
      (``pinned``'s default).
    * ``SCALED``: when the recipe starts with ``RandomResizedCrop``, the crop is drawn in
      full-image coordinates from the JPEG header first, then the JPEG is decoded at the largest
      1/2, 1/4 or 1/8 scale at which the crop still covers the output size (libjpeg's DCT
      scaling through PIL's ``draft``), and cropped and resized from that. The draws are
      torchvision's; only the interpolation source changes. A recipe that starts with an
      eval ``Resize`` to a shorter side is decoded the same way, the whole image being the
      crop. Other recipes decode as ``PIL``.
    """

    PIL = "pil"
    TORCHVISION = "torchvision"
    SCALED = "scaled"


class DecodeOn(str, enum.Enum):
    """Where the ``dali`` backend decodes its JPEGs on a GPU (``DaliOptions.decode_on``).

    * ``GPU``: DALI's mixed decoder, nvJPEG (and the hardware JPEG decoder's share,
      ``hw_decoder_load``): the Huffman decode on the pipeline's CPU threads, the rest on the GPU.
    * ``CPU``: DALI's CPU decoder (libjpeg-turbo) on the pipeline's threads, the crop fused into
      the decode and the resize that follows it on the CPU too; only the images of the output
      size move to the GPU, where the rest of the recipe runs. The GPU then does almost none of
      the decode's work, at the cost of CPU time.

    Example: ``DaliOptions(decode_on="cpu")`` for a host with many cores per GPU (on the
    H200's 16 cores it was far slower than nvJPEG: docs/results/h200/README.md,
    dali-decode-on). On CPU operators (no GPU) everything runs on the CPU either way.
    """

    GPU = "gpu"
    CPU = "cpu"


class OutputDType(str, enum.Enum):
    """The dtype of ``Batch.images``.

    * ``FLOAT32``, ``BFLOAT16``, ``FLOAT16``: normalised with ``AugmentSpec.mean`` and ``std``.
    * ``UINT8``: the augmented crop's pixels, 0..255, not normalised (the model normalises:
      ``(x / 255 - mean) / std``); ``AugmentSpec.mean`` and ``std`` are not applied. Layout and
      ``channels_last`` as for the float dtypes. Refused with ``mix`` (MixUp/CutMix blend
      images into fractions) and with a ``transform`` that ends in a float dtype.

    Example: ``LoaderConfig(root, dtype="uint8")`` gives ``N x 3 x H x W`` uint8 batches, a
    quarter of float32's bytes from host to device.
    """

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    UINT8 = "uint8"

    @property
    def torch(self) -> torch.dtype:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "uint8": torch.uint8}[self.value]


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_workers(cores: int | None = None, local_ranks: int | None = None) -> int:
    """``LoaderConfig.num_workers`` when not given: this rank's share of the usable cores
    (divided by ``LOCAL_WORLD_SIZE`` under torchrun) minus two (for the main process and the
    pin thread), at least one. ``cores`` and ``local_ranks`` default to this machine's and
    this job's (``compare doctor`` passes others)."""
    cores = usable_cores() if cores is None else cores
    n = max(1, cores // (local_world_size() if local_ranks is None else max(1, local_ranks)))
    return max(1, n - 2) if n > 2 else n


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


def enum_option(cls, name: str, value):
    """``cls(value)``, or a ``ValueError`` naming ``name`` and the valid values."""
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
        root: dataset root in ImageFolder layout (one sub-folder per class); a file list:
            a ``.csv``/``.tsv`` with path and label columns, or a ``.txt`` of ``path label``
            lines (``pipelines.sources.lists``); or WebDataset tar shards: a ``.tar``, a glob or
            brace pattern of them, or a folder of them (``pipelines.sources.shards``); remote
            shards: an ``https://``, ``http://``, ``s3://`` or ``pipe:COMMAND`` URL with brace
            ranges, or a list of shard URLs or paths (``pipelines.sources.remote``).
        batch_size: samples per batch (per rank).
        augment: the ``AugmentSpec`` every backend is built from.
        shuffle: shuffle each epoch with a permutation drawn from ``(seed, epoch)``.
        seed: base seed for the order and for the augmentation, an int in ``[0, 2**32)``.
        last_batch: a ``LastBatchPolicy`` (or its name). Default ``None``: ``PARTIAL`` with one
            rank, ``PAD`` with several, so every rank yields the same number of batches (an
            explicit ``"partial"`` there warns: ranks with unequal steps hang DDP).
        num_workers: CPU workers (torch backends) or decoder threads (DALI). Default: this rank's
            share of the cores, minus 2 (``default_workers``).
        dtype: an ``OutputDType`` (or its name) for ``Batch.images``: normalised float32
            (default), bfloat16 or float16, or ``"uint8"``, the crop's pixels with the
            normalisation left to the model (``mean`` / ``std`` not applied).
        channels_last: return images with channels-last strides.
        device: ``"cuda"`` (``cuda:LOCAL_RANK`` under torchrun), ``"cuda:N"`` or ``"cpu"``.
        rank, world_size: the shard to read. Default: resolved when the loader is built, from
            ``torch.distributed`` or torchrun's environment (``pipelines.placement``).
        on_bad_file: a ``BadFilePolicy`` (or ``"error"`` / ``"skip"``).
        max_image_pixels: images with more pixels are refused as decompression bombs.
        transform: your own torchvision transform instead of ``augment``: a v2 ``Compose``, a
            single v2 or v1 transform, an ``nn.Sequential`` of transforms or a v1 ``Compose``
            (stored as one flat v2 ``Compose``; anything else is a ``TypeError``). A sequence
            torchvision itself would refuse on the decoded uint8 image (``Normalize`` before
            any float conversion, ...) raises ``InvalidTransformError`` here. The torch
            backends run it as it is (``pinned`` runs its ``ToDtype``/``Normalize`` tail on
            the GPU); the DALI backend runs its translation or refuses it when the loader is
            built (``pipelines.transforms.migrate``). A Compose with no float conversion gives the uint8
            values as floats (0.0..255.0) in every backend.
        mix: batch-level MixUp / CutMix on the device, the same on every backend: a
            ``pipelines.transforms.mix.MixSpec``, or torchvision v2's ``MixUp``, ``CutMix`` or
            ``RandomChoice([MixUp(...), CutMix(...)])``. ``Batch.labels`` is then float32
            ``N x C`` soft targets. MixUp/CutMix inside ``transform`` are refused (they act on
            batches, not images): pass them here.
        shuffle_window: with tar shards, each rank's samples are shuffled within windows of
            this many consecutive samples of its shards (``pipelines.sources.shards`` NOTE [the plan
            for shards]); folders and file lists ignore it.
        extensions: the file extensions listed as images, any case (default JPEG, PNG, WebP and
            BMP: what every backend decodes); other files are skipped and named in one warning.
        allow_empty_classes: keep class folders that hold no image (their class index is kept)
            instead of raising, as ``ImageFolder(allow_empty=True)``.
        debug_indices: also record the dataset index of every yielded sample in
            ``loader.last_indices`` (used by the contract tests).
        target: what ``Batch.labels`` holds: ``"class"`` (default), ``"multilabel"`` (float32
            multi-hot ``N x C`` from a list's cell or a shard's ``.txt``/``.cls``/``.json``), a
            tuple of column names or JSON keys (float32 ``N x K``, regression), ``"none"`` (the
            dataset indices) or a callable ``target_fn(relative_path) -> int | sequence of
            float``, called once per sample when the loader is built
            (``pipelines.sources.targets``).
        classes: one class list for every split: a sequence of distinct class names (id =
            position, e.g. ``train_loader.classes``) or a count ``n`` (integer ids ``0 .. n-1``).
            Every source's labels are mapped onto it (a folder's class folders and a list's
            names by name, integer labels as ids), so a split that lacks a class keeps the ids;
            a class outside it raises naming it, or its samples are skipped and counted under
            ``on_bad_file="skip"`` (``pipelines.sources.classes``). Default ``None``: each split
            numbers the classes it holds.
        storage_options: remote roots: keyword arguments of ``s3fs.S3FileSystem``
            (``{"key": ..., "secret": ..., "endpoint_url": ...}``); default: the AWS
            environment variables.
        read_timeout: remote roots: seconds a connection or read may stall before it fails
            (retried, then one error naming the shard: ``pipelines.sources.remote`` NOTE [faults]).
        shard_cache, shard_cache_bytes: remote roots: a folder that keeps the copied shards
            across epochs and loaders (``~`` is expanded), the least recently used of its own
            copies removed beyond ``shard_cache_bytes``; other files in the folder are never
            touched (``pipelines.sources.shard_cache``). Default ``None``: a private spool of a
            few shards, deleted at ``close()`` (``pipelines.sources.spool`` NOTE [spool]).
    """

    root: str | os.PathLike | tuple
    batch_size: int = 256
    augment: AugmentSpec = field(default_factory=AugmentSpec)
    shuffle: bool = True
    seed: int = 0
    last_batch: LastBatchPolicy | None = None
    num_workers: int | None = None
    dtype: OutputDType = OutputDType.FLOAT32
    channels_last: bool = False
    device: str = "cuda"
    rank: int | None = None
    world_size: int | None = None
    on_bad_file: BadFilePolicy = BadFilePolicy.ERROR
    max_image_pixels: int = DEFAULT_MAX_PIXELS
    transform: Any = None
    allow_empty_classes: bool = False
    debug_indices: bool = False
    extensions: tuple = IMAGE_EXTENSIONS
    shuffle_window: int = 8192
    mix: Any = None
    target: Any = "class"
    classes: Any = None
    storage_options: Any = field(default=None, hash=False, repr=False)  # may hold secrets
    read_timeout: float = 60.0
    shard_cache: str | None = None
    shard_cache_bytes: int | None = None

    if TYPE_CHECKING:  # the constructor as users call it: each enum also by its name (str)

        def __init__(
            self,
            root: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
            batch_size: int = 256,
            augment: AugmentSpec = ...,
            shuffle: bool = True,
            seed: int = 0,
            last_batch: LastBatchPolicy | Literal["drop", "partial", "pad"] | None = None,
            num_workers: int | None = None,
            dtype: OutputDType | Literal["float32", "bfloat16", "float16", "uint8"] = OutputDType.FLOAT32,
            channels_last: bool = False,
            device: str = "cuda",
            rank: int | None = None,
            world_size: int | None = None,
            on_bad_file: BadFilePolicy | Literal["error", "skip"] = BadFilePolicy.ERROR,
            max_image_pixels: int = DEFAULT_MAX_PIXELS,
            transform: Any = None,
            allow_empty_classes: bool = False,
            debug_indices: bool = False,
            extensions: Sequence[str] = IMAGE_EXTENSIONS,
            shuffle_window: int = 8192,
            mix: Any = None,
            target: Any = "class",
            classes: Sequence[str] | int | None = None,
            storage_options: dict[str, Any] | None = None,
            read_timeout: float = 60.0,
            shard_cache: str | os.PathLike[str] | None = None,
            shard_cache_bytes: int | None = None,
        ) -> None: ...

    def __post_init__(self) -> None:
        s = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        if self.root is None or (isinstance(self.root, str) and not self.root.strip()):
            raise ValueError(f"root={self.root!r} must name a dataset folder")
        if isinstance(self.root, (list, tuple)):
            if not self.root:
                raise ValueError("root=[] must name at least one shard")
        elif not isinstance(self.root, (str, os.PathLike)):
            raise TypeError(f"root={self.root!r} must be a str or os.PathLike, or a list of "
                            "shard URLs or paths")
        from pipelines.sources.root import as_root, check_local_root  # before Path folds "//"
        check_local_root(self.root)
        s("root", as_root(self.root))
        self._check_remote()
        if self.transform is not None:  # stored as a flat v2 Compose; see pipelines.transforms.migrate
            from pipelines.transforms.migrate import check_transform

            s("transform", check_transform(self.transform))
            batchwise = [type(t).__name__ for t in getattr(self.transform, "transforms", ())
                         if type(t).__name__ in ("MixUp", "CutMix")
                         or (type(t).__name__ == "RandomChoice" and any(
                             type(u).__name__ in ("MixUp", "CutMix") for u in t.transforms))]
            if batchwise:
                raise ValueError(f"transform holds {batchwise[0]}, which mixes whole batches; "
                                 "pass it as LoaderConfig(mix=...) instead (pipelines.transforms.mix)")
        s("mix", as_mix_spec(self.mix))
        from pipelines.sources.targets import check_target
        s("target", check_target(self.target))
        from pipelines.sources.classes import check_classes
        from pipelines.sources.classes import check_target as check_classes_target
        s("classes", check_classes(self.classes))
        check_classes_target(self.classes, self.target)
        if self.mix is not None and not (self.target == "class" or self.target == "multilabel"):
            raise ValueError(f"mix mixes class and multi-label targets; target={self.target!r} "
                             "is neither: drop mix, or mix the targets in your step")
        s("extensions", check_extensions(self.extensions))
        if not isinstance(self.augment, AugmentSpec):
            raise TypeError(f"augment={self.augment!r} must be an AugmentSpec")
        check_views(self.augment, self.transform, self.mix)
        if self.last_batch is not None:
            s("last_batch", enum_option(LastBatchPolicy, "last_batch", self.last_batch))
        s("dtype", enum_option(OutputDType, "dtype", self.dtype))
        if self.transform is not None:  # a ToDtype(bfloat16) that dtype would silently undo
            from pipelines.transforms.migrate import check_output_dtype
            check_output_dtype(self.transform, self.dtype.torch)
        if self.mix is not None and self.dtype is OutputDType.UINT8:
            raise ValueError("mix blends images into fractions, which dtype='uint8' cannot "
                             "hold; drop mix or use a float dtype")
        s("on_bad_file", enum_option(BadFilePolicy, "on_bad_file", self.on_bad_file))
        for k in ("shuffle", "channels_last", "debug_indices", "allow_empty_classes"):
            if not isinstance(getattr(self, k), bool):
                raise ValueError(f"{k}={getattr(self, k)!r} must be a bool")
        s("seed", int_option("seed", self.seed, 0, 2**32))
        s("max_image_pixels", int_option("max_image_pixels", self.max_image_pixels, 1))
        h, w = self.augment.hw
        if self.transform is None and h * w > self.max_image_pixels:
            raise ValueError(f"augment: size={self.augment.size!r} gives {h} x {w} output pixels, "
                             f"more than max_image_pixels={self.max_image_pixels}, the largest "
                             "image the loader decodes; choose a smaller size")
        s("batch_size", int_option("batch_size", self.batch_size, 1))
        s("shuffle_window", int_option("shuffle_window", self.shuffle_window, 1))
        if self.num_workers is None:
            s("num_workers", default_workers())
        s("num_workers", int_option("num_workers", self.num_workers, 0))
        try:
            dev = torch.device(self.device)
        except (RuntimeError, TypeError):
            raise ValueError(f"device={self.device!r} is not a valid torch device") from None
        if dev.type not in ("cuda", "cpu"):
            raise ValueError(f"device={self.device!r} must be 'cpu' or 'cuda[:N]'")
        if self.world_size is not None:
            s("world_size", int_option("world_size", self.world_size, 1))
        if self.rank is not None:
            s("rank", int_option("rank", self.rank, 0))
            if self.world_size is not None and self.rank >= self.world_size:
                raise ValueError(f"rank={self.rank!r} must be in [0, world_size={self.world_size})")

    def __repr__(self) -> str:
        """The fields as a dataclass shows them, with a remote ``root`` redacted: credentials
        and tokens in a URL or a ``pipe:`` command never reach a message or a log."""
        from pipelines.sources import remote

        shown = []
        for f in fields(self):
            if not f.repr:
                continue
            v = getattr(self, f.name)
            if f.name == "root" and remote.is_remote(v):
                shown.append(f"root={remote.shown(v)!r}")
            else:
                shown.append(f"{f.name}={v!r}")
        return f"{type(self).__name__}({', '.join(shown)})"

    def _check_remote(self) -> None:
        s = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        if self.storage_options is not None and not isinstance(self.storage_options, dict):
            raise TypeError(f"storage_options: a {type(self.storage_options).__name__} (not "
                            "shown: it may hold secrets); it must be a dict of "
                            "s3fs.S3FileSystem arguments")
        s("storage_options", dict(self.storage_options or {}))
        t = self.read_timeout
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf"):
            raise ValueError(f"read_timeout={t!r} must be a positive number of seconds")
        s("read_timeout", float(t))
        if self.shard_cache is not None:
            if not isinstance(self.shard_cache, (str, os.PathLike)):
                raise TypeError(f"shard_cache={self.shard_cache!r} must be a folder path")
            s("shard_cache", os.path.expanduser(os.fspath(self.shard_cache)))  # "~/x" too
        if self.shard_cache_bytes is not None:
            if self.shard_cache is None:
                raise ValueError(f"shard_cache_bytes={self.shard_cache_bytes!r} needs "
                                 "shard_cache, the folder it bounds")
            s("shard_cache_bytes", int_option("shard_cache_bytes", self.shard_cache_bytes, 1))

    def storage(self):
        """How this config reaches remote shards (``pipelines.sources.remote.Storage``)."""
        from pipelines.sources.remote import Storage

        return Storage(options=self.storage_options, timeout=self.read_timeout,
                       cache=self.shard_cache)

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def wants_cuda(self) -> bool:
        return self.torch_device.type == "cuda"

    @property
    def is_resolved(self) -> bool:
        """Whether rank, world size and the last-batch policy are all set."""
        return None not in (self.rank, self.world_size, self.last_batch)

    def resolved(self) -> LoaderConfig:
        """This config with rank, world size, ``last_batch`` and the CUDA device resolved as a
        loader built now would resolve them (``pipelines.placement``)."""
        return resolve(self)[0]

    def replace(self, **changes) -> LoaderConfig:
        """A copy with ``changes`` applied (and validated again)."""
        return replace(self, **changes)


def resolve(config: LoaderConfig) -> tuple[LoaderConfig, Placement]:
    """``(config with rank, world_size, last_batch and device resolved, its Placement)``
    (``pipelines.placement`` NOTE [placement])."""
    p = placement(config.rank, config.world_size)
    if p.rank >= p.world_size:
        raise ValueError(f"rank={p.rank} must be in [0, world_size={p.world_size}) "
                         f"(from {p.source})")
    policy = config.last_batch
    if policy is None:
        policy = LastBatchPolicy.PAD if p.world_size > 1 else LastBatchPolicy.PARTIAL
    changes = dict(rank=p.rank, world_size=p.world_size, last_batch=policy,
                   device=local_device(config.device, p))
    if all(getattr(config, k) == v for k, v in changes.items()):
        return config, p
    return config.replace(**changes), p
