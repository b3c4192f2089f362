"""Cheap byte-level checks of an image file, shared by every backend.

NOTE [bad files]
Every backend runs :func:`check_image_bytes` before decoding (the torch backends on the bytes
they read for every sample; DALI once per file, see ``pipelines.dali.source``), so "bad" means
the same thing everywhere: empty, not a JPEG/PNG, a JPEG with no end-of-image
marker (truncated), a header with a zero or bomb-sized (> ``max_pixels``) dimension. The torch
backends also treat a decoder exception as bad. DALI cannot skip a sample that passes these
checks but fails inside its decoder: that still raises, with DALI's message.
"""
from __future__ import annotations

import struct
from typing import Optional, Tuple

JPEG_SOI = b"\xff\xd8\xff"
PNG_SIG = b"\x89PNG\r\n\x1a\n"
# SOF markers: baseline, extended, progressive, lossless, arithmetic variants (not DHT/JPG/DAC).
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
DEFAULT_MAX_PIXELS = 89_478_485  # PIL's Image.MAX_IMAGE_PIXELS


class BadFileError(RuntimeError):
    """A file that is not a decodable image. The message names the file and the reason."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"bad image file {path!r}: {reason} "
                         "(LoaderConfig(on_bad_file='skip') skips and counts such files)")
        self.path = path
        self.reason = reason


def sof_offset(data: bytes) -> Optional[int]:
    """Offset of the first SOF marker segment, or ``None`` if there is none before the scan."""
    i = 2
    n = len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        (seglen,) = struct.unpack(">H", data[i + 2 : i + 4])
        if marker in _SOF:
            return i if i + 9 <= n else None
        if marker == 0xDA:  # start of scan before any SOF
            return None
        i += 2 + seglen
    return None


def jpeg_size(data: bytes) -> Optional[Tuple[int, int]]:
    """``(width, height)`` from the first SOF segment, or ``None`` if none is found."""
    i = sof_offset(data)
    if i is None:
        return None
    h, w = struct.unpack(">HH", data[i + 5 : i + 9])
    return w, h


def check_image_bytes(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> Optional[str]:
    """Return why ``data`` is not a usable image, or ``None`` when it looks fine."""
    if len(data) == 0:
        return "empty file (0 bytes)"
    if data.startswith(JPEG_SOI):
        if b"\xff\xd9" not in data[-64:]:
            return "truncated JPEG (no end-of-image marker)"
        size = jpeg_size(data)
        if size is None:
            return "JPEG without a frame header (SOF)"
        w, h = size
    elif data.startswith(PNG_SIG):  # a PNG named .jpg: both decoders read it, so it is accepted
        if len(data) < 24:
            return "truncated PNG header"
        w, h = struct.unpack(">II", data[16:24])
    else:
        return f"not a JPEG or PNG (starts with {data[:8]!r})"
    if w == 0 or h == 0:
        return f"zero-sized image ({w}x{h})"
    if w * h > max_pixels:
        return f"decompression bomb: {w}x{h} = {w * h} pixels > max_pixels={max_pixels}"
    return None
