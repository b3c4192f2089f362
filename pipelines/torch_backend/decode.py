"""The torch backends' JPEG decoders (``TorchOptions.decoder``; ``pipelines.config.Decoder``).

NOTE [scaled decode]
A JPEG is stored as 8x8 DCT blocks, and libjpeg can decode it at 1/2, 1/4 or 1/8 of its size
for a fraction of the work (it drops the high frequencies instead of computing them; PIL exposes
this as ``Image.draft``). ``RandomResizedCrop`` then throws most of the pixels away: a 0.3 MP
photo cropped to 224x224 from a crop of a quarter of its area needs no more than a half-size
decode. ``scaled_crop`` draws the crop exactly as torchvision does, from the header's full size
(the step's own ``make_params`` on a zero-size stand-in of the full image, consuming the same
random numbers), picks the largest reduction ``k`` in 8, 4, 2 at which the crop is still at
least the output size, decodes at 1/k and crops and resizes the crop's box, scaled to the
reduced image, with PIL's antialiased filter (what ``antialias=True`` imitates). So the crop's
distribution is torchvision's exactly, and only the image it is resampled from differs: the
DCT-reduced one, which is about as sharp as the full image low-passed to that size
(``tests/test_decode.py`` bounds the difference). The eval recipe's ``Resize`` (then
``CenterCrop``) takes the same path with the whole image as its box: the output size is
computed from the header's full size as ``Resize`` computes it, and the image is decoded at
the largest reduction that still covers it. When no reduction fits, or the file is not a
baseline RGB/greyscale JPEG with upright EXIF, or the step uses another interpolation (or a
``max_size``), the sample is decoded in full as ``Decoder.PIL`` does.
"""
from __future__ import annotations

import functools
import io

import numpy as np
import torch
from PIL import Image, ImageOps

from pipelines.sources.root import median_megapixels

EXIF_ORIENTATION = 0x0112
# NOTE [the default decoder]: ``pinned`` decodes with torchvision unless the recipe starts with
# a step the scaled path runs and the median image of the dataset (from the headers of
# ``pipelines.sources.root.SIZE_SAMPLE`` files spread over the listing) has at least
# ``SCALED_FROM_MP`` megapixels.
# On this project's CPU, per image, torchvision's decoder beat the scaled one on ImageNet-sized
# images, tied at about 1 MP and lost from there, by more as photos grow; the threshold sits at
# the tie (docs/results/cpu/README.md: decode-scaled.json). The rule depends only on the files,
# so a resumed job decodes as the first run did. Not yet measured on a GPU host at this
# threshold.
SCALED_FROM_MP = 1.0
# Pillow sets these module constants in a loop over its enums, which its typing does not describe
_RESAMPLE = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}  # type: ignore[attr-defined]


def pil_image(data: bytes) -> Image.Image:
    """``ImageFolder``'s loader on bytes: open, EXIF orientation applied (as every backend
    does), converted to RGB."""
    with Image.open(io.BytesIO(data)) as im:
        upright(im)
        return im.convert("RGB")


def upright(im: Image.Image) -> None:
    """Apply ``im``'s EXIF orientation in place. Not ``ImageOps.exif_transpose(im)``, which
    returns a copy even of an upright image: one more full-size copy per sample than
    ``ImageFolder``'s loader makes."""
    if im.getexif().get(EXIF_ORIENTATION, 1) in (None, 1):
        return
    ImageOps.exif_transpose(im, in_place=True)


def pil_tensor(data: bytes) -> torch.Tensor:
    """``pil_image`` as a uint8 ``3 x H x W`` tensor."""
    return as_tensor(pil_image(data))


def as_tensor(x):
    """A PIL image left at the end of a recipe, as a uint8 ``3 x H x W`` tensor."""
    if isinstance(x, Image.Image):
        return torch.from_numpy(np.asarray(x.convert("RGB")).copy()).permute(2, 0, 1)
    return x


