"""Cheap byte-level checks of an image file, shared by every backend.

NOTE [bad files]
Every backend runs :func:`check_image_bytes` before decoding (the torch backends on the bytes
they read for every sample; DALI once per file, see ``pipelines.dali.source``), so "bad" means
the same thing everywhere: empty, not a JPEG/PNG/WebP/BMP, a truncated WebP or BMP (shorter
than its own header says); a JPEG with no end-of-image marker after its scan (truncated), with
stray bytes between its header segments or a marker inside its scan data that a decoder refuses
(NOTE [one verdict]), or a Huffman-coded one whose scan is too short for the pixels its header
claims (a forged or truncated header); a PNG with other than one IHDR chunk, or whose image data
is too short for its header even at deflate's best ratio, or inflates to fewer bytes than its
rows need; a header with a zero or bomb-sized (> ``max_pixels``) dimension. So the files that the
backends' decoders disagree on (found by ``python -m tools.fuzz``) are refused on every backend,
under ``error`` and ``skip`` alike (NOTE [one verdict]). The walk accepts fill bytes between
segments and data after the end-of-image marker. The torch backends also treat a decoder
exception as bad; DALI finds a file that fails inside its decoder by its recovery
(``pipelines.dali.loader`` NOTE [recovery]). ``python -m tools.fuzz`` checks that every backend
gives every file of its corpus one verdict.
"""
from __future__ import annotations

import struct
import zlib

