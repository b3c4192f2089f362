"""torchvision's ``TrivialAugmentWide``, ``RandAugment`` and ``AutoAugment`` as DALI graphs: their
ops, their magnitudes and their draws.

NOTE [what matches torchvision]
The op list, the magnitude of each bin (read from torchvision's own ``_AUGMENTATION_SPACE``, so
translations scale with the image size as RandAugment's and AutoAugment's do), the draws (one op
and one bin per image for TrivialAugmentWide; ``num_ops`` ops at a fixed bin for RandAugment;
a sub-policy, then each of its ops with its probability, for AutoAugment's policies, read from
torchvision) and the sign flip with probability 0.5 for signed ops are torchvision's. DALI's own
``nvidia.dali.auto_aug`` suite differs (brightness, contrast and colour from 0.01, a fill of
128, linear warps by default, shear about the image centre, posterize 8 to 2 bits by another
rule), so the ops here are built from DALI primitives to compute what torchvision's uint8
kernels compute; only the selection (``apply_trivial_augment``, conditional execution) is
DALI's.

* ShearX/Y, TranslateX/Y, Rotate: ``warp_affine`` with torchvision's inverse matrices (shear
  about the top-left corner, translation by ``int(magnitude)`` pixels, rotation about the
  centre), the same interpolation, fill 0 by default. With nearest sampling a pixel may differ
  where a sample point falls exactly between two pixels (torchvision rounds half to even, DALI
  takes the pixel that holds the point).
* Brightness, Color, Contrast: torchvision's uint8 blends (with zero, the floored grey, the
  mean of the floored grey), clamped and truncated.
* Sharpness: the 13-weight smoothing kernel, rounded, blended in the interior; the 1-pixel
  border kept, as torchvision keeps it.
* Posterize, Solarize, AutoContrast, Invert: torchvision's formulas.
* Equalize: DALI's ``equalize``, which is OpenCV's ``equalizeHist`` exactly
  (``round((cdf - cdf_min) * 255 / (N - cdf_min))`` per channel), not torchvision's PIL-style
  lookup table: the one op whose output differs beyond rounding, by tens of levels
  (``tests/test_autoaug.py`` measures it).
"""
from __future__ import annotations

import math

import numpy as np
from nvidia.dali import fn, types
from nvidia.dali import math as dmath
from nvidia.dali.auto_aug import auto_augment as _aa
from nvidia.dali.auto_aug.core import Policy, augmentation, select, signed_bin

from pipelines.dali import draws
from pipelines.dali.colour import grey
from pipelines.dali.geometry import WARP_INTERP as INTERP
from pipelines.dali.geometry import as_float as _float
from pipelines.dali.geometry import image_hw as _hw
from pipelines.dali.geometry import round_half_even
from pipelines.dali.geometry import vector as _vec
from pipelines.dali.geometry import warp as _warp
from pipelines.transforms.migrate import Op

# DALI >= 1.35: fn.filter; the fallbacks are older DALI's, absent from the stubs of newer ones
_filter = getattr(fn, "filter", None) or fn.experimental.filter  # type: ignore[attr-defined]
_equalize = getattr(fn, "equalize", None) or fn.experimental.equalize  # type: ignore[attr-defined]


def _u8(x):
    """A float image clamped to 0..255 and truncated, as torchvision's ``.to(torch.uint8)``."""
    return fn.cast(dmath.floor(dmath.clamp(x, 0.0, 255.0)), dtype=types.UINT8)



def tables(policy: str, num_bins: int, height: int = 0, width: int = 0) -> dict:
    """torchvision's own magnitude of every bin, per op, for the transform class ``policy``
    (its ``_AUGMENTATION_SPACE``: float32 ``linspace``s, posterize's bits, translations as a
    share of ``height`` / ``width``), so each bin's value is the one torchvision uses."""
    from torchvision.transforms import v2

    space = getattr(v2, policy)._AUGMENTATION_SPACE
    return {name: (f(num_bins, height, width), signed) for name, (f, signed) in space.items()}


