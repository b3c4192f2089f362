"""The DALI graph, a pure function of ``AugmentSpec`` and ``LoaderConfig`` (no iterator logic).

The graph is built from a ``TvPlan`` (``pipelines.migrate``): either ``AugmentSpec``'s recipe or
the translation of the user's torchvision Compose, op by op as torchvision computes it.
Train: the random-resized-crop window fused into the decoder (DALI's generator in
``decoders.image_random_crop``, or torchvision's own algorithm, ``_rrc_window``, feeding
``decoders.image_slice``; see ``pipelines.migrate.translate.rrc_window``) -> resize to
``size`` -> ``crop_mirror_normalize`` with a coin-flip mirror. Eval: decode -> resize the
shorter side to ``resize_size`` -> centre crop -> ``crop_mirror_normalize``.

On a GPU the decoder is ``device="mixed"`` (nvJPEG, with the hardware JPEG decoder taking
``hw_decoder_load`` of the images where the GPU has one) and the rest runs on the GPU; with
``device_id=None`` the same graph runs on CPU operators (how CI tests it).
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np
from nvidia.dali import fn, pipeline_def, types
from nvidia.dali import math as dmath

from ..migrate import Op, TvPlan, from_torchvision, spec_ops
from ..config import LoaderConfig, OutputDType

# uint8 -> normalised output dtype that DALI can produce directly (bf16 is cast in torch).
DALI_DTYPE = {
    OutputDType.FLOAT32: types.FLOAT,
    OutputDType.BFLOAT16: types.FLOAT,
    OutputDType.FLOAT16: types.FLOAT16,
}
OUTPUTS = ("images", "labels", "indices")


def decoder_kwargs(cfg: LoaderConfig, gpu: bool) -> dict:
    """nvJPEG / hardware-decoder tuning; only the mixed decoder accepts these."""
    if not gpu:
        return {}
    kw = dict(
        hw_decoder_load=cfg.dali_hw_decoder_load,
        device_memory_padding=cfg.dali_device_memory_padding,
        host_memory_padding=cfg.dali_host_memory_padding,
    )
    if cfg.dali_preallocate_width_hint:
        kw["preallocate_width_hint"] = cfg.dali_preallocate_width_hint
    if cfg.dali_preallocate_height_hint:
        kw["preallocate_height_hint"] = cfg.dali_preallocate_height_hint
    return kw


INTERP = {"linear": types.INTERP_LINEAR, "nn": types.INTERP_NN, "cubic": types.INTERP_CUBIC,
          "lanczos3": types.INTERP_LANCZOS3}


def augment(jpegs, plan: TvPlan, cfg: LoaderConfig, gpu: bool):
    """The augmentation graph on encoded JPEGs, from a ``TvPlan``; returns normalised images.

    A leading random-resized-crop is fused into the decoder (only the crop window is decoded);
    a trailing horizontal flip is fused into ``crop_mirror_normalize``, and so is the plan's
    last value map (``mean`` / ``std``).
    """
    dec = "mixed" if gpu else "cpu"
    ops = list(plan.ops)
    if ops and ops[0].kind == "random_resized_crop" and ops[0]["window"] == "dali":
        op = ops.pop(0)
        images = fn.decoders.image_random_crop(
            jpegs, device=dec, output_type=types.RGB, random_area=list(op["scale"]),
            random_aspect_ratio=list(op["ratio"]), num_attempts=10, **decoder_kwargs(cfg, gpu))
        images = _resize(images, op["size"], op)
    elif ops and ops[0].kind == "random_resized_crop":
        op = ops.pop(0)
        start, shape = _rrc_window(fn.peek_image_shape(jpegs), op["scale"], op["ratio"])
        images = fn.decoders.image_slice(
            jpegs, start, shape, device=dec, output_type=types.RGB, axis_names="HW",
            normalized_anchor=False, normalized_shape=False, **decoder_kwargs(cfg, gpu))
        images = _resize(images, op["size"], op)
    else:
        images = fn.decoders.image(jpegs, device=dec, output_type=types.RGB,
                                   jpeg_fancy_upsampling=True, **decoder_kwargs(cfg, gpu))
    mirror = None
    if ops and ops[-1].kind == "hflip":
        mirror = fn.random.coin_flip(probability=ops.pop()["p"])
    for op in ops:
        images = _apply(images, op)
    kw = {} if mirror is None else {"mirror": mirror}
    return fn.crop_mirror_normalize(
        images, dtype=DALI_DTYPE[cfg.dtype], output_layout="HWC" if cfg.channels_last else "CHW",
        mean=list(plan.mean), std=list(plan.std), **kw)


def _uniform(lo_hi, shape=None):
    lo, hi = lo_hi
    kw = {} if shape is None else {"shape": shape}
    return fn.random.uniform(range=[lo, hi], **kw) if hi > lo else float(lo)


def _f(x):
    return fn.cast(x, dtype=types.FLOAT)


def _hw(images):
    shp = images.shape()
    return _f(shp[0]), _f(shp[1])


def _round(x):
    """Python's ``round`` (ties to even), as torchvision rounds crop sizes."""
    r = dmath.floor(x + 0.5)
    return r - ((r - x) == 0.5) * (r - 2.0 * dmath.floor(r * 0.5))


