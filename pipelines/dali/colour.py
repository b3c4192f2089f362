"""torchvision's colour transforms on uint8 images as DALI ops, computed as its uint8 kernels;
``GaussianBlur``; the per-channel value map of the float conversions (``affine``).

The ``(images, op)`` builders are named by the op registry's entries
(``pipelines.transforms.migrate.translate``, ``pipelines.transforms.migrate.ops``).
"""
from __future__ import annotations

import numpy as np
from nvidia.dali import fn, types
from nvidia.dali import math as dmath

from pipelines.dali import draws
from pipelines.dali.geometry import uniform
from pipelines.transforms.migrate import Op


def affine(images, op: Op):
    """``x -> scale * x + shift`` per channel, to float (a float conversion, ``Normalize``)."""
    a, b = op["scale"], op["shift"]
    return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="HWC",
                                    mean=[-b[c] / a[c] for c in range(3)],
                                    std=[1.0 / a[c] for c in range(3)])


def grayscale(images, op: Op):
    """torchvision's ``RandomGrayscale`` on uint8 images: with probability ``p`` every channel
    becomes the grey, truncated to uint8."""
    x = fn.cast(images, dtype=types.FLOAT)
    coin = near(images, draws.coin(op["p"]))
    x = x + (dmath.floor(grey(x)) - x) * coin  # torchvision truncates the grey to uint8
    return fn.cast(x, dtype=types.UINT8)


def gaussian_blur(images, op: Op):
    """``GaussianBlur``: the op's ``(kh, kw)`` window, sigma uniform over its range."""
    return fn.gaussian_blur(images, window_size=list(op["kernel"]), sigma=uniform(op["sigma"]))


def grey(x):
    """torchvision's luma of float HWC images, ``H x W x 1``."""
    return x[:, :, 0:1] * 0.2989 + x[:, :, 1:2] * 0.587 + x[:, :, 2:3] * 0.114


def color_jitter(images, op: Op):
    """torchvision's ``ColorJitter`` on uint8 images, as its uint8 kernels compute it: each
    adjustment on floats, clamped to 0..255 and truncated to uint8 (brightness ``f * x``;
    contrast and saturation blends with the floored grey, its image mean for contrast; hue a
    shift in HSV). DALI's own ``brightness_contrast`` / ``hsv`` pivot on mid-grey and rotate hue
    in YIQ, up to 90/255 apart. The order is fixed (torchvision draws one per image)."""
    b, c, s, h = op["brightness"], op["contrast"], op["saturation"], op["hue"]
    x = fn.cast(images, dtype=types.FLOAT)
    for rng, mix in ((b, None), (c, "mean"), (s, "grey")):
        if not rng:
            continue
        f = near(images, uniform(rng))
        if mix is None:
            x = x * f
        else:
            g = dmath.floor(grey(x))
            x = x * f + (fn.reductions.mean(g) if mix == "mean" else g) * (1.0 - f)
        x = dmath.floor(dmath.clamp(x, 0.0, 255.0))
    if h:
        x = hue(x, near(images, uniform(h)))
    return fn.cast(x, dtype=types.UINT8)


def hue(x, shift):
    """torchvision's ``adjust_hue`` on 0..255 floats: RGB -> HSV, ``h = (h + shift) mod 1``,
    back to RGB, then ``floor(v * 255.999)`` as its float -> uint8 conversion does."""
    y = x * (1.0 / 255.0)
    r, g, b = y[:, :, 0:1], y[:, :, 1:2], y[:, :, 2:3]
    maxc, minc = dmath.max(dmath.max(r, g), b), dmath.min(dmath.min(r, g), b)
    eq = fn.cast(maxc == minc, dtype=types.FLOAT)
    span = maxc - minc
    sat = span / (maxc + eq * (1.0 - maxc))
    div = span + eq * (1.0 - span)
    rc, gc, bc = (maxc - r) / div, (maxc - g) / div, (maxc - b) / div
    is_r = fn.cast(maxc == r, dtype=types.FLOAT)
    is_g = fn.cast(maxc == g, dtype=types.FLOAT) * (1.0 - is_r)
    is_b = (1.0 - is_r) * (1.0 - fn.cast(maxc == g, dtype=types.FLOAT))
    hue = ((bc - gc) * is_r + (rc + 2.0 - bc) * is_g + (gc + 4.0 - rc) * is_b) * (1.0 / 6.0)
    hue = hue + 1.0 + shift
    hue = hue - dmath.floor(hue)
    # HSV -> RGB as torchvision's sectors, per channel n = 5, 3, 1 (R, G, B):
    # v - v * s * clamp(min(k, 4 - k), 0, 1) with k = (n + 6 h) mod 6
    k = hue * 6.0 + types.Constant(np.array([5.0, 3.0, 1.0], dtype=np.float32))
    k = k - 6.0 * dmath.floor(k * (1.0 / 6.0))
    ramp = dmath.clamp(dmath.min(k, 4.0 - k), 0.0, 1.0)
    return dmath.floor((maxc - maxc * sat * ramp) * (256.0 - 1e-3))


def near(images, v):
    """``v`` (a per-sample CPU scalar or a float) on the device of ``images``."""
    return v.gpu() if images.device == "gpu" and not isinstance(v, float) else v
