"""Backend options: the knobs one backend honours, each with one meaning.

``LoaderConfig`` holds what every backend honours. What only one backend understands lives in
its options class, passed as ``create_loader(backend, config, options=...)``:

* ``TorchOptions`` for ``pinned`` and ``pageable`` (a field marked ``only=("pinned",)`` is
  refused on ``pageable``, the untuned baseline);
* ``DaliOptions`` for ``dali``.

A field is the whole definition of an option: ``option(default, lo=..., hi=...)`` gives its
range, the annotation its type, and the field's docstring line in the class doc its meaning.
Validation, ``create_loader`` and ``compare --sweep`` all read the fields, so a new option is
one new field (``tests/test_options.py`` shows it).
"""
from __future__ import annotations

import dataclasses
import enum
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

from pipelines.config import CpuBinding, DecodeOn, Decoder, enum_option, int_option


def option(default: Any, *, lo: float | None = None, hi: float | None = None,
           only: tuple[str, ...] | None = None) -> Any:
    """A validated options field: ``lo``/``hi`` bound numbers (inclusive), ``only`` names the
    backends that honour it (default: every backend of the class)."""
    return field(default=default, metadata={"lo": lo, "hi": hi, "only": only})


def literal_words(hint: Any) -> tuple[str, ...]:
    """The words a ``float | Literal[...]`` annotation admits besides numbers (``("auto",)``)."""
    return tuple(w for a in typing.get_args(hint) if typing.get_origin(a) is Literal
                 for w in typing.get_args(a))


def value_type(hint: Any) -> Any:
    """The type of an annotation's values other than ``None`` and its words (``float`` for
    ``float | Literal["auto"] | None``); ``hint`` itself when it is no union."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is None or not args:
        return hint
    return next(a for a in args if a is not type(None) and typing.get_origin(a) is not Literal)


def _check(name: str, hint: Any, value: Any, meta: Mapping[str, Any]) -> Any:
    """``value`` converted to ``hint`` and checked against ``meta``, or a ``ValueError`` naming
    ``name``."""
    args = typing.get_args(hint)
    if type(None) in args:  # Optional[X]
        if value is None:
            return None
    words = literal_words(hint)  # float | Literal["auto"]: the words are values too
    if words and isinstance(value, str):
        if value in words:
            return value
        raise ValueError(f"{name}={value!r} must be a number or {' or '.join(map(repr, words))}")
    hint = value_type(hint)
    lo, hi = meta.get("lo"), meta.get("hi")
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name}={value!r} must be a bool")
        return value
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return enum_option(hint, name, value)
    if hint is int:
        return int_option(name, value, int(lo) if lo is not None else -(2**63),
                          None if hi is None else int(hi) + 1)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise ValueError(f"{name}={value!r} must be a number")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ValueError(f"{name}={value!r} must be in [{lo}, {hi}]")
        return float(value)
    raise TypeError(f"option {name} has an unsupported type {hint!r}")  # a bug in the class


_O = TypeVar("_O", bound="Options")


class Options:
    """Base of the frozen options classes: validates every field from its annotation and
    ``option()`` metadata; errors are ``ValueError`` naming the field."""

    if typing.TYPE_CHECKING:  # every subclass is a dataclass (what dataclasses.fields needs)
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    backends: ClassVar[tuple[str, ...]] = ()
    # options that were removed: {name: why}; passing one raises a TypeError that says so
    removed: ClassVar[dict[str, str]] = {}

    def __new__(cls, *args: Any, **kwargs: Any):
        gone = [k for k in kwargs if k in cls.removed]
        if gone:
            k = gone[0]
            raise TypeError(f"{cls.__name__}: option {k}={kwargs[k]!r} was removed: "
                            f"{cls.removed[k]}; drop it (the loader does what its default did)")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            v = _check(f.name, hints[f.name], getattr(self, f.name), f.metadata)
            object.__setattr__(self, f.name, v)

    @classmethod
    def option_types(cls) -> dict[str, Any]:
        """``{name: type}`` of every option (what ``compare --sweep`` accepts)."""
        hints = typing.get_type_hints(cls)
        return {f.name: hints[f.name] for f in dataclasses.fields(cls)}

    @classmethod
    def honoured_by(cls, name: str) -> tuple[str, ...]:
        """The backends (by name) on which option ``name`` has an effect."""
        f = {f.name: f for f in dataclasses.fields(cls)}[name]
        return tuple(f.metadata.get("only") or cls.backends)

    def changed(self) -> dict[str, Any]:
        """The options that differ from their defaults."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default}

    def for_backend(self: _O, backend: str) -> _O:
        """``self``, after checking that ``backend`` honours every option changed here.

        Raises:
            ValueError: naming the first option that has no effect on ``backend``.
        """
        for k, v in self.changed().items():
            if backend not in self.honoured_by(k):
                raise ValueError(f"{k}={v!r} has no effect on backend {backend!r} (it applies to "
                                 f"{', '.join(self.honoured_by(k))}); leave it at its default")
        return self

    def replace(self: _O, **changes) -> _O:
        """A copy with ``changes`` applied (and validated again)."""
        return dataclasses.replace(self, **changes)