def _rrc_window(shape, scale, ratio, attempts: int = 10):
    """torchvision's ``RandomResizedCrop`` window ``(start, shape)`` as ``[y, x]`` / ``[h, w]``.

    The same algorithm, vectorised over the 10 attempts: area ~ U(scale) * H * W, log aspect
    ratio ~ U(log ratio), sizes rounded half to even; the first attempt that fits wins, its
    offsets uniform over every position (``randint(0, H - h + 1)``); none fits: the central
    crop of the whole image with its aspect ratio clamped to ``ratio``. DALI's own generator
    puts that fallback at a random offset. About 90 per-sample CPU operators, so it runs only
    where the fallback matters (``pipelines.migrate.translate.rrc_window``).
    """
    H, W = _f(shape[0]), _f(shape[1])
    area = H * W * _uniform(scale, [attempts])
    log_ar = _uniform((math.log(ratio[0]), math.log(ratio[1])), [attempts])
    ar = math.exp(log_ar) if isinstance(log_ar, float) else dmath.exp(log_ar)
    w, h = _round(dmath.sqrt(area * ar)), _round(dmath.sqrt(area / ar))
    rank = ((w > 0.0) & (w <= W) & (h > 0.0) & (h <= H)) * types.Constant(
        np.arange(attempts, 0, -1, dtype=np.float32))
    best = fn.reductions.max(rank)
    first = rank == best
    found = best > 0.0
    lt, gt = (W / H) < ratio[0], (W / H) > ratio[1]
    ch = found * fn.reductions.sum(first * h) + (1 - found) * (H + lt * (_round(W / ratio[0]) - H))
    cw = found * fn.reductions.sum(first * w) + (1 - found) * (W + gt * (_round(H * ratio[1]) - W))
    u = fn.random.uniform(range=[0.0, 1.0], shape=[2])
    y = found * dmath.min(dmath.floor(u[0] * (H - ch + 1.0)), H - ch) \
        + (1 - found) * dmath.floor((H - ch) * 0.5)
    x = found * dmath.min(dmath.floor(u[1] * (W - cw + 1.0)), W - cw) \
        + (1 - found) * dmath.floor((W - cw) * 0.5)
    return fn.stack(y, x), fn.stack(ch, cw)


def _resize(images, size, op: Op):
    h, w = size
    return fn.resize(images, size=[h, w], interp_type=INTERP[op["interp"]],
                     antialias=op["antialias"])


