"""One photo's conversion, in a worker process: read, decode small, resize once, encode once.

NOTE [the per-photo path]
A JPEG is decoded at the largest DCT reduction (1/2, 1/4 or 1/8, PIL's ``Image.draft``) whose
image still covers ``OVERSAMPLE`` times the target size, so a 24 MP photo bound for a 512 px side
decodes at 1/4 of its width for a fraction of the work. The decoded image is resized once to the
target with an antialiased filter (``RESAMPLE``), turned upright by its EXIF orientation (as
every backend does when it loads a file, ``pipelines.torch_backend.decode.pil_image``) and
encoded once as a JPEG at ``quality`` with full-resolution chroma (4:4:4). Why twice the target
and 4:4:4: the DCT reduction alone (at 1x) and the chroma subsampling each cost about as much
fidelity as the whole budget of ``tests/test_convert.py``'s 224 px crop comparison; the
antialiased resize from twice the size does not. A photo whose longer side is already within
``max_side`` keeps its bytes (exact, and the fastest path): it is decoded at 1/8 only to prove
that it decodes. Other formats (PNG, WebP, ...) have no DCT reduction and are decoded in full.
"""
from __future__ import annotations

import io
import os
from dataclasses import dataclass

from PIL import Image

EXIF_ORIENTATION = 0x0112
RESAMPLE = Image.Resampling.LANCZOS
OVERSAMPLE = 2  # the DCT reduction keeps at least this many times the target size (NOTE)
# what a photo that cannot be read or decoded raises: it is counted and named, not a crash
UNREADABLE = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)


@dataclass(frozen=True)
class Where:
    """Where a sample's bytes are: the whole file ``path``, or ``size`` bytes at ``offset``
    of it (a tar shard's member) when ``offset >= 0``."""

    path: str
    offset: int = -1
    size: int = 0

    def read(self) -> bytes:
        if self.offset < 0:
            with open(self.path, "rb") as f:
                return f.read()
        fd = os.open(self.path, os.O_RDONLY)
        try:
            data = os.pread(fd, self.size, self.offset)
        finally:
            os.close(fd)
        if len(data) != self.size:
            raise OSError(f"short read: {len(data)} of {self.size} bytes")
        return data


@dataclass(frozen=True)
class Done:
    """One photo's result: ``data`` and ``ext`` (``""`` and the reason in ``why`` when it
    failed), the source's size and pixels, the output's pixels, and whether it was resized."""

    index: int
    data: bytes
    ext: str
    why: str
    bytes_in: int
    pixels_in: int
    pixels_out: int
    resized: bool


def target_size(width: int, height: int, max_side: int) -> tuple[int, int]:
    """``(w, h)`` with the longer side ``max_side`` and the aspect ratio kept (each >= 1)."""
    scale = max_side / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def shrink(data: bytes, max_side: int, quality: int) -> tuple[bytes, str, int, int, bool]:
    """``(bytes, ext, pixels in, pixels out, resized)`` of one encoded image (module NOTE).

    Raises:
        One of ``UNREADABLE`` when the image does not open or decode.
    """
    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
        fmt = (im.format or "").lower()
        jpeg = fmt == "jpeg"
        if max(w, h) <= max_side:
            if jpeg:
                im.draft(im.mode if im.mode in ("RGB", "L") else None, (1, 1))
            im.load()  # proves it decodes; the bytes are kept as they are
            return data, _ext(fmt), w * h, w * h, False
        size = target_size(w, h, max_side)
        if jpeg:
            im.draft(im.mode if im.mode in ("RGB", "L") else None,
                     (size[0] * OVERSAMPLE, size[1] * OVERSAMPLE))
        im.load()
        img = im if im.mode in ("RGB", "L") else im.convert("RGB")
        small = _upright(img.resize(size, RESAMPLE, reducing_gap=3.0), im)
    out = io.BytesIO()
    small.save(out, "JPEG", quality=quality, subsampling=0)  # 4:4:4 (NOTE)
    return out.getvalue(), "jpg", w * h, size[0] * size[1], True


def _upright(small: Image.Image, src: Image.Image) -> Image.Image:
    """``small`` turned by ``src``'s EXIF orientation (``small`` carries no EXIF of its own)."""
    method = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
              4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
              6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
              8: Image.Transpose.ROTATE_90}.get(src.getexif().get(EXIF_ORIENTATION, 1))
    return small.transpose(method) if method is not None else small


def _ext(fmt: str) -> str:
    return {"jpeg": "jpg", "tiff": "tif"}.get(fmt, fmt or "jpg")


def convert_one(index: int, where: Where, max_side: int, quality: int) -> Done:
    """Read and shrink one sample; a file that cannot be read or decoded is a ``Done`` with
    its reason (``UNREADABLE``), never an exception."""
    try:
        data = where.read()
    except OSError as e:
        return Done(index, b"", "", f"cannot be read ({type(e).__name__}: {e})", 0, 0, 0, False)
    try:
        out, ext, px_in, px_out, resized = shrink(data, max_side, quality)
    except UNREADABLE as e:
        return Done(index, b"", "", f"does not decode ({type(e).__name__}: {e})", len(data),
                    0, 0, False)
    return Done(index, out, ext, "", len(data), px_in, px_out, resized)


def convert_chunk(task: tuple[list[int], list[Where], int, int]) -> list[Done]:
    """A worker's unit of work: several samples, so the pool's overhead is per chunk."""
    indices, wheres, max_side, quality = task
    return [convert_one(i, w, max_side, quality) for i, w in zip(indices, wheres)]
