"""Cheap byte-level checks of an image file, shared by every backend.

NOTE [bad files]
Every backend runs :func:`check_image_bytes` before decoding (the torch backends on the bytes
they read for every sample; DALI once per file, see ``pipelines.dali.source``), so "bad" means
the same thing everywhere: empty, not a JPEG/PNG/WebP/BMP, a truncated WebP or BMP (shorter
than its own header says), a JPEG with no end-of-image marker after its
scan (truncated), a Huffman-coded JPEG whose scan is too short for the pixels its header claims
(a forged or truncated header), a PNG whose image data is too short for its header even at
deflate's best ratio, a header with a zero or bomb-sized (> ``max_pixels``)
dimension. The walk accepts what libjpeg-turbo and PIL accept: fill and stray bytes between
segments, and data after the end-of-image marker. The torch backends also treat a decoder
exception as bad; DALI finds a file that fails inside its decoder by its recovery
(``pipelines.dali.loader`` NOTE [recovery]). Where the decoders themselves disagree on corrupt
data is listed in the README's "Bad files" section, measured by ``python -m tools.fuzz``.
"""
from __future__ import annotations

import struct

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


def _segments(data: bytes):
    """Yield ``(offset, marker)`` of each marker segment before the first scan, then the SOS.

    Walks as libjpeg's ``next_marker`` does: fill bytes (``0xFF``) before a marker are allowed,
    and stray bytes between segments are skipped (libjpeg warns "extraneous bytes" and goes on).
    """
    i = 2
    n = len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:  # stray bytes between segments: find the next marker
            j = data.find(b"\xff", i)
            if j < 0:
                return
            i = j
            continue
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01, 0x00) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        yield i, marker
        if marker == 0xDA:
            return
        (seglen,) = struct.unpack(">H", data[i + 2 : i + 4])
        i += 2 + seglen


def _frame(data: bytes) -> tuple[int | None, int | None]:
    """``(SOF offset, SOS offset)`` from one walk; the SOF is ``None`` when the scan comes first
    or the frame header is cut short, the SOS ``None`` when there is no scan."""
    sof = None
    for i, marker in _segments(data):
        if marker == 0xDA:
            return sof, i
        if marker in _SOF and sof is None:
            sof = i if i + 10 <= len(data) else None
            if sof is None:
                return None, None
    return sof, None