# DaliOptions' defaults on large photos (NOTE [large photos] in pipelines/dali/loader.py):
# pipelines: at most LARGE_PHOTO_LANES, and at least LANE_BATCHES batches of an epoch for each;
# hw_decoder_load: LARGE_PHOTO_HW_LOAD where the GPU has the hardware decoder
LARGE_PHOTO_LANES = 4
LANE_BATCHES = 3
LARGE_PHOTO_HW_LOAD = 0.5


@dataclass(frozen=True)
class TorchOptions(Options):
    """Knobs of the torch DataLoader backends.

    Args:
        prefetch_factor: batches each DataLoader worker loads ahead (``DataLoader``'s
            ``prefetch_factor``); lowered automatically when /dev/shm is too small.
        queue_depth: ``pinned`` only; batches copied to the device ahead of the consumer
            (the CUDA prefetch depth).
        streams: ``pinned`` only; side CUDA streams for the host-to-device copies. ``0`` means
            pin-memory only: copies on the consumer's stream, no device queue.
        persistent_workers: keep the DataLoader workers alive between epochs. ``None``: on for
            ``pinned``; off for ``pageable``, as in the default recipe (DataLoader's default).
        epoch_stream: one DataLoader iterator runs on across epochs, so the workers decode the
            next epoch's first batches while this one ends (``pipelines.torch_backend.base``
            NOTE). Off, every epoch starts a fresh iterator and the queue drains at its end, as
            a plain DataLoader does. ``None``: on for ``pinned``, off for ``pageable`` (the
            default recipe, untuned).
        decoder: a ``Decoder``: how the workers decode (``"pil"``, ``"torchvision"``,
            ``"scaled"``). ``None``: ``"pil"`` on ``pageable`` (the default recipe, as
            ``ImageFolder`` decodes); on ``pinned``, ``"torchvision"``, or ``"scaled"`` for a
            dataset of photos of a megapixel or more (NOTE [the default decoder] in
            ``pipelines/torch_backend/decode.py``). The loader's ``decoder`` says which ran.
        cpu_binding: ``pinned`` only; a ``CpuBinding``: ``"rank"`` restricts the workers to this
            local rank's slice of the cores under torchrun (``"none"``: the inherited
            affinity). Evidence for the default: docs/results/h200x2/README.md.
    """

    backends: ClassVar[tuple[str, ...]] = ("pinned", "pageable")
    removed: ClassVar[dict[str, str]] = {
        "pin_mode": "a reusable pinned ring was no faster than DataLoader's pin thread "
                    "(docs/backends.md)",
    }

    prefetch_factor: int = option(2, lo=1)
    queue_depth: int = option(2, lo=1, only=("pinned",))
    streams: int = option(1, lo=0, only=("pinned",))
    persistent_workers: bool | None = option(None)
    epoch_stream: bool | None = option(None)
    cpu_binding: CpuBinding = option(CpuBinding.NONE, only=("pinned",))
    decoder: Decoder | None = option(None)


