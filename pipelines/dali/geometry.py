"""torchvision's geometric transforms as DALI ops: resize, crops, flips, the random-resized-crop
window.

Each function reproduces torchvision's geometry (sizes, offsets, rounding, padding) on decoded
HWC images; the tolerances are those of ``pipelines.transforms.migrate.translate``. The ``(images, op)``
builders, ``decode_random_resized_crop`` and ``mirror`` are named by the op registry's entries
(``pipelines.transforms.migrate.translate``, ``pipelines.transforms.migrate.ops``).
"""
from __future__ import annotations

import math

import numpy as np
from nvidia.dali import fn, types
from nvidia.dali import math as dmath
from nvidia.dali.data_node import DataNode

from pipelines.dali import draws
from pipelines.transforms.migrate import Op

INTERP = {"linear": types.INTERP_LINEAR, "nn": types.INTERP_NN, "cubic": types.INTERP_CUBIC,
          "lanczos3": types.INTERP_LANCZOS3}


def uniform(lo_hi, shape=None):
    """Uniform over ``lo_hi`` from the fed row (``pipelines.dali.draws``)."""
    lo, hi = lo_hi
    return draws.uniform(lo, hi, shape)


def as_float(x):
    return fn.cast(x, dtype=types.FLOAT)


def image_hw(images):
    shp = images.shape()
    return as_float(shp[0]), as_float(shp[1])


def round_half_even(x):
    """Python's ``round`` (ties to even), as torchvision rounds crop sizes."""
    r = dmath.floor(x + 0.5)
    return r - ((r - x) == 0.5) * (r - 2.0 * dmath.floor(r * 0.5))


def rrc_window(shape, scale, ratio, attempts: int = 10):
    """torchvision's ``RandomResizedCrop`` window ``(start, shape)`` as ``[y, x]`` / ``[h, w]``.

    The same algorithm, vectorised over the 10 attempts: area ~ U(scale) * H * W, log aspect
    ratio ~ U(log ratio), sizes rounded half to even; the first attempt that fits wins, its
    offsets uniform over every position (``randint(0, H - h + 1)``); none fits: the central
    crop of the whole image with its aspect ratio clamped to ``ratio``. DALI's own generator
    puts that fallback at a random offset. About 90 per-sample CPU operators, so it runs only
    where the fallback matters (``pipelines.transforms.migrate.translate.rrc_window``).
    """
    H, W = as_float(shape[0]), as_float(shape[1])
    area = H * W * uniform(scale, [attempts])
    log_ar = uniform((math.log(ratio[0]), math.log(ratio[1])), [attempts])
    ar = math.exp(log_ar) if isinstance(log_ar, float) else dmath.exp(log_ar)
    w, h = round_half_even(dmath.sqrt(area * ar)), round_half_even(dmath.sqrt(area / ar))
    rank = ((w > 0.0) & (w <= W) & (h > 0.0) & (h <= H)) * types.Constant(
        np.arange(attempts, 0, -1, dtype=np.float32))
    best = fn.reductions.max(rank)
    first = rank == best
    found = best > 0.0
    lt, gt = (W / H) < ratio[0], (W / H) > ratio[1]
    ch = found * fn.reductions.sum(first * h) + (1 - found) * (H + lt * (round_half_even(W / ratio[0]) - H))
    cw = found * fn.reductions.sum(first * w) + (1 - found) * (W + gt * (round_half_even(H * ratio[1]) - W))
    u = draws.uniform(0.0, 1.0, [2])
    y = found * dmath.min(dmath.floor(u[0] * (H - ch + 1.0)), H - ch) \
        + (1 - found) * dmath.floor((H - ch) * 0.5)
    x = found * dmath.min(dmath.floor(u[1] * (W - cw + 1.0)), W - cw) \
        + (1 - found) * dmath.floor((W - cw) * 0.5)
    return fn.stack(y, x), fn.stack(ch, cw)


def fed(op: Op, which: str):
    """The op's size: fed with each sample when the op says so (``("fed", which)``:
    ``AugmentSpec``'s recipe, whose size ``set_resolution`` changes without a rebuild;
    ``pipelines.dali.draws.out_size``), else its own ``size``."""
    return draws.out_size(which) if dict(op.args).get("fed") == which else op["size"]


def resize(images, size, op: Op):
    """``images`` resized to ``size``: ``(h, w)``, or a fed ``[h, w]`` per sample."""
    return fn.resize(images, size=size if isinstance(size, DataNode) else list(size),
                     interp_type=INTERP[op["interp"]], antialias=op["antialias"])


def resize_fixed(images, op: Op):
    """``Resize`` to the op's ``(H, W)``."""
    return resize(images, op["size"], op)