def suite(tab: dict, interp, fill: float | None) -> dict:
    """The augmentations of ``tab`` (``tables``), by torchvision's names, in its order. Each
    magnitude op's DALI magnitude is its bin index (``mag_range=(0, bins - 1)``, negated for a
    negative sign); its parameter is torchvision's table at that bin."""
    sized = [v for v, _ in tab.values() if v is not None]
    top = float(len(sized[0]) - 1) if sized else 0.0

    def at(name: str, then=float):
        values = tab[name][0]

        def param(m):
            v = then(float(values[int(round(abs(float(m))))]))
            return np.float32(-v if np.signbit(m) else v)
        return param

    def mag(name: str, then=float, device="cpu"):
        return augmentation(mag_range=(0.0, top), randomly_negate=tab[name][1],
                            mag_to_param=at(name, then), param_device=device)

    @augmentation
    def identity(data, _):
        return data

    @mag("ShearX")
    def shear_x(data, m):
        return _warp(data, 1.0, m, 0.0, 0.0, 1.0, 0.0, interp, fill)

    @mag("ShearY")
    def shear_y(data, m):
        return _warp(data, 1.0, 0.0, 0.0, m, 1.0, 0.0, interp, fill)

    @mag("TranslateX", then=math.trunc)  # torchvision's int(magnitude): towards zero
    def translate_x(data, t):
        return _warp(data, 1.0, 0.0, t * -1.0, 0.0, 1.0, 0.0, interp, fill)

    @mag("TranslateY", then=math.trunc)
    def translate_y(data, t):
        return _warp(data, 1.0, 0.0, 0.0, 0.0, 1.0, t * -1.0, interp, fill)

    @mag("Rotate")
    def rotate(data, angle):
        h, w = _hw(data)
        r = angle * (math.pi / 180.0)
        cos, sin = dmath.cos(r), dmath.sin(r)
        cx, cy = w * 0.5, h * 0.5
        return _warp(data, cos, -sin, cx - cos * cx + sin * cy,
                     sin, cos, cy - sin * cx - cos * cy, interp, fill)

    @mag("Brightness", device="auto")
    def brightness(data, m):
        return _u8(_float(data) * (1.0 + m))

    @mag("Color", device="auto")
    def color(data, m):
        x = _float(data)
        f = 1.0 + m
        return _u8(x * f + dmath.floor(grey(x)) * (1.0 - f))

    @mag("Contrast", device="auto")
    def contrast(data, m):
        x = _float(data)
        f = 1.0 + m
        return _u8(x * f + fn.reductions.mean(dmath.floor(grey(x))) * (1.0 - f))

    kernel = np.ones((3, 3), np.float32)
    kernel[1, 1] = 5.0
    kernel /= kernel.sum()

    @mag("Sharpness", device="auto")
    def sharpness(data, m):
        x = _float(data)
        blur = round_half_even(_filter(data, kernel, dtype=types.FLOAT))
        h, w = _hw(data)
        inner = fn.erase(x * 0.0 + 1.0, axis_names="HW", fill_value=0.0,  # 0 on the border
                         anchor=_vec(0.0, 0.0, h - 1.0, 0.0, 0.0, 0.0, 0.0, w - 1.0),
                         shape=_vec(1.0, w, 1.0, w, h, 1.0, h, 1.0))
        return _u8(x + (blur - x) * (m * -1.0 * inner))  # x + (1 - f) (blur - x) inside

    def mask(bits: float) -> int:
        b = int(bits)
        return ((1 << b) - 1) << (8 - b)

    @augmentation(mag_range=(0.0, top), param_device="auto",
                  mag_to_param=lambda m: np.uint8(at("Posterize", mask)(m)))
    def posterize(data, bitmask):
        return data & bitmask

    @mag("Solarize", then=lambda v: 255.0 * v, device="auto")
    def solarize(data, threshold):
        x = _float(data)
        return fn.cast(x + (255.0 - 2.0 * x) * _float(x >= threshold), dtype=types.UINT8)

    @augmentation
    def auto_contrast(data, _):
        x = _float(data)
        lo = fn.reductions.min(x, axes=[0, 1], keep_dims=True)
        hi = fn.reductions.max(x, axes=[0, 1], keep_dims=True)
        same = _float(hi == lo)
        lo = lo * (1.0 - same)
        scale = (hi - lo) * (1.0 - same) * (1.0 / 255.0) + same
        return _u8((x - lo) / scale)

    @augmentation
    def equalize(data, _):
        return _equalize(data)

    @augmentation
    def invert(data, _):
        return fn.cast(255.0 - _float(data), dtype=types.UINT8)

    every = {"Identity": identity, "ShearX": shear_x, "ShearY": shear_y,
             "TranslateX": translate_x, "TranslateY": translate_y, "Rotate": rotate,
             "Brightness": brightness, "Color": color, "Contrast": contrast,
             "Sharpness": sharpness, "Posterize": posterize, "Solarize": solarize,
             "AutoContrast": auto_contrast, "Equalize": equalize, "Invert": invert}
    return {name: every[name] for name in tab}