import numpy as np

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

    Fill bytes (``0xFF``) before a marker are allowed. Anything else between segments (stray
    bytes, ``FF 00``, a marker with no length such as TEM or RSTn, a second SOI) is yielded as
    ``(offset, None)`` and ends the walk: libjpeg skips it with a warning, DALI's parser refuses
    the file, so the one verdict is "bad" (NOTE [one verdict]).
    """
    i = 2
    n = len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            yield i, None
            return
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01, 0x00) or 0xD0 <= marker <= 0xD7:
            yield i, None
            return
        yield i, marker
        if marker == 0xDA:
            return
        (seglen,) = struct.unpack(">H", data[i + 2 : i + 4])
        i += 2 + seglen


def _frame(data: bytes) -> tuple[int | None, int | None, int | None]:
    """``(SOF offset, SOS offset, stray offset)`` from one walk; the SOF is ``None`` when the
    scan comes first or the frame header is cut short, the SOS ``None`` when there is no scan,
    the stray offset that of bytes between segments that are no marker (``_segments``)."""
    sof = None
    for i, marker in _segments(data):
        if marker is None:
            return sof, None, i
        if marker == 0xDA:
            return sof, i, None
        if marker in _SOF and sof is None:
            sof = i if i + 10 <= len(data) else None
            if sof is None:
                return None, None, None
    return sof, None, None


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


# NOTE [one verdict]
# A file is bad for every backend or for none: the byte check refuses what any backend's decoder
# refuses, so the verdict does not depend on how tolerant the decoder is (issue 57). libjpeg
# (torchvision, PIL) skips stray bytes between header segments with a warning, where DALI's
# parser refuses the file; DALI's decoder decodes through a marker inside the scan data that
# libjpeg stops at ("Unsupported marker type", "Didn't expect more than one scan"). So the walk
# refuses both. The scan data is searched for markers vectorised in numpy (each 0xFF and the
# byte after it; a Python loop over them, or a regular expression, cost several times more):
# entropy-coded data holds 0xFF only as FF 00 (a stuffed byte) or FF D0..D7 (restart markers),
# so the first other marker ends the scan. After a progressive scan, or a sequential one that
# holds only some of the components, the tables and the next SOS follow, and are walked by
# their lengths; after the only scan of an image, the next marker must be EOI. Data after EOI
# (motion photos, MPF's second image) is allowed. ``python -m tools.fuzz`` measures that the
# verdicts agree; ``tools.microbench validate`` times the check.
_PROGRESSIVE = {0xC2, 0xC6, 0xCA, 0xCE}
# markers libjpeg reads between two scans: DHT, DAC, SOS, DQT, DNL, DRI, APPn, COM
_BETWEEN_SCANS = {0xC4, 0xCC, 0xDA, 0xDB, 0xDC, 0xDD, 0xFE, *range(0xE0, 0xF0)}


def _true_after(mask: np.ndarray, base: int):
    """``base +`` each index of a True in ``mask``, in order, found by ``argmax`` (which stops at
    the first True; ``nonzero`` over every element cost several times more), so a caller that
    stops early scans no further."""
    i, n = 0, len(mask)
    while i < n:
        k = i + int(mask[i:].argmax())
        if not mask[k]:
            return
        yield base + k
        i = k + 1


def _scans_end(data: bytes, sof: int, sos: int) -> int | str:
    """Offset of the EOI marker that ends the scans from ``sos`` on, ``-1`` when there is none
    (truncated), or why a marker among them is one the decoders disagree on (NOTE [one
    verdict])."""
    n = len(data)
    multi = data[sof + 1] in _PROGRESSIVE or (sos + 4 < n and sof + 9 < n
                                                and data[sos + 4] < data[sof + 9])
    start = sos + 4
    if start >= n - 1:
        return -1
    # every 0xFF followed by a byte that is not 00 (stuffed): the EOI, other markers, fill
    # bytes, and restart markers (left out here when a DRI segment says there are any)
    a = np.frombuffer(data, np.uint8, count=n - start, offset=start)
    nxt = a[1:]
    pairs = np.logical_and(a[:-1] == 0xFF, nxt.astype(bool))
    if data.find(b"\xff\xdd", 2, sos) >= 0:
        pairs &= (nxt & 0xF8) != 0xD0
    marks = _true_after(pairs, start)
    seg_end = sos + 2 + ((data[sos + 2] << 8) | data[sos + 3])  # the SOS header's end
    for i in marks:
        marker = data[i + 1]
        if i < seg_end or marker == 0xFF or 0xD0 <= marker <= 0xD7:
            continue  # inside a segment (an SOS header, a table), a fill byte, a restart
        if marker == 0xD9:
            return i
        if not multi:
            return (f"JPEG with marker FF{marker:02X} at offset {i} in the scan data of its "
                    "one scan (only EOI may end it)")
        if marker not in _BETWEEN_SCANS:
            return f"JPEG with marker FF{marker:02X} at offset {i} inside its scan data"
        if i + 4 > n:
            return -1
        seg_end = i + 2 + ((data[i + 2] << 8) | data[i + 3])
    return -1


# deflate cannot compress better than about 1032:1 (a stream of zeros at level 9)
_DEFLATE_MAX_RATIO = 1100
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def _png_problem(data: bytes) -> str | None:
    """Why a PNG's chunks cannot hold the image its header claims, or ``None``."""
    w, h = struct.unpack(">II", data[16:24])
    depth, ctype = data[24], data[25]
    if ctype not in _PNG_CHANNELS or depth not in (1, 2, 4, 8, 16):
        return f"PNG header with colour type {ctype} and bit depth {depth}"
    i, idat, ihdr, parts = 8, 0, 0, []
    while i + 8 <= len(data):
        (n,) = struct.unpack(">I", data[i:i + 4])
        kind = data[i + 4:i + 8]
        if kind == b"IDAT":
            idat += n
            parts.append(data[i + 8:i + 8 + n])
        ihdr += kind == b"IHDR"
        if kind == b"IEND":
            break
        i += 12 + n
    if ihdr != 1:  # PIL reads the first, DALI's parser refuses the file (NOTE [one verdict])
        return f"PNG with {ihdr} IHDR chunks (one expected)"
    raw = h * (1 + (w * _PNG_CHANNELS[ctype] * depth + 7) // 8)
    if idat * _DEFLATE_MAX_RATIO + 1024 < raw:
        return (f"truncated PNG: {idat} bytes of image data cannot hold {w}x{h} pixels "
                f"({raw} bytes decompressed)")
    if data[28] == 0:  # not interlaced: the rows are exactly ``raw`` bytes (PIL decodes fewer,
        # DALI refuses them); inflated, not decoded: no row filters, no pixels
        try:
            got = len(zlib.decompressobj().decompress(b"".join(parts), raw))
        except zlib.error as e:
            return f"PNG with corrupt image data ({e})"
        if got < raw:
            return (f"truncated PNG: its image data inflates to {got} bytes of the {raw} that "
                    f"{w}x{h} pixels need")
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
        sof, sos, stray = _frame(data)
        if stray is not None:
            return (f"JPEG with bytes that are no marker at offset {stray}, between its "
                    "header segments")
        if sof is None:
            return "JPEG without a frame header (SOF)"
        h, w = struct.unpack(">HH", data[sof + 5 : sof + 9])
        if sos is None:
            return "truncated JPEG (no start of scan)"
        end = _scans_end(data, sof, sos)
        if end == -1:
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
    if isinstance(end, str):
        return end
    eoi = end
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