def random_resized_crop(images, op: Op):
    """``RandomResizedCrop`` on decoded images (after other ops): torchvision's algorithm on
    the fed uniform numbers (``rrc_window``), sliced, then resized."""
    start, shape = rrc_window(images.shape(), op["scale"], op["ratio"])
    images = fn.slice(images, start, shape, axis_names="HW", normalized_anchor=False,
                      normalized_shape=False)
    return resize(images, fed(op, "hw"), op)


def decode_random_resized_crop(jpegs, op: Op, device: str, dec_kw: dict):
    """A leading ``RandomResizedCrop`` fused into the decoder: the window is drawn on the
    host as torchvision draws it (``pipelines.transforms.draws``), only it is decoded
    (``decoders.image_slice``), then resized."""
    start, shape = draws.window(op["scale"], op["ratio"])
    images = fn.decoders.image_slice(
        jpegs, start, shape, device=device, output_type=types.RGB, axis_names="HW",
        normalized_anchor=False, normalized_shape=False, **dec_kw)
    return resize(images, fed(op, "hw"), op)


def window_random_resized_crop(images, op: Op):
    """A leading ``RandomResizedCrop`` on an image decoded whole (``AugmentSpec.views`` > 1:
    every view crops the one decode): the window drawn on the host as
    :func:`decode_random_resized_crop` draws it, sliced, then resized."""
    start, shape = draws.window(op["scale"], op["ratio"])
    images = fn.slice(images, start, shape, axis_names="HW", normalized_anchor=False,
                      normalized_shape=False)
    return resize(images, fed(op, "hw"), op)


def flip(images, op: Op):
    """``RandomHorizontalFlip`` (``hflip``) or ``RandomVerticalFlip`` (``vflip``)."""
    coin = fn.cast(draws.coin(op["p"]), dtype=types.INT32)
    return fn.flip(images, horizontal=coin if op.kind == "hflip" else 0,
                   vertical=coin if op.kind == "vflip" else 0)


def mirror(op: Op):
    """A trailing ``hflip`` as ``crop_mirror_normalize``'s ``mirror`` argument."""
    return fn.cast(draws.coin(op["p"]), dtype=types.INT32)


