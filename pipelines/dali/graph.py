"""The DALI graph, a pure function of ``AugmentSpec`` and ``LoaderConfig`` (no iterator logic).

Train: decode fused with the random crop (``decoders.image_random_crop``, the spec's scale and
ratio) -> resize to ``size`` -> ``crop_mirror_normalize`` with a coin-flip mirror.
Eval: decode -> resize the shorter side to ``resize_size`` -> centre crop in
``crop_mirror_normalize``.

On a GPU the decoder is ``device="mixed"`` (nvJPEG, with the hardware JPEG decoder taking
``hw_decoder_load`` of the images where the GPU has one) and the rest runs on the GPU; with
``device_id=None`` the same graph runs on CPU operators (how CI tests it).
"""
from __future__ import annotations

from typing import Callable, Optional

from nvidia.dali import fn, pipeline_def, types

from ..augment import AugmentSpec, Mode
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


def augment(jpegs, spec: AugmentSpec, cfg: LoaderConfig, gpu: bool):
    """The augmentation graph on encoded JPEGs; returns normalised images."""
    dec = "mixed" if gpu else "cpu"
    common = dict(
        dtype=DALI_DTYPE[cfg.dtype],
        output_layout="HWC" if cfg.channels_last else "CHW",
        mean=list(spec.mean_255),
        std=list(spec.std_255),
    )
    if spec.mode is Mode.TRAIN:
        images = fn.decoders.image_random_crop(
            jpegs, device=dec, output_type=types.RGB, random_area=list(spec.scale),
            random_aspect_ratio=list(spec.ratio), num_attempts=10, **decoder_kwargs(cfg, gpu),
        )
        images = fn.resize(images, resize_x=spec.size, resize_y=spec.size,
                           interp_type=types.INTERP_LINEAR, antialias=True)
        mirror = fn.random.coin_flip(probability=spec.flip_p)
        return fn.crop_mirror_normalize(images, mirror=mirror, **common)
    images = fn.decoders.image(jpegs, device=dec, output_type=types.RGB,
                               jpeg_fancy_upsampling=True, **decoder_kwargs(cfg, gpu))
    images = _resize_shorter_centre_crop(images, spec.resize_size, spec.size)
    return fn.crop_mirror_normalize(images, **common)


def _resize_shorter_centre_crop(images, resize: int, size: int):
    """torchvision's ``Resize(resize)`` + ``CenterCrop(size)`` geometry, to the pixel.

    torchvision truncates the long side (``int(resize * long / short)``) and rounds the crop
    offset half-to-even (``round((H - size) / 2)``); DALI's ``resize_shorter`` and
    ``crop_pos=0.5`` round differently, which shifts a noisy image by one pixel. So the sizes and
    offsets are computed here with integer arithmetic on the decoded shape.
    """
    shp = images.shape()
    h = fn.cast(shp[0], dtype=types.INT64)
    w = fn.cast(shp[1], dtype=types.INT64)
    h_short = fn.cast(h <= w, dtype=types.INT64)
    new_h = h_short * resize + (1 - h_short) * ((resize * h) // w)
    new_w = (1 - h_short) * resize + h_short * ((resize * w) // h)
    images = fn.resize(images, resize_x=fn.cast(new_w, dtype=types.FLOAT),
                       resize_y=fn.cast(new_h, dtype=types.FLOAT),
                       interp_type=types.INTERP_LINEAR, antialias=True)

    def offset(k):  # round(k / 2) with ties to even, in floor divisions only
        return k // 2 + (k + 1) // 4 - k // 4

    start = fn.stack(offset(new_h - size), offset(new_w - size))
    return fn.slice(images, start=fn.cast(start, dtype=types.INT32), shape=[size, size],
                    axis_names="HW")


def build_pipeline(cfg: LoaderConfig, source: Callable, device_id: Optional[int]):
    """Build the pipeline reading ``(jpegs, labels, indices)`` batches from ``source``.

    Args:
        cfg: the loader config (batch size, threads, prefetch, seed, dtype, layout, knobs).
        source: a DALI batch callable taking ``BatchInfo`` and returning ``(jpegs, meta)``
            (see ``pipelines.dali.source``); it must keep fed buffers alive (``no_copy``).
        device_id: the CUDA device, or ``None`` for a CPU-only pipeline.
    """
    gpu = device_id is not None

    @pipeline_def(
        batch_size=cfg.batch_size,
        num_threads=max(1, cfg.num_workers),
        device_id=device_id,
        prefetch_queue_depth=cfg.prefetch,
        seed=cfg.seed,
    )
    def graph():
        jpegs, meta = fn.external_source(
            source=source, num_outputs=2, batch=True, batch_info=True,
            dtype=[types.UINT8, types.INT64], ndim=[1, 1], no_copy=True,
        )
        labels, indices = meta[0:1], meta[1:2]
        images = augment(jpegs, cfg.augment, cfg, gpu)
        if gpu:
            labels = labels.gpu()
        return images, labels, indices

    return graph()
