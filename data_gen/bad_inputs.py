"""``python -m data_gen --bad-inputs DIR``: problem files next to good ones.

``class_0000`` holds good generated JPEGs; ``class_0001`` holds the problem files (and a few good
ones). ``bad_manifest.json`` says, for each file, its kind and whether a loader must treat it as
``bad`` (skipped or raised) or ``valid`` (decoded to correct RGB by every backend).
"""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Dict

import numpy as np
from PIL import Image

from .generate import GenConfig, generate

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


def _bomb(width: int = 30000, height: int = 30000) -> bytes:
    """A small JPEG whose frame header claims ``width x height`` pixels."""
    from pipelines.validate import sof_offset

    data = bytearray(_jpeg(Image.new("RGB", (16, 16), (90, 120, 150))))
    i = sof_offset(bytes(data))
    data[i + 5 : i + 7] = height.to_bytes(2, "big")
    data[i + 7 : i + 9] = width.to_bytes(2, "big")
    return bytes(data)


def problem_files(good: bytes) -> Dict[str, tuple]:
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


def make_bad_inputs(out: str | Path, good: int = 12, seed: int = 0, force: bool = False) -> Dict:
    """Write the corpus into ``out``; returns (and writes) its manifest."""
    out = Path(out)
    generate(GenConfig(out=str(out), num_images=good, classes=2, seed=seed,
                       width_range=(64, 160), workers=1, force=force), progress=False)
    first = sorted((out / "class_0000").glob("*.jpg"))[0].read_bytes()
    files = {}
    for name, (data, expect, kind) in problem_files(first).items():
        rel = f"class_0001/{name}"
        (out / rel).write_bytes(data)
        files[rel] = {"expect": expect, "kind": kind, "bytes": len(data)}
    for p in sorted(out.glob("class_*/img_*.jpg")):
        files[p.relative_to(out).as_posix()] = {"expect": "valid", "kind": "generated JPEG",
                                                "bytes": p.stat().st_size}
    manifest = {"files": files,
                "bad": sorted(k for k, v in files.items() if v["expect"] == "bad")}
    (out / BAD_MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest
