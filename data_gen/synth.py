"""One synthetic-but-real JPEG: a crop of a photograph, varied in scale, colour and noise."""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image

from .sources import Source

ASPECTS = (4 / 3, 3 / 2, 1.0, 3 / 4, 2 / 3, 16 / 9, 5 / 4)


@dataclass(frozen=True)
class Encoded:
    data: bytes
    width: int
    height: int
    mode: str          # "RGB" or "L"
    subsampling: str   # "4:2:0", "4:4:4" or "gray"
    progressive: bool
    quality: int
    source: str


def make_jpeg(
    rng: np.random.Generator,
    sources: list[Source],
    label: int,
    width_range: tuple[int, int],
    quality_range: tuple[int, int],
) -> Encoded:
    """Render and encode one image. Deterministic given the generator's state."""
    # the class prefers one source and a tint, so a model can learn something from the labels
    si = label % len(sources) if rng.random() < 0.7 else int(rng.integers(len(sources)))
    name, src = sources[si]
    w = int(rng.integers(width_range[0], width_range[1] + 1))
    aspect = float(ASPECTS[int(rng.integers(len(ASPECTS)))])
    h = max(16, int(round(w / aspect)))

    sh, sw = src.shape[:2]
    area = rng.uniform(0.2, 1.0) * sh * sw
    cw = int(min(sw, round(np.sqrt(area * aspect))))
    ch = int(min(sh, round(cw / aspect)))
    cw = max(8, min(cw, sw))
    ch = max(8, ch)
    x0 = int(rng.integers(0, sw - cw + 1))
    y0 = int(rng.integers(0, sh - ch + 1))
    crop = Image.fromarray(src[y0 : y0 + ch, x0 : x0 + cw]).resize((w, h), Image.BICUBIC)
    if rng.random() < 0.5:
        crop = crop.transpose(Image.FLIP_LEFT_RIGHT)

    tint = np.random.default_rng(label).uniform(0.85, 1.15, 3)
    gain = rng.uniform(0.85, 1.15, 3) * tint
    gamma = rng.uniform(0.8, 1.25)
    # gain and gamma map each channel's 256 levels: a table of the same float64 values as the
    # per-pixel arithmetic, so the same bytes at a fraction of the cost on large photos
    levels = np.arange(256, dtype=np.float32) / 255.0
    table = np.clip(levels[:, None] * gain, 0, 1) ** gamma  # (256, 3) float64
    a = table[np.asarray(crop), np.arange(3)]
    sigma = rng.uniform(1.0, 7.0) / 255.0
    a += rng.normal(0.0, sigma, a.shape).astype(np.float32)
    np.clip(a, 0, 1, out=a)
    a *= 255
    a += 0.5
    img = Image.fromarray(a.astype(np.uint8))

    q = int(rng.integers(quality_range[0], quality_range[1] + 1))
    r = rng.random()
    kw = dict(quality=q, optimize=False)
    mode, sub, prog = "RGB", "4:2:0", False
    if r < 0.06:
        img, mode, sub = img.convert("L"), "L", "gray"
    elif r < 0.14:
        kw.update(progressive=True, subsampling=2)
        prog = True
    elif r < 0.26:
        kw.update(subsampling=0)
        sub = "4:4:4"
    else:
        kw.update(subsampling=2)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", **kw)
    return Encoded(buf.getvalue(), w, h, mode, sub, prog, q, name)