def _apply(images, op: Op):
    """One translated torchvision op on decoded HWC images (uint8, or float after ``affine``)."""
    k = op.kind
    if k == "affine":  # x -> scale * x + shift per channel, to float
        a, b = op["scale"], op["shift"]
        return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="HWC",
                                        mean=[-b[c] / a[c] for c in range(3)],
                                        std=[1.0 / a[c] for c in range(3)])
    if k == "random_resized_crop":
        if op["window"] == "dali":
            start, shape = fn.random_crop_generator(
                images.shape(), random_area=list(op["scale"]),
                random_aspect_ratio=list(op["ratio"]), num_attempts=10)
        else:
            start, shape = _rrc_window(images.shape(), op["scale"], op["ratio"])
        images = fn.slice(images, start, shape, axis_names="HW", normalized_anchor=False,
                          normalized_shape=False)
        return _resize(images, op["size"], op)
    if k == "resize_shorter":
        return _resize_shorter(images, op)
    if k == "resize":
        return _resize(images, op["size"], op)
    if k == "center_crop":
        return _centre_crop(images, *op["size"])
    if k == "random_crop":
        return _random_crop(images, op)
    if k in ("hflip", "vflip"):
        flip = fn.random.coin_flip(probability=op["p"])
        return fn.flip(images, horizontal=flip if k == "hflip" else 0,
                       vertical=flip if k == "vflip" else 0)
    if k == "color_jitter":
        return _color_jitter(images, op)
    if k == "grayscale":
        x = fn.cast(images, dtype=types.FLOAT)
        coin = _near(images, fn.cast(fn.random.coin_flip(probability=op["p"]), dtype=types.FLOAT))
        x = x + (dmath.floor(_grey(x)) - x) * coin  # torchvision truncates the grey to uint8
        return fn.cast(x, dtype=types.UINT8)
    if k == "gaussian_blur":
        return fn.gaussian_blur(images, window_size=list(op["kernel"]),
                                sigma=_uniform(op["sigma"]))
    raise ValueError(f"op kind={k!r} has no DALI translation")  # from_torchvision rejects these


def _grey(x):
    """torchvision's luma of float HWC images, ``H x W x 1``."""
    return x[:, :, 0:1] * 0.2989 + x[:, :, 1:2] * 0.587 + x[:, :, 2:3] * 0.114


def _color_jitter(images, op: Op):
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
        f = _near(images, _uniform(rng))
        if mix is None:
            x = x * f
        else:
            g = dmath.floor(_grey(x))
            x = x * f + (fn.reductions.mean(g) if mix == "mean" else g) * (1.0 - f)
        x = dmath.floor(dmath.clamp(x, 0.0, 255.0))
    if h:
        x = _hue(x, _near(images, _uniform(h)))
    return fn.cast(x, dtype=types.UINT8)


def _hue(x, shift):
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


def _near(images, v):
    """``v`` (a per-sample CPU scalar or a float) on the device of ``images``."""
    return v.gpu() if images.device == "gpu" and not isinstance(v, float) else v


def _resize_shorter(images, op: Op):
    """torchvision's ``Resize(size, max_size=...)`` geometry for images of any size: the long
    side is truncated, ``int(size * long / short)``, then capped at ``max_size``. DALI's
    ``resize_shorter`` rounds instead, so the sizes are computed here in integers."""
    shp = images.shape()
    h = fn.cast(shp[0], dtype=types.INT64)
    w = fn.cast(shp[1], dtype=types.INT64)
    short, long = dmath.min(h, w), dmath.max(h, w)
    size, max_size = op["size"], op["max_size"]
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
    return fn.resize(images, resize_x=_f(new_w), resize_y=_f(new_h),
                     interp_type=INTERP[op["interp"]], antialias=op["antialias"])


def _centre_crop(images, ch: int, cw: int):
    """torchvision's ``CenterCrop``: offsets ``round((H - ch) / 2)`` with ties to even (DALI's
    ``crop_pos=0.5`` rounds ties up); an image smaller than the crop is padded with zeros,
    ``(ch - H) // 2`` rows on top, as torchvision pads."""
    shp = images.shape()
    h = fn.cast(shp[0], dtype=types.INT64)
    w = fn.cast(shp[1], dtype=types.INT64)

    def offset(k):  # round(k / 2) ties to even for k >= 0, -((-k) // 2) below (floor divisions
        kp, kn = dmath.max(k, 0), dmath.max(-k, 0)  # of non-negative numbers only)
        return kp // 2 + (kp + 1) // 4 - kp // 4 - kn // 2

    start = fn.stack(offset(h - ch), offset(w - cw))
    return fn.slice(images, start=fn.cast(start, dtype=types.INT32), shape=[ch, cw],
                    axis_names="HW", out_of_bounds_policy="pad", fill_values=0.0)


