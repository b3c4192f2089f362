"""The DALI graph, a pure function of ``AugmentSpec`` and ``LoaderConfig`` (no iterator logic).

The graph is built from a ``TvPlan`` (``pipelines.migrate``): either ``AugmentSpec``'s recipe or
the translation of the user's torchvision Compose.
Train: decode fused with the random crop (``decoders.image_random_crop``, the spec's scale and
ratio) -> resize to ``size`` -> ``crop_mirror_normalize`` with a coin-flip mirror.
Eval: decode -> resize the shorter side to ``resize_size`` -> centre crop ->
``crop_mirror_normalize``.

On a GPU the decoder is ``device="mixed"`` (nvJPEG, with the hardware JPEG decoder taking
``hw_decoder_load`` of the images where the GPU has one) and the rest runs on the GPU; with
``device_id=None`` the same graph runs on CPU operators (how CI tests it).
"""
from __future__ import annotations

from typing import Callable, Optional

from nvidia.dali import fn, pipeline_def, types

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


INTERP = {"linear": types.INTERP_LINEAR, "nn": types.INTERP_NN, "cubic": types.INTERP_CUBIC}


def augment(jpegs, plan: TvPlan, cfg: LoaderConfig, gpu: bool):
    """The augmentation graph on encoded JPEGs, from a ``TvPlan``; returns normalised images.

    A leading random-resized-crop is fused into the decoder (only the crop window is decoded);
    a trailing horizontal flip is fused into ``crop_mirror_normalize``.
    """
    dec = "mixed" if gpu else "cpu"
    ops = list(plan.ops)
    if ops and ops[0].kind == "random_resized_crop":
        op = ops.pop(0)
        images = fn.decoders.image_random_crop(
            jpegs, device=dec, output_type=types.RGB, random_area=list(op["scale"]),
            random_aspect_ratio=list(op["ratio"]), num_attempts=10, **decoder_kwargs(cfg, gpu),
        )
        h, w = op["size"]
        images = fn.resize(images, resize_x=w, resize_y=h, interp_type=INTERP[op["interp"]],
                           antialias=True)
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


def _uniform(lo_hi):
    lo, hi = lo_hi
    return fn.random.uniform(range=[lo, hi]) if hi > lo else float(lo)


def _apply(images, op: Op):
    """One translated torchvision op on decoded uint8 HWC images."""
    k = op.kind
    if k == "random_resized_crop":
        h, w = op["size"]
        return fn.random_resized_crop(images, size=[h, w], random_area=list(op["scale"]),
                                      random_aspect_ratio=list(op["ratio"]), num_attempts=10,
                                      interp_type=INTERP[op["interp"]], antialias=True)
    if k == "resize_shorter":
        return _resize_shorter(images, op["size"], INTERP[op["interp"]])
    if k == "resize":
        h, w = op["size"]
        return fn.resize(images, resize_x=w, resize_y=h, interp_type=INTERP[op["interp"]],
                         antialias=True)
    if k == "center_crop":
        return _centre_crop(images, *op["size"])
    if k == "random_crop":
        h, w = op["size"]
        return fn.crop(images, crop_h=h, crop_w=w, crop_pos_x=fn.random.uniform(range=[0.0, 1.0]),
                       crop_pos_y=fn.random.uniform(range=[0.0, 1.0]))
    if k in ("hflip", "vflip"):
        flip = fn.random.coin_flip(probability=op["p"])
        return fn.flip(images, horizontal=flip if k == "hflip" else 0,
                       vertical=flip if k == "vflip" else 0)
    if k == "color_jitter":
        # torchvision applies the four in a random order each call; DALI in this fixed order.
        b, c, s, h = op["brightness"], op["contrast"], op["saturation"], op["hue"]
        if b or c:
            images = fn.brightness_contrast(images, brightness=_uniform(b) if b else 1.0,
                                            contrast=_uniform(c) if c else 1.0)
        if s or h:
            hue = fn.random.uniform(range=[h[0] * 360.0, h[1] * 360.0]) if h else 0.0
            images = fn.hsv(images, saturation=_uniform(s) if s else 1.0, hue=hue)
        return images
    if k == "grayscale":
        keep = 1.0 - fn.cast(fn.random.coin_flip(probability=op["p"]), dtype=types.FLOAT)
        return fn.hsv(images, saturation=keep)
    if k == "gaussian_blur":
        kh, kw = op["kernel"]
        return fn.gaussian_blur(images, window_size=kh, sigma=_uniform(op["sigma"]))
    raise ValueError(f"op kind={k!r} has no DALI translation")  # from_torchvision rejects these


def _resize_shorter(images, resize: int, interp=types.INTERP_LINEAR):
    """torchvision's ``Resize(resize)`` geometry: the long side is truncated,
    ``int(resize * long / short)``. DALI's ``resize_shorter`` rounds instead, which shifts a
    noisy image by a pixel; so the sizes are computed here in integers from the decoded shape."""
    shp = images.shape()
    h = fn.cast(shp[0], dtype=types.INT64)
    w = fn.cast(shp[1], dtype=types.INT64)
    h_short = fn.cast(h <= w, dtype=types.INT64)
    new_h = h_short * resize + (1 - h_short) * ((resize * h) // w)
    new_w = (1 - h_short) * resize + h_short * ((resize * w) // h)
    return fn.resize(images, resize_x=fn.cast(new_w, dtype=types.FLOAT),
                     resize_y=fn.cast(new_h, dtype=types.FLOAT), interp_type=interp,
                     antialias=True)


def _centre_crop(images, ch: int, cw: int):
    """torchvision's ``CenterCrop``: offsets ``round((H - ch) / 2)`` with ties to even (DALI's
    ``crop_pos=0.5`` rounds ties up)."""
    shp = images.shape()
    h = fn.cast(shp[0], dtype=types.INT64)
    w = fn.cast(shp[1], dtype=types.INT64)

    def offset(k):  # round(k / 2) with ties to even, in floor divisions only
        return k // 2 + (k + 1) // 4 - k // 4

    start = fn.stack(offset(h - ch), offset(w - cw))
    return fn.slice(images, start=fn.cast(start, dtype=types.INT32), shape=[ch, cw],
                    axis_names="HW")


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