def takes_pil(steps) -> bool:
    """Whether the recipe turns a PIL image into a tensor itself (a ``PILToTensor``,
    ``ToImage`` or v1 ``ToTensor`` step), as a recipe written for ``ImageFolder`` does: then the
    PIL decoder hands it the PIL image, else a uint8 tensor of it."""
    names = {"PILToTensor", "ToImage", "ToTensor", "ToImageTensor"}
    return any(type(t).__name__ in names for t in steps.transforms)


def first_crop(steps) -> object | None:
    """The recipe's first step when the scaled path can run it: a v2 ``RandomResizedCrop``, or
    a v2 ``Resize`` to a shorter side (an int, ``max_size`` unset: the eval recipe's), bilinear
    or bicubic and antialiased; else ``None``."""
    from torchvision.transforms import v2

    t = steps.transforms[0] if len(steps) else None
    if not isinstance(t, (v2.RandomResizedCrop, v2.Resize)) or not getattr(t, "antialias", True):
        return None
    if isinstance(t, v2.Resize) and (len(t.size) != 1 or t.max_size is not None):
        return None
    return t if _mode(t) in _RESAMPLE else None


def default_decoder(steps, source) -> str:
    """``pinned``'s decoder when ``TorchOptions.decoder`` is unset (NOTE [the default
    decoder]): ``"scaled"`` or ``"torchvision"``."""
    if first_crop(steps) is None:
        return "torchvision"
    mp = median_megapixels(source)
    return "scaled" if mp is not None and mp >= SCALED_FROM_MP else "torchvision"


def resized_size(height: int, width: int, short: int) -> tuple:
    """``(h, w)`` that ``Resize(short)`` gives an image of ``height`` x ``width``: the shorter
    side becomes ``short`` and the longer one ``int(short * long / shorter)``, as torchvision
    computes it."""
    if width <= height:
        return int(short * height / width), short
    return short, int(short * width / height)


def _mode(t) -> str:
    return getattr(t.interpolation, "value", str(t.interpolation)).lower()


def _params(t, height: int, width: int) -> dict:
    """``t``'s crop for an image of ``height`` x ``width``, drawn as ``t`` itself draws it."""
    stand_in = torch.zeros(1, dtype=torch.uint8).expand(3, height, width)
    make = getattr(t, "make_params", None) or t._get_params  # torchvision < 0.21: _get_params
    return make([stand_in])


def reduction(crop_h: float, crop_w: float, out_h: int, out_w: int) -> int:
    """The largest ``k`` in 8, 4, 2 with the crop, reduced by ``k``, still at least the output
    size; 1 when none is."""
    for k in (8, 4, 2):
        if crop_h / k >= out_h and crop_w / k >= out_w:
            return k
    return 1


# NOTE [the scaled decode's library]
# The reduced decode runs in ``simplejpeg`` when it is installed (a dependency of this
# package), else in PIL (``Image.draft``). Both are libjpeg-turbo's scaled IDCT and decode the
# same pixels; with simplejpeg only the crop's region, with the margin the resize filter reads,
# becomes a PIL image, so the resized output differs by rounding (``tests/test_decode.py``).
# simplejpeg decodes faster, most on small images and at full size (docs/results/cpu/README.md:
# jpeg-libs.txt, decode-scaled.json). Asking PIL for ``size // k`` matters:
# PIL reduces by the largest of 8, 4, 2 within ``size // request``, and the ceiling of
# ``size / k`` gave half the reduction whenever ``k`` does not divide the side.
LIBRARIES = ("simplejpeg", "pil")


@functools.lru_cache(maxsize=1)
def jpeg_library() -> str:
    """The library the scaled decode uses here (NOTE [the scaled decode's library])."""
    try:
        import simplejpeg  # noqa: F401
    except ImportError:
        return "pil"
    return "simplejpeg"