def _random_crop(images, op: Op):
    """torchvision's ``RandomCrop``: pad by ``padding`` (and, with ``pad_if_needed``, by the
    missing size on both sides), then a crop at ``randint(0, padded - size + 1)``. Without
    ``pad_if_needed`` a crop larger than the (padded) image raises, as torchvision does."""
    ch, cw = op["size"]
    l, r, t, b = op["padding"] or (0, 0, 0, 0)
    mode, fill = op["mode"], list(op["fill"])
    if op["padding"] is not None and not op["pad_if_needed"]:
        H, W = _hw(images)
        shape = fn.cast(fn.stack(H + (t + b), W + (l + r)), dtype=types.INT32)
        images = fn.slice(images, start=np.array([-t, -l], np.int32), shape=shape,
                          axis_names="HW", out_of_bounds_policy=mode, fill_values=fill)
        l = r = t = b = 0
    H, W = _hw(images)
    Hp, Wp = H + t + b, W + l + r
    if op["pad_if_needed"]:
        dh, dw = dmath.max(ch - Hp, 0.0), dmath.max(cw - Wp, 0.0)
        t, l, Hp, Wp = t + dh, l + dw, Hp + 2.0 * dh, Wp + 2.0 * dw
    u = fn.random.uniform(range=[0.0, 1.0], shape=[2])
    y = dmath.min(dmath.floor(u[0] * (Hp - ch + 1.0)), Hp - ch) - t
    x = dmath.min(dmath.floor(u[1] * (Wp - cw + 1.0)), Wp - cw) - l
    pad = op["pad_if_needed"]
    return fn.slice(images, start=fn.cast(fn.stack(y, x), dtype=types.INT32), shape=[ch, cw],
                    axis_names="HW", out_of_bounds_policy=mode if pad else "error",
                    fill_values=fill)


def build_pipeline(cfg: LoaderConfig, source: Callable, device_id: Optional[int],
                   lane: int = 0):
    """Build the pipeline reading ``(jpegs, labels, indices)`` batches from ``source``.

    Args:
        cfg: the loader config (batch size, threads, prefetch, seed, dtype, layout, knobs).
        source: a DALI batch callable taking ``BatchInfo`` and returning ``(paths, meta)``
            (see ``pipelines.dali.source``); it must keep fed buffers alive (``no_copy``).
        device_id: the CUDA device, or ``None`` for a CPU-only pipeline.
        lane: which of the ``cfg.dali_pipelines`` side-by-side pipelines this is; it gets
            ``num_workers // dali_pipelines`` threads and its own augmentation seed.
    """
    gpu = device_id is not None
    plan = from_torchvision(cfg.transform) if cfg.transform is not None else spec_ops(cfg.augment)

    @pipeline_def(
        batch_size=cfg.batch_size,
        num_threads=max(1, cfg.num_workers // cfg.dali_pipelines),
        device_id=device_id,
        prefetch_queue_depth=cfg.prefetch,
        seed=cfg.seed + 7919 * lane,
    )
    def graph():
        paths, meta = fn.external_source(
            source=source, num_outputs=2, batch=True, batch_info=True,
            dtype=[types.UINT8, types.INT64], ndim=[1, 1], no_copy=True,
        )
        # Read in DALI's C++ threads (see pipelines.dali.source). Plain reads, not mmap, by
        # default: mapping and unmapping 256 small files per batch capped loader-only at 15.5k
        # img/s on the H200 host against 21.0k with read() (docs/results/h200/dali-io-probe).
        jpegs = fn.io.file.read(paths, dont_use_mmap=not cfg.dali_use_mmap)
        labels, indices = meta[0:1], meta[1:2]
        images = augment(jpegs, plan, cfg, gpu)
        if gpu:
            labels = labels.gpu()
        return images, labels, indices

    return graph()
