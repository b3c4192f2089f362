"""The mutations: one change to the bytes of a valid JPEG or PNG, with a short description.

``mutate`` draws a kind of ``MUTATIONS`` by weight; ``mutate_kind`` can force one. The kinds that
aim at a structure (header bit flips, segment or chunk duplication, dimension edits) find it with
walkers of their own (JPEG marker segments up to the scan, PNG chunks), not the validator's.
"""
from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence

import numpy as np

_PNG_SIG = b"\x89PNG\r\n\x1a\n"
_JPEG_NAMES = {0xC0: "SOF0", 0xC1: "SOF1", 0xC2: "SOF2", 0xC4: "DHT", 0xDA: "SOS", 0xDB: "DQT",
               0xDD: "DRI", 0xFE: "COM", **{0xE0 + k: f"APP{k}" for k in range(16)}}
_SOFS = (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF)


def _jpeg_segments(data: bytes) -> list[tuple[int, int, int]]:
    """``(offset, marker, length with the marker)`` of each segment of a valid JPEG up to and
    including the SOS header. A walker of its own: the fuzzer does not share the validator's."""
    out, i = [], 2
    while i + 4 <= len(data) and data[i] == 0xFF:
        m = data[i + 1]
        if m == 0xFF:
            i += 1
            continue
        (n,) = struct.unpack(">H", data[i + 2:i + 4])
        out.append((i, m, 2 + n))
        if m == 0xDA:
            break
        i += 2 + n
    return out


def _png_chunks(data: bytes) -> list[tuple[int, bytes, int]]:
    """``(offset, type, length with header and CRC)`` of each chunk of a valid PNG."""
    out, i = [], 8
    while i + 8 <= len(data):
        (n,) = struct.unpack(">I", data[i:i + 4])
        typ = data[i + 4:i + 8]
        out.append((i, typ, 12 + n))
        i += 12 + n
        if typ == b"IEND":
            break
    return out


def _is_png(data: bytes) -> bool:
    return data.startswith(_PNG_SIG)


def _header_end(data: bytes) -> int:
    """Where the headers end: the end of the JPEG's SOS header, the start of the first IDAT data."""
    if _is_png(data):
        return next((o + 8 for o, t, _ in _png_chunks(data) if t == b"IDAT"), len(data))
    segs = _jpeg_segments(data)
    return segs[-1][0] + segs[-1][2] if segs else len(data)


