"""``python -m data_gen --bad-inputs DIR``: problem files next to good ones.

``class_0000`` holds good generated JPEGs; ``class_0001`` holds the problem files (and a few good
ones). ``bad_manifest.json`` says, for each file, its kind and whether a loader must treat it as
``bad`` (skipped or raised) or ``valid`` (decoded to correct RGB by every backend).

The corpus is made like a dataset (NOTE [atomic output] in ``partial.py``): in a partial folder,
renamed into place, with a ``manifest.json`` of kind ``bad-inputs`` that lists every file,
problem files and ``bad_manifest.json`` included, so regenerating the folder removes them all.
"""
from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import numpy as np
from PIL import Image

from .generate import GenConfig, generate
from .outdir import Kind, Target

BAD_MANIFEST = "bad_manifest.json"


def _jpeg(img: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90, **kw)
    return buf.getvalue()


def halves(w: int = 96, h: int = 48) -> Image.Image:
    """Left half red, right half blue: orientation is visible after decoding."""
    a = np.zeros((h, w, 3), np.uint8)
    a[:, : w // 2] = (220, 30, 30)
    a[:, w // 2 :] = (30, 30, 220)
    return Image.fromarray(a)


def _sof_offset(data: bytes) -> int | None:
    """Offset of the first SOF (frame header) segment, or ``None`` if none comes before the scan."""
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length field
            i += 2
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return i if i + 9 <= len(data) else None
        if marker == 0xDA:  # start of scan
            return None
        i += 2 + struct.unpack(">H", data[i + 2 : i + 4])[0]
    return None


def _bomb(width: int = 30000, height: int = 30000) -> bytes:
    """A small JPEG whose frame header claims ``width x height`` pixels."""
    data = bytearray(_jpeg(Image.new("RGB", (16, 16), (90, 120, 150))))
    i = _sof_offset(bytes(data))
    data[i + 5 : i + 7] = height.to_bytes(2, "big")
    data[i + 7 : i + 9] = width.to_bytes(2, "big")
    return bytes(data)


def problem_files(good: bytes) -> dict[str, tuple]:
    """``name -> (bytes, expect, kind)``."""
    photo = Image.open(io.BytesIO(good)).convert("RGB")
    png = io.BytesIO()
    photo.save(png, format="PNG")
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    return {
        "truncated.jpg": (good[: len(good) * 6 // 10], "bad", "truncated JPEG"),
        "zero_bytes.jpg": (b"", "bad", "empty file"),
        "text_named.jpg": (b"this is not an image\n" * 20, "bad", "text file named .jpg"),
        "bomb.jpg": (_bomb(), "bad", "decompression bomb (30000x30000 header)"),
        "png_named.jpg": (png.getvalue(), "valid", "PNG named .jpg (content is sniffed)"),
        "cmyk.jpg": (_jpeg(photo.convert("CMYK")), "valid", "CMYK JPEG"),
        "grayscale.jpg": (_jpeg(photo.convert("L")), "valid", "grayscale JPEG"),
        "progressive.jpg": (_jpeg(photo, progressive=True), "valid", "progressive JPEG"),
        "exif_rotated.jpg": (_jpeg(halves(), exif=exif.tobytes()), "valid",
                             "EXIF orientation 6 (red left/blue right, displays red on top)"),
        "one_by_one.jpg": (_jpeg(Image.new("RGB", (1, 1), (10, 200, 10))), "valid", "1x1 image"),
    }


def make_bad_inputs(out: str | Path, good: int = 12, seed: int = 0, force: bool = False) -> dict:
    """Write the corpus into ``out``; returns (and writes) its ``bad_manifest.json``.

    Args:
        out: the folder.
        good: generated JPEGs in it, besides the problem files.
        seed: their seed.
        force: write beside files data_gen did not write, or replace a data_gen dataset.

    Raises:
        FileExistsError: ``out`` holds a data_gen dataset or files data_gen did not write, and
            ``force`` is not set.
        ValueError: the manifest already in ``out`` lists a path outside it.
        OSError: ``out`` cannot be written.
    """
    cfg = GenConfig(out=str(out), num_images=good, classes=2, seed=seed, width_range=(64, 160),
                    workers=1, force=force)
    manifest: dict = {}

    def corpus(folder: Path, images: list[dict]) -> dict[str, bytes]:
        first = (folder / min(f["path"] for f in images if f["label"] == 0)).read_bytes()
        files, blobs = {}, {}
        for name, (data, expect, kind) in problem_files(first).items():
            rel = f"class_0001/{name}"
            blobs[rel] = data
            files[rel] = {"expect": expect, "kind": kind, "bytes": len(data)}
        for f in images:
            files[f["path"]] = {"expect": "valid", "kind": "generated JPEG", "bytes": f["bytes"]}
        manifest.update(files=files,
                        bad=sorted(k for k, v in files.items() if v["expect"] == "bad"))
        blobs[BAD_MANIFEST] = json.dumps(manifest, indent=1).encode()
        return blobs

    generate(cfg, progress=False, kind=Kind.BAD_INPUTS, extra=corpus,
             target=Target.cli("--bad-inputs", out, force))
    return manifest