def _suite(op: Op, policy: str, bins: int) -> dict:
    h, w = op["size"] or (0, 0)
    fill = None if op["fill"] is None else float(op["fill"])
    return suite(tables(policy, bins, h, w), INTERP[op["interp"]], fill)


def _sign(augs, bins, shape=None):
    """``bins`` with a fed random sign for the ops that negate (torchvision: probability 0.5)."""
    if not any(a.randomly_negate for a in augs):
        return bins
    sign = fn.cast(draws.uniform(0.0, 1.0, shape) < 0.5, dtype=types.INT32)
    return signed_bin(bins, random_sign=sign)


def trivial_augment(images, op: Op):
    """``TrivialAugmentWide(num_magnitude_bins, interpolation, fill)`` on uint8 HWC images
    (module NOTE): one op, bin and sign per image, torchvision's own draws for the sample
    (``pipelines.transforms.draws``); the pipeline runs with conditional execution
    (``pipelines.dali.graph``)."""
    bins = op["bins"]
    h, w = op["size"] or (0, 0)
    tab = tables("TrivialAugmentWide", bins, h, w)
    augs = list(_suite(op, "TrivialAugmentWide", bins).values())
    op_idx, mag, neg = draws.trivial(bins, [tab[n][0] is not None for n in tab],
                                     [bool(tab[n][1]) for n in tab])
    if any(a.randomly_negate for a in augs):
        mag = signed_bin(mag, random_sign=neg)
    return select(augs, op_idx, data=images, magnitude_bin=mag, num_magnitude_bins=bins)


def rand_augment(images, op: Op):
    """``RandAugment(num_ops, magnitude, num_magnitude_bins, interpolation, fill)`` on uint8
    HWC images of the fixed size ``op["size"]`` (its translations scale with it): ``num_ops``
    ops per image at the fixed bin, drawn from the fed row."""
    bins, n = op["bins"], op["num_ops"]
    if n == 0:
        return images
    augs = list(_suite(op, "RandAugment", bins).values())
    shape = None if n == 1 else [n]
    op_idx = draws.integer(len(augs), shape)
    mag = _sign(augs, op["magnitude"], shape)
    for k in range(n):
        images = select(augs, op_idx if n == 1 else op_idx[k], data=images,
                        magnitude_bin=mag if n == 1 or mag is op["magnitude"] else mag[k],
                        num_magnitude_bins=bins)
    return images


def auto_augment(images, op: Op):
    """``AutoAugment(policy, interpolation, fill)`` on uint8 HWC images of the fixed size
    ``op["size"]``: torchvision's sub-policies of that policy, over its 10 magnitude bins; the
    sub-policy, each op's coin and the signs from the fed row."""
    from torchvision.transforms import v2

    augs = _suite(op, "AutoAugment", 10)
    subs = [[(augs[name], float(p), m) for name, p, m in sub]
            for sub in v2.AutoAugment(v2.AutoAugmentPolicy(op["policy"]))._policies]
    policy = Policy(f"torchvision-{op['policy']}", 10, subs)
    longest = max(len(sub) for sub in policy.sub_policies)
    run = draws.uniform(0.0, 1.0, [longest])
    sub_id = draws.integer(len(policy.sub_policies))
    probs = _aa._sub_policy_to_probability_map(policy)[sub_id]
    mags = _sign(list(policy.augmentations.values()),
                 _aa._sub_policy_to_magnitude_bin_map(policy)[sub_id], [longest])
    aug_ids, stages = _aa._sub_policy_to_augmentation_map(policy)
    aug_ids = aug_ids[sub_id]
    for k in range(longest):
        if run[k] < probs[k]:
            images = select(stages[k], aug_ids[k], data=images, magnitude_bin=mags[k],
                            num_magnitude_bins=policy.num_magnitude_bins)
    return images