def _reduced_rgb(data: bytes, width: int, height: int, k: int) -> np.ndarray:
    """``data`` decoded by simplejpeg at ``1/k`` of ``width`` x ``height`` (``ceil(size / k)``,
    as libjpeg scales), ``H x W x 3`` uint8."""
    import simplejpeg

    return simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=-(-height // k),
                                  min_width=-(-width // k))


def _draft(im: Image.Image, width: int, height: int, k: int) -> None:
    """Have PIL decode ``im`` at ``1/k`` (``size // k``, not its ceiling: NOTE [the scaled
    decode's library])."""
    if k > 1:
        im.draft("RGB", (width // k, height // k))


def reduced_decode(data: bytes, k: int, library: str | None = None) -> np.ndarray:
    """The JPEG ``data`` decoded whole at ``1/k`` (8, 4, 2 or 1) of its size, ``H x W x 3``
    uint8, in ``library`` (default: ``jpeg_library()``): the decode under every scaled crop
    (``python -m tools.microbench decode`` times it alone)."""
    library = library or jpeg_library()
    if library == "simplejpeg":
        import simplejpeg

        height, width = simplejpeg.decode_jpeg_header(data)[:2]
        return _reduced_rgb(data, width, height, k)
    with Image.open(io.BytesIO(data)) as im:
        _draft(im, im.size[0], im.size[1], k)
        return np.asarray(im.convert("RGB"))


def _resize_box(rgb: np.ndarray, box, size, resample, support: float) -> Image.Image:
    """``Image.fromarray(rgb).resize(size, resample, box=box)`` with only ``box`` and the
    ``support`` (the filter's radius) around it made a PIL image: the pixels the filter reads,
    so the result is the same up to rounding (``tests/test_decode.py`` bounds it)."""
    h, w = rgb.shape[:2]
    mx = support * max(1.0, (box[2] - box[0]) / size[0]) + 1
    my = support * max(1.0, (box[3] - box[1]) / size[1]) + 1
    x0, y0 = max(0, int(box[0] - mx)), max(0, int(box[1] - my))
    x1, y1 = min(w, int(box[2] + mx) + 1), min(h, int(box[3] + my) + 1)
    sub = Image.fromarray(np.ascontiguousarray(rgb[y0:y1, x0:x1]))
    return sub.resize(size, resample, box=(box[0] - x0, box[1] - y0, box[2] - x0, box[3] - y0))


_SUPPORT = {"bilinear": 1.0, "bicubic": 2.0}  # PIL's filter radii


def scaled_crop(data: bytes, t, library: str | None = None) -> Image.Image | None:
    """``t`` (see ``first_crop``) on the JPEG ``data`` through a DCT-scaled decode (module
    NOTE); ``None`` when the file needs the full decode, and then no random number has been
    drawn. ``library``: ``"simplejpeg"`` or ``"pil"`` (default: ``jpeg_library()``)."""
    from torchvision.transforms import v2

    library = library or jpeg_library()
    if library not in LIBRARIES:
        raise ValueError(f"library={library!r} is not one of {LIBRARIES}")
    im = Image.open(io.BytesIO(data))
    try:
        if im.format != "JPEG" or im.mode not in ("RGB", "L") or \
                im.getexif().get(EXIF_ORIENTATION, 1) not in (None, 1):
            return None
        width, height = im.size
        if isinstance(t, v2.Resize):
            out_h, out_w = resized_size(height, width, t.size[0])
            p = {"top": 0, "left": 0, "height": height, "width": width}
        else:
            p = _params(t, height, width)
            out_h, out_w = t.size
        k = reduction(p["height"], p["width"], out_h, out_w)
        rgb = None
        if library == "simplejpeg":
            rgb = _reduced_rgb(data, width, height, k)
            rh, rw = rgb.shape[:2]
        else:
            _draft(im, width, height, k)
            rw, rh = im.size
        sx, sy = rw / width, rh / height
        box = (p["left"] * sx, p["top"] * sy, (p["left"] + p["width"]) * sx,
               (p["top"] + p["height"]) * sy)
        mode = _mode(t)
        if rgb is not None:
            return _resize_box(rgb, box, (out_w, out_h), _RESAMPLE[mode], _SUPPORT[mode])
        return im.convert("RGB").resize((out_w, out_h), _RESAMPLE[mode], box=box)
    finally:
        im.close()