def _flip(data: bytes, rng, lo: int, hi: int) -> tuple[bytes, list[int]]:
    b = bytearray(data)
    k = int(rng.integers(1, 9))
    bits = rng.choice((hi - lo) * 8, size=min(k, (hi - lo) * 8), replace=False)
    offs = sorted({lo + int(x) // 8 for x in bits})
    for x in bits:
        b[lo + int(x) // 8] ^= 1 << (int(x) % 8)
    return bytes(b), offs


def _offs(prefix: str, offs: list[int]) -> str:
    return f"{prefix}@{offs[0]}" if len(offs) == 1 else \
        f"{prefix} x{len(offs)}@{','.join(map(str, offs))}"


def _m_bitflip(data: bytes, rng) -> tuple[bytes, str]:
    out, offs = _flip(data, rng, 0, len(data))
    return out, _offs("bitflip", offs)


def _segment_name(data: bytes, off: int) -> str:
    if _is_png(data):
        if off < 8:
            return "signature"
        return next((t.decode("latin-1") for o, t, n in _png_chunks(data) if o <= off < o + n), "?")
    if off < 2:
        return "SOI"
    return next((_JPEG_NAMES.get(m, f"FF{m:02X}") for o, m, n in _jpeg_segments(data)
                 if o <= off < o + n), "?")


def _m_header_bitflip(data: bytes, rng) -> tuple[bytes, str]:
    out, offs = _flip(data, rng, 0, _header_end(data))
    names = ",".join(dict.fromkeys(_segment_name(data, o) for o in offs))
    return out, _offs("header bitflip", offs) + f" ({names})"


def _m_truncate(data: bytes, rng) -> tuple[bytes, str]:
    cut = int(rng.integers(1, len(data)))
    return data[:cut], f"truncate@{cut / len(data):.2f} ({cut} of {len(data)} bytes)"


def _m_insert(data: bytes, rng) -> tuple[bytes, str]:
    n = int(rng.choice([1, 2, 4, int(rng.integers(1, 65))]))
    pos = int(rng.integers(0, len(data) + 1))
    fill = str(rng.choice(["random", "FF", "00"]))
    new = (rng.integers(0, 256, n, dtype=np.uint8).tobytes() if fill == "random"
           else bytes.fromhex(fill) * n)
    return data[:pos] + new + data[pos:], f"insert {n} bytes@{pos} ({fill})"


def _m_delete(data: bytes, rng) -> tuple[bytes, str]:
    n = int(rng.choice([1, 2, 4, int(rng.integers(1, 65))]))
    n = min(n, len(data) - 1)
    pos = int(rng.integers(0, len(data) - n + 1))
    return data[:pos] + data[pos + n:], f"delete {n} bytes@{pos}"


def _m_duplicate(data: bytes, rng) -> tuple[bytes, str]:
    if _is_png(data):
        o, t, n = _png_chunks(data)[int(rng.integers(0, len(_png_chunks(data))))]
        return data[:o + n] + data[o:o + n] + data[o + n:], f"duplicate chunk {t.decode('latin-1')}"
    segs = _jpeg_segments(data)
    o, m, n = segs[int(rng.integers(0, len(segs)))]
    return data[:o + n] + data[o:o + n] + data[o + n:], f"duplicate marker FF{m:02X}@{o}"


def _new_dim(rng, old: int, big: Sequence[int]) -> int:
    choices = [v for v in dict.fromkeys([0, 1, old // 2, old - 1, old + 1, old * 2, *big])
               if v != old and v >= 0]
    return int(rng.choice(choices))


def _m_dimension(data: bytes, rng) -> tuple[bytes, str]:
    axis = str(rng.choice(["width", "height"]))
    b = bytearray(data)
    if _is_png(data):  # IHDR: width at 16, height at 20, CRC at 29
        at = 16 if axis == "width" else 20
        (old,) = struct.unpack(">I", data[at:at + 4])
        new = _new_dim(rng, old, [9000, 65535, 100_000, 2**31 - 1])
        b[at:at + 4] = struct.pack(">I", new)
        fix = bool(rng.random() < 0.75)
        if fix:
            b[29:33] = struct.pack(">I", zlib.crc32(bytes(b[12:29])))
        return bytes(b), f"PNG {axis} {new} (IHDR{'' if fix else ', stale CRC'})"
    o, m, _ = next(s for s in _jpeg_segments(data) if s[1] in _SOFS)
    at = o + (7 if axis == "width" else 5)
    (old,) = struct.unpack(">H", data[at:at + 2])
    new = _new_dim(rng, old, [9000, 65535])
    b[at:at + 2] = struct.pack(">H", new)
    return bytes(b), f"{axis} {new} ({_JPEG_NAMES.get(m, 'SOF')})"


def _m_trailing(data: bytes, rng) -> tuple[bytes, str]:
    what = str(rng.choice(["random", "zeros", "FF", "copy"]))
    if what == "copy":
        return data + data, f"trailing copy of the image ({len(data)} bytes)"
    n = int(rng.choice([1, 17, 1024, 4096, 65536]))
    tail = (rng.integers(0, 256, n, dtype=np.uint8).tobytes() if what == "random"
            else (b"\0" if what == "zeros" else b"\xff") * n)
    size = f"{n // 1024} KiB" if n >= 1024 else f"{n} bytes"
    return data + tail, f"trailing {size} {what}"


# kind -> (mutator, weight)
MUTATIONS: dict[str, tuple[Callable, float]] = {
    "bitflip": (_m_bitflip, 0.2),
    "header bitflip": (_m_header_bitflip, 0.2),
    "truncate": (_m_truncate, 0.12),
    "insert": (_m_insert, 0.1),
    "delete": (_m_delete, 0.1),
    "duplicate": (_m_duplicate, 0.1),
    "dimension": (_m_dimension, 0.1),
    "trailing": (_m_trailing, 0.08),
}


def mutate_kind(data: bytes, rng: np.random.Generator, kind: str | None = None
                ) -> tuple[bytes, str, str]:
    """:func:`mutate`, also returning the mutation kind (a key of ``MUTATIONS``).

    Args:
        data: a valid JPEG or PNG.
        rng: the generator every choice is drawn from.
        kind: force one kind (default: drawn with the ``MUTATIONS`` weights).
    """
    if not (data.startswith(b"\xff\xd8") or _is_png(data)) or len(data) < 64:
        raise ValueError(f"data ({len(data)} bytes, starts with {data[:8]!r}) must be a valid "
                         "JPEG or PNG")
    kinds = list(MUTATIONS)
    if kind is None:
        w = np.array([MUTATIONS[k][1] for k in kinds])
        kind = kinds[int(rng.choice(len(kinds), p=w / w.sum()))]
    elif kind not in MUTATIONS:
        raise ValueError(f"kind={kind!r} is unknown; choose one of {kinds}")
    out, desc = MUTATIONS[kind][0](data, rng)
    return out, desc, kind


def mutate(data: bytes, rng: np.random.Generator) -> tuple[bytes, str]:
    """Apply one mutation to a valid JPEG or PNG.

    Kinds (``MUTATIONS``): 1-8 bit flips anywhere or only in the headers before the scan,
    truncation, byte insertion and deletion, marker-segment (PNG: chunk) duplication, header
    dimension edits (JPEG SOF, PNG IHDR with a fixed or stale CRC) and trailing data.

    Example:
        >>> mutate(jpeg_bytes, np.random.default_rng(3))[1]   # doctest: +SKIP
        'height 9000 (SOF0)'

    Returns:
        ``(new bytes, short description)``, e.g. ``"bitflip@1234"``, ``"truncate@0.63 (...)"``,
        ``"insert 5 bytes@300 (random)"``, ``"duplicate marker FFC4@178"``.
    """
    out, desc, _ = mutate_kind(data, rng)
    return out, desc