@dataclass(frozen=True)
class DaliOptions(Options):
    """Knobs of the DALI backend.

    Args:
        queue_depth: batches DALI prepares ahead of the consumer (``prefetch_queue_depth``).
            The file feed keeps one more batch of paths ready.
        reader_threads: threads that list and check the files of the next batches before DALI
            reads them. ``None``: ``min(8, max(2, num_workers // 2))``.
        hw_decoder_load: share of the JPEGs sent to the GPU's hardware JPEG decoder (0..1),
            where the GPU has one (``pipelines.device.HW_JPEG_DECODERS``). Above 0, a DALI
            batch is not ready until the GPU work queued before it, the consumer's step
            included, has finished, on any stream: it speeds up loader-bound work and can slow
            a heavy model's training (docs/investigations/dali-hardware-decoder.md).
            ``"auto"`` (default): the rule below, untuned; ``None``: tuned (opt-in: see
            docs/backends.md#the-tuner-opt-in for why it is not the default), and an error with
            ``decode_on="cpu"``, which has no share to tune. On a GPU with the hardware decoder the
            loader times the consumer's own loop on the first batches, tries the shares and
            pipeline counts of ``pipelines.dali.calibrate.GRID`` (each built in the background
            when tried; only the chosen one is kept), keeps the fastest, decides
            again when the loop's pace changes, and caches the choice per machine, data and
            step time (``pipelines.dali.calibrate`` NOTE [calibration]; the loader's
            ``tuning`` says whether it tunes, ``setting`` what runs now and
            ``calibrator.decisions`` what it tried and chose). No setting changes a sample,
            so tuning costs no reproducibility. The rule: ``LARGE_PHOTO_HW_LOAD``
            when nvJPEG decodes a dataset of large photos, else 0.0 (NOTE [large photos] in
            ``pipelines/dali/loader.py``), where it stays elsewhere (CPU operators, a GPU
            without the hardware decoder, ``decode_on="cpu"``). A number pins the share.
        pipelines: DALI pipelines side by side; each gets ``num_workers // pipelines`` decoder
            threads and every n-th batch of the plan, and the batches are yielded in the plan's
            order. The draws are the same whatever the count (they are made on the host per
            sample). Must be ``<= num_workers``. ``None`` (default): the rule, or, with
            ``hw_decoder_load=None`` on a GPU, tuned with the share (above) among counts up to
            ``num_workers``, starting at the rule: up to ``LARGE_PHOTO_LANES`` when nvJPEG decodes a
            dataset of large photos, with ``LANE_BATCHES`` batches of an epoch or more for
            each (NOTE [large photos] in ``pipelines/dali/loader.py``); else 2 when the
            augmentation runs with conditional execution (the AutoAugment family,
            ``RandomApply``, ``RandomChoice``) and there are 2 threads or more, else 1: one
            pipeline's executor caps such a graph (docs/results/h200/README.md, ta-wide-mix).
            A number pins the count.
        use_mmap: read files by mapping them (``fn.io.file.read``'s default) instead of
            ``read()``. Default off: see docs/results/h200/dali-io-probe.
        device_memory_padding, host_memory_padding: nvJPEG buffer padding in bytes.
        preallocate_width_hint, preallocate_height_hint: the hardware decoder's preallocation
            hints, in pixels; ``0`` (default): none. ``None``: the largest image (by area)
            among the headers of ``SIZE_SAMPLE`` files spread over the dataset, when the
            hardware decoder may run (``hw_decoder_load`` not 0) on a GPU. Not shown to help
            on large photos (docs/results/h200/README.md, large-photos), hence the default.
        run_on: at the end of an epoch the pipelines go on with the next epoch's batches, so
            its first batches are ready when the consumer starts it (``pipelines.dali.loader``
            NOTE [running on]). Off: every epoch starts with empty pipelines, and its first
            batch waits for a whole batch's read, decode and augmentation.
        decode_on: a ``DecodeOn``: where the JPEGs are decoded on a GPU, nvJPEG (``"gpu"``)
            or DALI's CPU decoder on the pipeline's threads with the crop and its resize
            (``"cpu"``: only output-size images cross to the GPU). ``"cpu"`` takes the decode's
            GPU work off the training step's GPU for CPU time; it uses no hardware decoder, so
            ``hw_decoder_load`` must stay 0 with it. It fed ResNet-50 far below nvJPEG
            (docs/results/h200/README.md, dali-decode-on), hence the default. No effect on CPU
            operators.
    """

    backends: ClassVar[tuple[str, ...]] = ("dali",)
    removed: ClassVar[dict[str, str]] = {
        k: f"{what} did not remove the hardware decoder's training stalls "
           "(docs/investigations/dali-hardware-decoder.md)"
        for k, what in (("handoff", "taking batches on the loader's own stream"),
                        ("executor", "DALI's pipelined executor"),
                        ("labels_via", "copying the labels in torch"))
    } | {"checkpointing": "a DALI state is the position only: the graph draws nothing itself "
                          "(pipelines.transforms.draws NOTE [one plan])"}

    queue_depth: int = option(2, lo=1)
    reader_threads: int | None = option(None, lo=1)
    hw_decoder_load: float | Literal["auto"] | None = option("auto", lo=0.0, hi=1.0)
    pipelines: int | None = option(None, lo=1)
    use_mmap: bool = option(False)
    device_memory_padding: int = option(211025920, lo=0)
    host_memory_padding: int = option(140544512, lo=0)
    preallocate_width_hint: int | None = option(0, lo=0)
    preallocate_height_hint: int | None = option(0, lo=0)
    run_on: bool = option(True)
    decode_on: DecodeOn = option(DecodeOn.GPU)

    def threads(self, num_workers: int) -> int:
        """The reader threads for ``num_workers`` decoder threads (``reader_threads``)."""
        if self.reader_threads is not None:
            return self.reader_threads
        return min(8, max(2, num_workers // 2))

    def load_for(self, large_on_hw: bool = False) -> float | None:
        """``hw_decoder_load``, or the rule for ``"auto"``, where the tuner starts:
        ``LARGE_PHOTO_HW_LOAD`` when ``large_on_hw`` (nvJPEG decodes large photos on a GPU with
        the hardware decoder), else 0.0."""
        if self.hw_decoder_load != "auto":
            return self.hw_decoder_load
        return LARGE_PHOTO_HW_LOAD if large_on_hw else 0.0

    def lanes_for(self, conditional: bool, num_workers: int, large_photos: bool = False,
                  batches: int | None = None) -> int:
        """``pipelines``, or its default for a graph that is (or is not) ``conditional``, on a
        dataset that is (or is not) of ``large_photos`` decoded by nvJPEG, in epochs of
        ``batches`` batches (``None``: not known, as if long)."""
        if self.pipelines is not None:
            return self.pipelines
        if large_photos:
            fit = LARGE_PHOTO_LANES if batches is None else batches // LANE_BATCHES
            return max(1, min(LARGE_PHOTO_LANES, num_workers, fit))
        return 2 if conditional and num_workers >= 2 else 1

    def check(self, num_workers: int) -> None:
        """The rules that involve the ``LoaderConfig`` (raised when the loader is built)."""
        if self.decode_on is DecodeOn.CPU and self.hw_decoder_load not in (0.0, "auto"):
            raise ValueError(f"hw_decoder_load={self.hw_decoder_load!r} is the hardware "
                             "decoder's share (None: tuned), which decode_on='cpu' does not "
                             "use; leave it at 0 or its default, or use decode_on='gpu'")
        if num_workers and self.pipelines is not None and self.pipelines > num_workers:
            raise ValueError(f"pipelines={self.pipelines!r} must be <= num_workers={num_workers} "
                             "(each DALI pipeline needs a decoder thread)")


__all__ = ["DaliOptions", "Options", "TorchOptions", "option"]