def resize_shorter(images, op: Op):
    """torchvision's ``Resize(size, max_size=...)`` geometry for images of any size: the long
    side is truncated, ``int(size * long / short)``, then capped at ``max_size``. DALI's
    ``resize_shorter`` rounds instead, so the sizes are computed here in integers."""
    shp = images.shape()
    h = fn.cast(shp[0], dtype=types.INT64)
    w = fn.cast(shp[1], dtype=types.INT64)
    short, long = dmath.min(h, w), dmath.max(h, w)
    size, max_size = fed(op, "resize"), op["max_size"]
    if isinstance(size, DataNode):
        size = fn.cast(size, dtype=types.INT64)
    if size is None:
        new_short, new_long = (max_size * short) // long, long * 0 + max_size
    else:
        new_short, new_long = short * 0 + size, (size * long) // short
        if max_size is not None:
            over = fn.cast(new_long > max_size, dtype=types.INT64)
            new_short = over * ((max_size * new_short) // new_long) + (1 - over) * new_short
            new_long = over * max_size + (1 - over) * new_long
    w_short = fn.cast(w <= h, dtype=types.INT64)
    new_w = w_short * new_short + (1 - w_short) * new_long
    new_h = w_short * new_long + (1 - w_short) * new_short
    return fn.resize(images, resize_x=as_float(new_w), resize_y=as_float(new_h),
                     interp_type=INTERP[op["interp"]], antialias=op["antialias"])


def centre_crop(images, op: Op):
    """torchvision's ``CenterCrop`` to ``op["size"]``: offsets ``round((H - ch) / 2)`` with
    ties to even (DALI's ``crop_pos=0.5`` rounds ties up); an image smaller than the crop is
    padded with zeros, ``(ch - H) // 2`` rows on top, as torchvision pads. A fed size
    (``fed``) is one per sample."""
    size = fed(op, "hw")
    shp = images.shape()
    h = fn.cast(shp[0], dtype=types.INT64)
    w = fn.cast(shp[1], dtype=types.INT64)
    shape: DataNode | list[int]
    if isinstance(size, DataNode):
        ch, cw = fn.cast(size[0], dtype=types.INT64), fn.cast(size[1], dtype=types.INT64)
        shape = fn.cast(size, dtype=types.INT32)
    else:
        ch, cw = size
        shape = [ch, cw]

    def offset(k):  # round(k / 2) ties to even for k >= 0, -((-k) // 2) below (floor divisions
        kp, kn = dmath.max(k, 0), dmath.max(-k, 0)  # of non-negative numbers only)
        return kp // 2 + (kp + 1) // 4 - kp // 4 - kn // 2

    start = fn.stack(offset(h - ch), offset(w - cw))
    return fn.slice(images, start=fn.cast(start, dtype=types.INT32), shape=shape,
                    axis_names="HW", out_of_bounds_policy="pad", fill_values=0.0)


def padded(images, lrtb, mode: str, fill):
    """``images`` padded by ``(left, right, top, bottom)`` pixels (``mode``: DALI's
    out-of-bounds policy for torchvision's padding mode, ``fill`` per channel)."""
    l, r, t, b = lrtb
    H, W = image_hw(images)
    shape = fn.cast(fn.stack(H + (t + b), W + (l + r)), dtype=types.INT32)
    return fn.slice(images, start=np.array([-t, -l], np.int32), shape=shape, axis_names="HW",
                    out_of_bounds_policy=mode, fill_values=list(fill))


def pad(images, op: Op):
    """torchvision's ``Pad``."""
    return padded(images, op["padding"], op["mode"], op["fill"])


def random_crop(images, op: Op):
    """torchvision's ``RandomCrop``: pad by ``padding`` (and, with ``pad_if_needed``, by the
    missing size on both sides), then a crop at ``randint(0, padded - size + 1)``. Without
    ``pad_if_needed`` a crop larger than the (padded) image raises, as torchvision does."""
    ch, cw = op["size"]
    l, r, t, b = op["padding"] or (0, 0, 0, 0)
    mode, fill = op["mode"], list(op["fill"])
    if op["padding"] is not None and not op["pad_if_needed"]:
        images = padded(images, (l, r, t, b), mode, fill)
        l = r = t = b = 0
    H, W = image_hw(images)
    Hp, Wp = H + t + b, W + l + r
    if op["pad_if_needed"]:
        dh, dw = dmath.max(ch - Hp, 0.0), dmath.max(cw - Wp, 0.0)
        t, l, Hp, Wp = t + dh, l + dw, Hp + 2.0 * dh, Wp + 2.0 * dw
    u = draws.uniform(0.0, 1.0, [2])
    y = dmath.min(dmath.floor(u[0] * (Hp - ch + 1.0)), Hp - ch) - t
    x = dmath.min(dmath.floor(u[1] * (Wp - cw + 1.0)), Wp - cw) - l
    pad = op["pad_if_needed"]
    return fn.slice(images, start=fn.cast(fn.stack(y, x), dtype=types.INT32), shape=[ch, cw],
                    axis_names="HW", out_of_bounds_policy=mode if pad else "error",
                    fill_values=fill)


ERASE_ATTEMPTS = 3


def random_erase(images, op: Op):
    """torchvision's ``RandomErasing``: with probability ``p``, a box of area ``U(scale) * H * W``
    and aspect ratio ``exp(U(log ratio))`` (sides rounded half to even), placed uniformly over
    every position, filled with ``value`` (already in the images' value space, see
    ``pipelines.transforms.migrate.translate``). torchvision tries up to 10 draws for a box that fits
    inside the image; this tries ``ERASE_ATTEMPTS`` (NOTE [RandomErasing] there), and erases
    nothing when none fits, as torchvision does after its 10."""
    H, W = image_hw(images)
    lo, hi = op["ratio"]
    h_sel = w_sel = found = 0.0
    for _ in range(ERASE_ATTEMPTS):
        area = H * W * uniform(op["scale"])
        log_ar = uniform((math.log(lo), math.log(hi)))
        ar = math.exp(log_ar) if isinstance(log_ar, float) else dmath.exp(log_ar)
        h, w = round_half_even(dmath.sqrt(area * ar)), round_half_even(dmath.sqrt(area / ar))
        ok = as_float((h < H) & (w < W)) * (1.0 - found)
        h_sel, w_sel, found = h_sel + ok * h, w_sel + ok * w, found + ok
    coin = draws.coin(op["p"])
    h_sel, w_sel = h_sel * coin, w_sel * coin
    y = dmath.floor(draws.uniform(0.0, 1.0) * (H - h_sel + 1.0))
    x = dmath.floor(draws.uniform(0.0, 1.0) * (W - w_sel + 1.0))
    return fn.erase(images, anchor=fn.stack(y, x), shape=fn.stack(h_sel, w_sel),
                    axis_names="HW", fill_value=list(op["value"]))


WARP_INTERP = {"nearest": types.INTERP_NN, "bilinear": types.INTERP_LINEAR}  # torchvision's names


def vector(*vals):
    """A 1-D per-sample float vector of DataNodes and numbers."""
    return fn.stack(*[as_float(v) if not isinstance(v, float) else
                      types.Constant(v, dtype=types.FLOAT) for v in vals])


def warp(images, a, b, tx, c, d, ty, interp, fill):
    """``warp_affine`` with the map from output to input pixel coordinates (pixel centres at
    half-integers): ``x_in = a x + b y + tx``, ``y_in = c x + d y + ty``, on uint8 HWC images.

    The border is torchvision's (``_apply_grid_transform``): ``grid_sample`` with zero padding,
    then, where a fill is given (``fill`` not ``None``), the fill blended in by a warped mask of
    ones. Nearest: a pixel whose source lies outside takes the fill (DALI's ``fill_value``).
    Bilinear: ``mask * (img - fill) + fill``, where ``img`` and ``mask`` are the image and an
    all-ones channel warped with zeros outside (so a border pixel is ``mask`` squared times
    the image's share, not DALI's ``img + (1 - mask) * fill``); with ``fill=None`` the zero
    padded result as it is. Rounded half to even, as torchvision rounds."""
    m = fn.reshape(vector(a, b, tx, c, d, ty), shape=[2, 3])
    if interp == types.INTERP_NN:
        return fn.warp_affine(images, matrix=m, fill_value=0.0 if fill is None else fill,
                              interp_type=interp, inverse_map=True)
    x = as_float(images)
    if fill is not None:
        x = fn.cat(x, x[:, :, 0:1] * 0.0 + 1.0, axis=2)  # the image and a channel of ones
    x = fn.warp_affine(x, matrix=m, fill_value=0.0, interp_type=interp, inverse_map=True)
    if fill is not None:
        img, mask = x[:, :, 0:3], x[:, :, 3:4]
        x = (img - fill) * mask + fill
    return fn.cast(dmath.clamp(round_half_even(x), 0.0, 255.0), dtype=types.UINT8)


def affine(images, op: Op):
    """torchvision's ``RandomAffine`` and ``RandomRotation`` (``op["rotate"]``): per image an
    angle ``U(degrees)``, a shift ``round(U(-f W, f W))`` / ``round(U(-f H, f H))``, a scale
    ``U(scale)`` and shears ``U(shear)``, then ``warp_affine`` with torchvision's inverse matrix
    (``_get_inverse_affine_matrix``; ``F.rotate`` passes it the negated angle), about the image
    centre or ``center``, with its interpolation and fill."""
    H, W = image_hw(images)

    def draw(lo_hi, period=None):  # a fixed value as torchvision draws it: a float32, then
        lo, hi = lo_hi             # its math in float64 (an angle reduced to one turn first)
        if hi > lo:
            return draws.uniform(lo, hi)
        v = float(np.float32(lo))
        return math.fmod(v, period) if period else v

    angle = draw(op["degrees"], 360.0)
    if op["rotate"]:
        angle = angle * -1.0
    tx = ty = 0.0
    if op["translate"] is not None:
        fx, fy = op["translate"]
        tx = round_half_even(draws.uniform(-1.0, 1.0) * (W * fx)) if fx else 0.0
        ty = round_half_even(draws.uniform(-1.0, 1.0) * (H * fy)) if fy else 0.0
    scale = draw(op["scale"]) if op["scale"] is not None else 1.0
    sx0, sx1, sy0, sy1 = op["shear"] if op["shear"] is not None else (0.0, 0.0, 0.0, 0.0)
    shx, shy = draw((sx0, sx1), 360.0), draw((sy0, sy1), 360.0)

    def rad(v):
        return v * (math.pi / 180.0)

    def trig(f, v):
        return getattr(math, f)(v) if isinstance(v, float) else getattr(dmath, f)(v)

    rot, sx, sy = rad(angle), rad(shx), rad(shy)
    cos_rs, sin_rs = trig("cos", rot - sy), trig("sin", rot - sy)
    cos_sy, tan_sx = trig("cos", sy), trig("tan", sx)
    a = cos_rs / cos_sy
    b = cos_rs * tan_sx / cos_sy * -1.0 - trig("sin", rot)
    c = sin_rs / cos_sy
    d = sin_rs * tan_sx / cos_sy * -1.0 + trig("cos", rot)
    m0, m1, m3, m4 = d / scale, b * -1.0 / scale, c * -1.0 / scale, a / scale
    cx, cy = W * 0.5, H * 0.5
    if op["center"] is not None:  # torchvision: relative to the image centre
        fx_, fy_ = op["center"]
        ccx, ccy = cx * -1.0 + fx_, cy * -1.0 + fy_
    else:
        ccx = ccy = 0.0
    # relative coordinates r = p - C: src_r = M r + M (-cc - t) + cc; absolute: + C
    ox = (ccx * -1.0 - tx) * m0 + (ccy * -1.0 - ty) * m1 + ccx
    oy = (ccx * -1.0 - tx) * m3 + (ccy * -1.0 - ty) * m4 + ccy
    t0 = ox + cx - (m0 * cx + m1 * cy)
    t1 = oy + cy - (m3 * cx + m4 * cy)
    fill = None if op["fill"] is None else float(op["fill"])
    return warp(images, m0, m1, t0, m3, m4, t1, WARP_INTERP[op["interp"]], fill)
