"""``AugmentSpec``: the single description of the augmentation that every backend is built from."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


#: the largest output side: that of the largest JPEG (65535 px a side)
MAX_SIDE = 65535


class Mode(str, enum.Enum):
    """Which augmentation recipe to run.

    * ``TRAIN``: RandomResizedCrop(size, scale, ratio) then horizontal flip with probability ``flip_p``.
    * ``EVAL``: resize the shorter side to ``resize_size`` then centre-crop ``size`` x ``size``.
    """

    TRAIN = "train"
    EVAL = "eval"


@dataclass(frozen=True)
class AugmentSpec:
    """The augmentation, described once.

    Both the torchvision v2 transform (:meth:`to_torchvision`) and the DALI graph
    (``pipelines.dali.graph``) are built from this object, so every backend crops, flips and
    normalises the same way.

    Args:
        mode: ``Mode.TRAIN`` or ``Mode.EVAL``.
        size: the output size in pixels: an int (square) or ``(height, width)``.
        scale: RandomResizedCrop area range, as fractions of the image area.
        ratio: RandomResizedCrop aspect-ratio range (w / h).
        flip_p: probability of a horizontal flip in train mode.
        resize_size: shorter-side size before the centre crop in eval mode (default
            ``round(max(height, width) * 8 / 7)``, i.e. 256 for 224: timm's ``crop_pct``
            0.875).
        mean: per-channel mean on the 0..1 scale.
        std: per-channel std on the 0..1 scale.
        views: crops of each image (self-supervised recipes: SimCLR, BYOL, DINO), train mode
            only. Each image is decoded once and cropped and flipped ``views`` times, view
            ``v`` with its own draws keyed by ``(seed, epoch, index, v)``; view 0 is the crop
            ``views=1`` gives (``pipelines.transforms.draws`` NOTE [views]). ``Batch.images``
            is then ``(N * views) x 3 x H x W``, the views of a sample adjacent (row
            ``i * views + v`` is view ``v`` of sample ``i``), and ``labels``, ``indices`` and
            ``valid`` keep length ``N``. Refused with ``LoaderConfig(transform=...)`` or
            ``mix``.

    Example:
        >>> spec = AugmentSpec(mode="eval", size=224)
        >>> spec.resize_size
        256

        Two views, 8 samples a batch: ``images`` is ``16 x 3 x 224 x 224``, rows
        ``[s0v0, s0v1, s1v0, s1v1, ...]``; a list of the views, each ``8 x 3 x 224 x 224``:

        >>> import torch
        >>> images = torch.zeros(16, 3, 224, 224)
        >>> v0, v1 = images.view(8, 2, 3, 224, 224).unbind(1)
        >>> v0.shape
        torch.Size([8, 3, 224, 224])
    """

    mode: Mode = Mode.TRAIN
    size: int | tuple[int, int] = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    resize_size: int | None = None
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    views: int = 1

    if TYPE_CHECKING:  # the constructor as users call it: ``mode`` also by its name (str)

        def __init__(
            self,
            mode: Mode | Literal["train", "eval"] = Mode.TRAIN,
            size: int | tuple[int, int] = 224,
            scale: tuple[float, float] = (0.08, 1.0),
            ratio: tuple[float, float] = (3 / 4, 4 / 3),
            flip_p: float = 0.5,
            resize_size: int | None = None,
            mean: tuple[float, float, float] = IMAGENET_MEAN,
            std: tuple[float, float, float] = IMAGENET_STD,
            views: int = 1,
        ) -> None: ...

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "mode", Mode(self.mode))
        except ValueError:
            raise ValueError(
                f"mode={self.mode!r} is not valid; choose one of {[m.value for m in Mode]}"
            ) from None
        hw = (self.size, self.size) if isinstance(self.size, int) else self.size
        if isinstance(hw, list):
            hw = tuple(hw)
        if not (isinstance(hw, tuple) and len(hw) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in hw)):
            raise ValueError(f"size={self.size!r} must be a positive int or (height, width) of "
                             "positive ints")
        if max(hw) > MAX_SIDE:
            raise ValueError(f"size={self.size!r}: a side over {MAX_SIDE} px cannot be served "
                             "(no JPEG is larger, and a batch of it would not fit in memory)")
        if not isinstance(self.size, int):
            object.__setattr__(self, "size", hw)
        object.__setattr__(self, "scale", tuple(float(v) for v in self.scale))
        object.__setattr__(self, "ratio", tuple(float(v) for v in self.ratio))
        object.__setattr__(self, "mean", tuple(float(v) for v in self.mean))
        object.__setattr__(self, "std", tuple(float(v) for v in self.std))
        lo, hi = self.scale
        if len(self.scale) != 2 or not (0 < lo <= hi <= 1):
            raise ValueError(f"scale={self.scale!r} must be (lo, hi) with 0 < lo <= hi <= 1")
        lo, hi = self.ratio
        if len(self.ratio) != 2 or not (0 < lo <= hi):
            raise ValueError(f"ratio={self.ratio!r} must be (lo, hi) with 0 < lo <= hi")
        if not 0.0 <= self.flip_p <= 1.0:
            raise ValueError(f"flip_p={self.flip_p!r} must be in [0, 1]")
        if self.resize_size is None:
            object.__setattr__(self, "resize_size", int(round(max(hw) / 0.875)))
        assert self.resize_size is not None  # set just above when it was not given
        if not isinstance(self.resize_size, int) or self.resize_size > MAX_SIDE:
            raise ValueError(f"resize_size={self.resize_size!r} must be an int of at most "
                             f"{MAX_SIDE} px")
        if self.resize_size < max(hw):
            raise ValueError(f"resize_size={self.resize_size!r} must be >= size={self.size} "
                             "(its larger side)")
        if len(self.mean) != 3 or len(self.std) != 3:
            raise ValueError(f"mean={self.mean!r} and std={self.std!r} need 3 values each")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"std={self.std!r} must be positive")
        if isinstance(self.views, bool) or not isinstance(self.views, int) or self.views < 1:
            raise ValueError(f"views={self.views!r} must be an int >= 1")
        if self.views > 1 and self.mode is not Mode.TRAIN:
            raise ValueError(f"views={self.views} needs mode='train' (eval crops are all "
                             "alike); use views=1")

    def at_size(self, size: int | tuple[int, int]) -> AugmentSpec:
        """This recipe at output ``size`` (progressive resizing); a default ``resize_size``
        follows the size."""
        import dataclasses

        default = int(round(max(self.hw) / 0.875))
        keep = None if self.resize_size == default else self.resize_size
        return dataclasses.replace(self, size=size, resize_size=keep)

    @property
    def hw(self) -> tuple[int, int]:
        """The output ``(height, width)``."""
        return (self.size, self.size) if isinstance(self.size, int) else self.size

    @property
    def mean_255(self) -> tuple[float, float, float]:
        """Mean on the 0..255 scale (what uint8 images are normalised with)."""
        return tuple(m * 255.0 for m in self.mean)  # type: ignore[return-value]

    @property
    def std_255(self) -> tuple[float, float, float]:
        """Std on the 0..255 scale."""
        return tuple(s * 255.0 for s in self.std)  # type: ignore[return-value]

    def to_torchvision(self, *, normalize: bool = False):
        """Build the torchvision v2 transform for this spec.

        Args:
            normalize: ``False`` (default) returns ``uint8`` CHW tensors, to be normalised later
                (on the GPU). ``True`` appends ``ToDtype(float32, scale=True)`` and ``Normalize``,
                which is the classic CPU recipe the ``pageable`` baseline runs.

        Returns:
            A ``torchvision.transforms.v2.Compose`` taking a uint8 CHW tensor or a PIL image.
        """
        import torch
        from torchvision.transforms import v2

        if self.mode is Mode.TRAIN:
            ops = [
                v2.RandomResizedCrop(self.hw, scale=self.scale, ratio=self.ratio, antialias=True),
                v2.RandomHorizontalFlip(p=self.flip_p),
            ]
        else:
            ops = [v2.Resize(self.resize_size, antialias=True), v2.CenterCrop(self.hw)]
        ops.append(v2.PILToTensor())
        if normalize:
            ops += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(self.mean, self.std)]
        return v2.Compose(ops)


def check_views(spec: AugmentSpec, transform, mix) -> None:
    """Refuse what ``views`` > 1 does not support: a user ``transform`` (the views are the
    built-in recipe's crops) and ``mix`` (it mixes one image per sample)."""
    if spec.views == 1:
        return
    for name, value in (("transform", transform), ("mix", mix)):
        if value is not None:
            raise ValueError(f"views={spec.views} (AugmentSpec) does not support "
                             f"LoaderConfig({name}=...): drop {name}, or use views=1")