def sof_offset(data: bytes) -> int | None:
    """Offset of the first SOF marker segment, or ``None`` if there is none before the scan."""
    return _frame(data)[0]


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` from the first SOF segment, or ``None`` if none is found."""
    i = sof_offset(data)
    if i is None:
        return None
    h, w = struct.unpack(">HH", data[i + 5 : i + 9])
    return w, h


def _min_scan_bytes(data: bytes, sof: int, w: int, h: int) -> int:
    """A lower bound on the entropy-coded bytes of a Huffman-coded JPEG: every 8x8 block of the
    first component needs at least one bit (its DC difference code). Arithmetic-coded JPEGs
    and hierarchical ones have no such bound: 0."""
    if data[sof + 1] not in (0xC0, 0xC1, 0xC2, 0xC3):
        return 0
    return ((w + 7) // 8) * ((h + 7) // 8) // 8


# deflate cannot compress better than about 1032:1 (a stream of zeros at level 9)
_DEFLATE_MAX_RATIO = 1100
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def _png_problem(data: bytes) -> str | None:
    """Why a PNG's chunks cannot hold the image its header claims, or ``None``."""
    w, h = struct.unpack(">II", data[16:24])
    depth, ctype = data[24], data[25]
    if ctype not in _PNG_CHANNELS or depth not in (1, 2, 4, 8, 16):
        return f"PNG header with colour type {ctype} and bit depth {depth}"
    i, idat = 8, 0
    while i + 8 <= len(data):
        (n,) = struct.unpack(">I", data[i:i + 4])
        kind = data[i + 4:i + 8]
        if kind == b"IDAT":
            idat += n
        if kind == b"IEND":
            break
        i += 12 + n
    raw = h * (1 + (w * _PNG_CHANNELS[ctype] * depth + 7) // 8)
    if idat * _DEFLATE_MAX_RATIO + 1024 < raw:
        return (f"truncated PNG: {idat} bytes of image data cannot hold {w}x{h} pixels "
                f"({raw} bytes decompressed)")
    return None


def _webp(data: bytes) -> tuple[tuple[int, int] | None, str | None]:
    """``((w, h), None)`` of a WebP, or ``(None, why)``."""
    if len(data) < 30:
        return None, "truncated WebP header"
    (riff,) = struct.unpack("<I", data[4:8])
    if 8 + riff > len(data):
        return None, f"truncated WebP: {len(data)} bytes of the {8 + riff} its header gives"
    chunk = data[12:16]
    if chunk == b"VP8X":
        return (1 + int.from_bytes(data[24:27], "little"),
                1 + int.from_bytes(data[27:30], "little")), None
    if chunk == b"VP8 ":
        w, h = struct.unpack("<HH", data[26:30])
        return (w & 0x3FFF, h & 0x3FFF), None
    if chunk == b"VP8L":
        (b,) = struct.unpack("<I", data[21:25])
        return ((b & 0x3FFF) + 1, ((b >> 14) & 0x3FFF) + 1), None
    return None, f"WebP with an unknown first chunk {chunk!r}"


def _bmp(data: bytes) -> tuple[tuple[int, int] | None, str | None]:
    """``((w, h), None)`` of a BMP, or ``(None, why)``."""
    if len(data) < 26:
        return None, "truncated BMP header"
    size, = struct.unpack("<I", data[2:6])
    w, h = struct.unpack("<ii", data[18:26])
    if size > len(data):
        return None, f"truncated BMP: {len(data)} bytes of the {size} its header gives"
    return (abs(w), abs(h)), None  # a negative height is a top-down bitmap


def check_image_bytes(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> str | None:
    """Return why ``data`` is not a usable image, or ``None`` when it looks fine."""
    if len(data) == 0:
        return "empty file (0 bytes)"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP" or data[:2] == b"BM":
        wh, why = (_webp if data[:4] == b"RIFF" else _bmp)(data)
        if why:
            return why
        assert wh is not None  # _webp and _bmp give a size whenever they give no reason
        w, h = wh
        if w == 0 or h == 0:
            return f"zero-sized image ({w}x{h})"
        if w * h > max_pixels:
            return f"decompression bomb: {w}x{h} = {w * h} pixels > max_pixels={max_pixels}"
        return None
    if data.startswith(JPEG_SOI):
        sof, sos = _frame(data)
        if sof is None:
            return "JPEG without a frame header (SOF)"
        h, w = struct.unpack(">HH", data[sof + 5 : sof + 9])
        if sos is None:
            return "truncated JPEG (no start of scan)"
        # 0xFF in scan data is always stuffed (FF 00), so the first FF D9 after the SOS ends
        # the image; data after it (motion photos, MPF's second image) is allowed. A file that
        # ends with FF D9 is taken as ending there without the search, which scans the whole
        # scan data holding the GIL: the torch backends check every sample they read, and
        # ``dali`` every file of its first epoch (pipelines.dali.source NOTE [validated once]).
        # The two differ only for a file that holds a second image after the first: then the
        # scan-size bound below is looser.
        eoi = (len(data) - 2 if data.endswith(b"\xff\xd9") and len(data) - 2 >= sos
               else data.find(b"\xff\xd9", sos))
        if eoi < 0:
            return "truncated JPEG (no end-of-image marker)"
    elif data.startswith(PNG_SIG):  # a PNG named .jpg: both decoders read it, so it is accepted
        if len(data) < 24:
            return "truncated PNG header"
        w, h = struct.unpack(">II", data[16:24])
    else:
        return f"not a JPEG, PNG, WebP or BMP (starts with {data[:8]!r})"
    if w == 0 or h == 0:
        return f"zero-sized image ({w}x{h})"
    if w * h > max_pixels:
        return f"decompression bomb: {w}x{h} = {w * h} pixels > max_pixels={max_pixels}"
    if data.startswith(PNG_SIG):
        return _png_problem(data)
    assert sof is not None and sos is not None  # a JPEG here: both were checked above
    if eoi - sos < _min_scan_bytes(data, sof, w, h):
        return (f"truncated JPEG: {eoi - sos} bytes of scan data cannot hold {w}x{h} pixels "
                f"(at least {_min_scan_bytes(data, sof, w, h)})")
    return None


def decoded_size(data: bytes) -> tuple[int, int] | None:
    """``(height, width)`` of the image ``data`` decodes to, its EXIF orientation applied (as
    every backend's decoder applies it), from the header; ``None`` if PIL cannot read it."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
            turned = im.format in ("JPEG", "WEBP", "PNG", "TIFF", "MPO") and \
                im.getexif().get(0x0112, 1) in (5, 6, 7, 8)
    except Exception:  # noqa: BLE001 - an unreadable header: the decoder reports the file
        return None
    return (w, h) if turned else (h, w)
