"""Source photographs for the generator: scikit-image's bundled photos, or procedural fallbacks."""
from __future__ import annotations

import sys

import numpy as np

# Photos that scikit-image ships inside its wheel (no download needed).
COLOR_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field",
                "immunohistochemistry", "retina")
GRAY_PHOTOS = ("camera", "coins", "moon", "brick", "grass", "gravel")

Source = tuple[str, np.ndarray]


def load_photos() -> list[Source]:
    """Return ``(name, HxWx3 uint8)`` for every bundled photo that loads offline."""
    try:
        import skimage.data as d
    except ImportError:
        return []
    out: list[Source] = []
    for name in COLOR_PHOTOS + GRAY_PHOTOS:
        try:
            a = np.asarray(getattr(d, name)())
        except Exception:  # missing optional data (pooch) or a renamed photo
            continue
        if a.dtype != np.uint8:
            continue
        if a.ndim == 2:
            a = np.repeat(a[:, :, None], 3, axis=2)
        out.append((name, np.ascontiguousarray(a[:, :, :3])))
    return out


def procedural(n: int = 8, size: int = 768, seed: int = 1234) -> list[Source]:
    """Fallback sources: smooth colour fields with edges and texture (not photographs)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    out = []
    for k in range(n):
        img = np.zeros((size, size, 3), np.float32)
        for c in range(3):
            f = rng.uniform(1, 6, 2)
            ph = rng.uniform(0, 6.28, 2)
            img[..., c] = 0.5 + 0.25 * np.sin(6.28 * f[0] * xx + ph[0]) * np.cos(6.28 * f[1] * yy + ph[1])
        for _ in range(12):  # random discs and boxes give edges
            cx, cy, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.03, 0.2)
            mask = (xx - cx) ** 2 + (yy - cy) ** 2 < r * r
            img[mask] = rng.uniform(0, 1, 3)
        img += rng.normal(0, 0.04, img.shape).astype(np.float32)
        out.append((f"procedural{k}", (np.clip(img, 0, 1) * 255).astype(np.uint8)))
    return out


def load_sources(verbose: bool = True) -> list[Source]:
    """Photos when available, else procedural images with a notice on stderr."""
    photos = load_photos()
    if photos:
        return photos
    if verbose:
        print("data_gen: scikit-image photos are unavailable; using procedural images instead "
              "(install scikit-image for real photographs)", file=sys.stderr)
    return procedural()
