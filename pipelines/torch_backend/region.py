"""Crop-first decodes that read less of the file than the scaled decode: ``Decoder.VIPS`` and
``Decoder.REGION`` (issue 45). Optional: ``pip install 'gpu-feed[region]'``.

NOTE [region decode]
Both draw the crop as ``scaled_crop`` does (``decode.crop_plan``: torchvision's own
``make_params`` on the header's full size, so every decoder and backend keeps the same draws),
and resize the crop's box with the same PIL filter from only the pixels it reads
(``decode.resize_window``). They differ in what they decode:

* ``vips``: libvips (``pyvips``, bundled by ``pyvips-binary``) loads the JPEG at the scaled
  path's ``1/k`` (libjpeg's DCT scaling, "shrink-on-load") and, reading sequentially, stops
  after the crop's bottom row. Its pixels are simplejpeg's at ``1/k``, so the output is the
  scaled path's but at an edge (libvips keeps ``floor(size / k)`` of libjpeg's
  ``ceil(size / k)``: where the window reaches that partial pixel, the output's last column
  or row, two with bicubic, differs).
* ``region``: nvImageCodec's CPU backend (libjpeg-turbo's ``jpeg_crop_scanline`` and
  ``jpeg_skip_scanlines``; no GPU or driver needed) decodes only the crop's window at full
  resolution: no IDCT outside it, nothing below it. nvImageCodec has no DCT scaling, so this
  is a full decode followed by the crop, pixel for pixel, and the output differs from
  ``Resize`` on the full decode by rounding only.

Rows above the crop still cost their entropy decode: a baseline JPEG without restart markers
must be Huffman-decoded in order, and libjpeg's skip does that too. So the most either can
save over the scaled decode is the rows below the crop (on 1500-4000 px photos with
``RandomResizedCrop(224)``: 18% of the rows on average). Measured on this project's CPU
(``python -m tools.large_photos --per-image``), per image, against the scaled decode: ``vips``
0.94x (libvips' fixed cost, about 1.5 ms a call, and a slower load than simplejpeg's eat the
saving), ``region`` 0.5x (a full-resolution IDCT of the window costs more than the 1/4 or 1/8
decode of the whole file; it wins only where no reduction fits, ``k = 1``, under 1% of these
draws). So neither is the automatic choice.

A file that ``crop_plan`` refuses (not an RGB or greyscale JPEG, or EXIF-rotated) and one the
package cannot decode return ``None``: the caller decodes it in full, reseeded, as for the
scaled path. When the package is missing, the loader warns and uses the scaled decode
(``decoder_or_fallback``).

Rounding bounds (``tests/test_region.py``): ``region`` against the full decode followed by the
same crop and resize, at most 1 level of 255 (exact in practice); ``vips`` against the scaled
path, at most 1 level but in the last two columns and rows (exact in practice), and against
the full decode within the scaled path's own bound (``tests/test_decode.py``'s ``TOL``).
"""
from __future__ import annotations

import functools
import importlib
import io
import os
import warnings

import numpy as np
from PIL import Image

from pipelines.config import Decoder
from pipelines.torch_backend.decode import crop_plan

PACKAGES = {Decoder.VIPS: "pyvips", Decoder.REGION: "nvidia.nvimgcodec"}


@functools.cache
def available(decoder: Decoder) -> bool:
    """Whether ``decoder``'s package imports here (pyvips also needs its libvips)."""
    try:
        importlib.import_module(PACKAGES[decoder])
    except Exception:  # ImportError, or pyvips' own error when libvips cannot be loaded
        return False
    return True


def decoder_or_fallback(decoder: Decoder) -> Decoder:
    """``decoder``, or ``Decoder.SCALED`` with a warning when its package is missing."""
    if decoder in PACKAGES and not available(decoder):
        warnings.warn(f"decoder={decoder.value!r} needs {PACKAGES[decoder]} (pip install "
                      "'gpu-feed[region]'); using 'scaled'", stacklevel=3)
        return Decoder.SCALED
    return decoder


@functools.cache
def _vips(pid: int):
    """pyvips, set up once per process: one thread (a loader's worker decodes one image at a
    time) and no operation cache (it would hold every file's buffer)."""
    import pyvips

    pyvips.concurrency_set(1)
    pyvips.cache_set_max(0)
    return pyvips


def vips_crop(data: bytes, t) -> Image.Image | None:
    """``t`` (see ``decode.first_crop``) on the JPEG ``data`` through libvips' shrink-on-load,
    decoding down to the crop's bottom row only (module NOTE); ``None`` when the file needs
    the full decode."""
    with Image.open(io.BytesIO(data)) as im:
        plan = crop_plan(im, t)
    if plan is None:
        return None
    pyvips = _vips(os.getpid())
    shape = plan.reduced_shape()  # libjpeg's ceil(size / k), as the scaled path maps the box
    x0, y0, x1, y1 = plan.window(shape)
    img = pyvips.Image.new_from_buffer(data, "", shrink=plan.k, access="sequential",
                                       fail_on="warning")
    # libvips keeps floor(size / k) of libjpeg's ceil(size / k): the partial last column or
    # row, where the window reaches it, is its neighbour repeated
    sub = img.crop(x0, y0, min(x1, img.width) - x0, min(y1, img.height) - y0).numpy()
    pad = ((0, y1 - y0 - sub.shape[0]), (0, x1 - x0 - sub.shape[1])) + ((0, 0),) * (sub.ndim - 2)
    if any(p[1] for p in pad):
        sub = np.pad(sub, pad, mode="edge")
    return plan.resize(sub, (x0, y0), shape)


@functools.cache
def _nvimgcodec(pid: int):
    """nvImageCodec's CPU-only decoder (no CUDA context: safe in forked workers), one thread,
    once per process; and its decode parameters (EXIF left alone: ``crop_plan`` takes upright
    files only)."""
    import nvidia.nvimgcodec as nvimgcodec

    dec = nvimgcodec.Decoder(device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY,
                             max_num_cpu_threads=1,
                             backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.CPU_ONLY)])
    params = nvimgcodec.DecodeParams(apply_exif_orientation=False,
                                     color_spec=nvimgcodec.ColorSpec.SRGB)
    return nvimgcodec, dec, params


def region_crop(data: bytes, t) -> Image.Image | None:
    """``t`` (see ``decode.first_crop``) on the JPEG ``data``, decoding only the crop's window
    at full resolution with nvImageCodec's CPU backend (module NOTE); ``None`` when the file
    needs the full decode."""
    with Image.open(io.BytesIO(data)) as im:
        plan = crop_plan(im, t)
    if plan is None:
        return None
    nvimgcodec, dec, params = _nvimgcodec(os.getpid())
    # no DCT scaling in nvImageCodec: the crop's own pixels, all of them and no more, are
    # decoded and resized, as torchvision crops and resizes the full decode
    x0, y0, x1, y1 = (int(v) for v in plan.box)
    stream = nvimgcodec.CodeStream(data).get_sub_code_stream(
        region=nvimgcodec.Region(y0, x0, y1, x1))
    img = dec.decode(stream, params=params)
    if img is None:  # nvImageCodec could not decode it: the full decode decides
        return None
    return plan.resize(np.asarray(img.cpu()), (x0, y0), (plan.height, plan.width))

CROPS = {Decoder.VIPS: vips_crop, Decoder.REGION: region_crop}
