"""``python -m tools.gpu_decode --data DIR``: can nvImageCodec's batched decode plus a batched
GPU crop-resize feed ``RandomResizedCrop(224)`` + flip fast enough, without DALI (issue 45)?

A standalone probe, loader-only: no model, nothing of ``pipelines/`` but the shared draws. Every
JPEG of the ImageFolder-style ``DIR`` is read into RAM once, before any timing, with its
upright ``(height, width)`` and EXIF orientation from the header (PIL). So the rates below are
decode + crop + resize + flip + normalise from bytes in memory: no file reads.

The crops and flips are the other backends' (``pipelines.transforms.draws``, NOTE [one plan]):
one ``DrawPlan`` of a ``window`` and a ``coin`` step, over a stream of shuffled epochs
(``epoch_order``). The draws of the whole run are made before timing, in one vectorised call per
epoch, as ``dali``'s source makes them; the ``env`` line gives their cost per image.

Variants are named ``BACKEND.CROP.RESIZE.MODE``; each runs in its own ``try`` and prints one
JSON line (median, min and max img/s over ``--repeats`` runs of ``--batches`` batches, after
``--warmup`` batches; or its error, on one line):

* ``BACKEND``: nvImageCodec's decoder with ``all`` its backends (the hardware JPEG decoder
  where the GPU has one, the CUDA ones for what it cannot decode, the CPU one last), ``hw``
  (``HW_GPU_ONLY``), ``gpu`` (``GPU_ONLY``: CUDA Huffman, no hardware decoder), ``hybrid``
  (``HYBRID_CPU_GPU``: CPU Huffman, GPU IDCT), ``cpu`` (``CPU_ONLY``, libjpeg-turbo; the
  stand-in on a host without a GPU), ``pil`` (PIL, one image after another: a stand-in, not a
  candidate); ``cached``: the first batch decoded once and handed out again every batch, so
  the line is the ceiling of what follows the decode. Every decoder decodes a whole batch in
  one ``decode`` call.
* ``CROP``: ``roi`` decodes only the crop window (``CodeStream.get_sub_code_stream(region=)``;
  images with an EXIF orientation are decoded whole, as the region is in stored coordinates);
  ``full`` decodes the whole image and the window's offset goes into the resize weights.
* ``RESIZE``: ``bmm`` packs the batch into one ``N x Hpad x Wpad x 3`` buffer (one copy per
  image) and resizes it with two batched matmuls (NOTE [matmul resize]); ``bmmcat``
  packs with one ``torch.cat`` and one gather instead of the per-image copies; ``interp``:
  one ``F.interpolate(antialias=True)`` per image (the naive row); ``none``: decode only.
  Every resize but ``none`` ends in the same normalisation: ``N x 3 x 224 x 224`` bf16,
  channels_last, ImageNet mean and std.
* ``MODE``: ``serial`` decodes then resizes on one thread and one stream; ``overlap`` decodes
  and packs batch k+1 on a background thread and stream while batch k is resized (a queue of
  ``--depth``). nvImageCodec releases the GIL for the decode itself (``Decoder::decode_impl``
  holds a ``py::gil_scoped_release`` around ``nvimgcodecDecoderDecode`` and its wait), so the
  threads run at once except for their Python parts.

NOTE [matmul resize]
Per image and axis, a ``224 x pad`` matrix holds the weights of an antialiased bilinear resize
of the crop window, as ``torch.nn.functional.interpolate(mode="bilinear", antialias=True,
align_corners=False)`` computes them (a triangle filter as wide as the scale when shrinking,
plain bilinear when enlarging), shifted by the window's offset and zero outside the window, so
the padding and the pixels outside the crop weigh nothing. Then ``out = Wy @ X @ Wx^T``: one
``bmm`` over the rows, one over the columns. A flip reverses the rows of ``Wx`` (free).
``--dtype float16`` (default): pixels are exact in fp16, the weights are rounded to fp16
(relative error 2**-11), the row pass and the result are stored in fp16 (each at most 1/16 of
a level off below 256) and
cuBLAS accumulates in fp32 (reduced-precision reductions switched off), so before rounding the
result is within a few tenths of a level of the exact one, and after rounding to uint8 it is
within one level of ``interpolate``'s (``tests/test_gpu_decode.py``). ``bfloat16`` keeps 8
significant bits, so its weights and row pass are 8 times coarser: expect a level or two.
Timing: every clock is read after ``torch.cuda.synchronize``; the decode thread of ``overlap``
runs on from one repeat to the next, so a repeat measures the steady state, not a fill.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import queue
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import functional as TF

from pipelines.epoch_plan import epoch_order
from pipelines.transforms.draws import DrawPlan, Step
from pipelines.transforms.presets import IMAGENET_MEAN, IMAGENET_STD

PLAN = DrawPlan((Step("window", scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)), Step("coin", p=0.5)))
BACKENDS = ("all", "hw", "gpu", "hybrid", "cpu", "pil", "cached")
CROPS, RESIZES, MODES = ("full", "roi"), ("bmm", "bmmcat", "interp", "none"), ("serial", "overlap")
CUDA_VARIANTS = (
    "all.full.none.serial", "all.roi.none.serial",            # decode alone
    "cached.full.bmm.serial", "cached.full.bmmcat.serial",   # all but the decode
    "all.full.interp.serial",                                # the naive row
    "all.full.bmm.serial", "all.roi.bmm.serial", "all.full.bmm.overlap", "all.roi.bmm.overlap",
    "all.roi.bmmcat.overlap", "hw.full.bmm.overlap", "gpu.full.bmm.overlap",
    "gpu.roi.bmm.overlap", "hybrid.roi.bmm.overlap")
CPU_VARIANTS = ("cpu.full.none.serial", "cpu.full.bmm.serial", "cpu.roi.bmm.serial",
                "cpu.roi.bmmcat.overlap", "cpu.full.interp.serial", "pil.roi.bmm.serial",
                "cached.full.bmm.serial")
EXIF_ORIENTATION = 0x0112


# -- the data ---------------------------------------------------------------------------------
def list_jpegs(root: str) -> list[Path]:
    """The ``.jpg`` / ``.jpeg`` files of the class folders of ``root``, sorted."""
    top = Path(root)
    if not top.is_dir():
        raise ValueError(f"--data {root!r} is not a directory")
    files = sorted(p for p in top.glob("*/*") if p.suffix.lower() in (".jpg", ".jpeg"))
    if not files:
        raise ValueError(f"--data {root!r} has no class folders of .jpg files")
    return files


def _header(data: bytes) -> tuple[int, int, int]:
    """``(height, width, orientation)`` of the upright image ``data`` decodes to."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
        o = im.getexif().get(EXIF_ORIENTATION, 1) or 1
    return (w, h, o) if o in (5, 6, 7, 8) else (h, w, o)


def load(paths: list[Path], threads: int = 8):
    """Every file's bytes, ``N x 2`` upright ``(height, width)`` and ``N`` orientations."""
    def one(p):
        data = p.read_bytes()
        return data, _header(data)

    with ThreadPoolExecutor(threads) as pool:
        got = list(pool.map(one, paths))
    meta = np.array([g[1] for g in got], np.int64).reshape(-1, 3)
    return [g[0] for g in got], meta[:, :2].copy(), meta[:, 2].copy()


def sample_stream(sizes: np.ndarray, count: int, seed: int = 0):
    """The first ``count`` samples of shuffled epochs 0, 1, ...: their indices and their
    ``PLAN`` rows ``top, left, h, w, flip`` (``float32``), each drawn in its own epoch."""
    n = len(sizes)
    idx, rows = [], []
    for epoch in range(-(-count // n)):
        order = epoch_order(n, seed=seed, epoch=epoch, shuffle=True)
        idx.append(order)
        rows.append(PLAN.rows(PLAN.raws(seed, epoch, order), sizes[order]))
    return np.concatenate(idx)[:count], np.concatenate(rows)[:count]


# -- the resize (NOTE [matmul resize]) --------------------------------------------------------
def axis_weights(off, length, out: int, pad: int, flip=None) -> torch.Tensor:
    """``N x out x pad`` float32: row ``i`` of image ``n`` weighs input ``j`` as ``interpolate``
    (bilinear, antialias, align_corners=False) weighs pixel ``j - off[n]`` of a window of
    ``length[n]`` pixels for output ``i`` (``out - 1 - i`` where ``flip[n]``)."""
    dev = off.device
    size = length.to(torch.float64)[:, None]
    scale = size / out
    i = torch.arange(out, device=dev, dtype=torch.float64)[None, :]
    if flip is not None:
        i = torch.where(flip.bool()[:, None], out - 1 - i, i)
    center = scale * (i + 0.5)
    support = torch.where(scale >= 1, scale, torch.ones_like(scale))
    inv = (1 / support).float()[..., None]
    lo = torch.clamp((center - support + 0.5).trunc(), min=0).float()[..., None]
    hi = torch.minimum((center + support + 0.5).trunc(), size).float()[..., None]
    j = torch.arange(pad, device=dev, dtype=torch.float32)[None, None, :] - \
        off.float()[:, None, None]
    w = (1 - ((j - center.float()[..., None] + 0.5) * inv).abs()).clamp_(min=0)
    w = w * ((j >= lo) & (j < hi))
    return w / w.sum(-1, keepdim=True)


def crop_resize(x: torch.Tensor, win: torch.Tensor, out: int = 224,
                dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """Crop and resize a packed batch: ``x`` ``N x Hpad x Wpad x 3`` uint8, ``win`` ``N x 5``
    ``top, left, h, w, flip`` in ``x``'s coordinates. Returns ``N x out x out x 3`` in
    ``dtype``, not rounded (a strided view)."""
    n, hp, wp, c = x.shape
    wy = axis_weights(win[:, 0], win[:, 2], out, hp).to(dtype)
    wx = axis_weights(win[:, 1], win[:, 3], out, wp, win[:, 4]).to(dtype)
    t = torch.bmm(wy, x.reshape(n, hp, wp * c).to(dtype))             # N x out x (wp*c)
    t = t.view(n, out, wp, c).transpose(1, 2).reshape(n, wp, out * c)  # N x wp x (out*c)
    return torch.bmm(wx, t).view(n, out, out, c).transpose(1, 2)       # rows were x: turn back


def resize_naive(imgs: list, win: np.ndarray, out: int = 224) -> torch.Tensor:
    """Per image ``interpolate(antialias=True)`` of its window, flipped: ``N x out x out x 3``
    float32, not rounded."""
    res = []
    for t, (top, left, h, w, flip) in zip(imgs, win.astype(np.int64)):
        crop = t[top:top + h, left:left + w].permute(2, 0, 1)[None].float()
        r = F.interpolate(crop, size=(out, out), mode="bilinear", antialias=True,
                          align_corners=False)
        res.append(r.flip(-1) if flip else r)
    return torch.cat(res).permute(0, 2, 3, 1)


def pack_copy(imgs: list) -> torch.Tensor:
    """``N x Hpad x Wpad x 3`` uint8: one copy per image; the padding is left unset (its
    weights are zero)."""
    hp, wp = max(t.shape[0] for t in imgs), max(t.shape[1] for t in imgs)
    x = torch.empty((len(imgs), hp, wp, 3), dtype=torch.uint8, device=imgs[0].device)
    for k, t in enumerate(imgs):
        x[k, :t.shape[0], :t.shape[1]].copy_(t)
    return x


def pack_cat(imgs: list) -> torch.Tensor:
    """:func:`pack_copy` in one ``cat`` and one gather; the padding repeats the last row and
    column (its weights are zero)."""
    dev = imgs[0].device
    hs = np.array([t.shape[0] for t in imgs], np.int64)
    ws = np.array([t.shape[1] for t in imgs], np.int64)
    base = np.concatenate([[0], np.cumsum(hs * ws)[:-1]])
    h, w, b = to_device(np.stack([hs, ws, base]), dev)
    flat = torch.cat([t.reshape(-1, 3) for t in imgs])
    yy = torch.minimum(torch.arange(int(hs.max()), device=dev)[None], h[:, None] - 1)
    xx = torch.minimum(torch.arange(int(ws.max()), device=dev)[None], w[:, None] - 1)
    return flat[(b[:, None] + yy * w[:, None])[:, :, None] + xx[:, None, :]]


def to_device(a: np.ndarray, dev) -> torch.Tensor:
    """A small host array on ``dev`` without a stream sync (pinned, non-blocking)."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else t


def finish(o: torch.Tensor) -> torch.Tensor:
    """``N x H x W x 3`` resized values -> rounded to uint8 -> normalised as the torch backends
    do (``pipelines.transforms.normalize``): ``N x 3 x H x W`` bf16, channels_last."""
    u = o.float().round_().clamp_(0, 255).to(torch.uint8).permute(0, 3, 1, 2)
    x = TF.to_dtype(u.contiguous(memory_format=torch.channels_last), torch.float32, scale=True)
    return TF.normalize(x, mean=list(IMAGENET_MEAN), std=list(IMAGENET_STD), inplace=True) \
        .to(torch.bfloat16)


# -- the decoders -----------------------------------------------------------------------------
class Decode:
    """``decode(datas, regions) -> (HWC uint8 tensors, holders)`` for one ``BACKEND``; a region
    is ``(y0, x0, y1, x1)`` or ``None`` (the whole image). Keep ``holders`` alive until the
    work reading the tensors has run."""

    def __init__(self, backend: str, device: torch.device):
        self.backend, self.device = backend, device
        if backend == "pil":
            return
        from nvidia import nvimgcodec as nv

        self.nv = nv
        if backend == "cpu":
            self.dec = nv.Decoder(device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY,
                                  backends=[nv.Backend(nv.CPU_ONLY)])
        elif device.type != "cuda":
            raise ValueError(f"backend {backend!r} needs --device cuda")
        else:
            kinds = {"all": None, "hw": nv.HW_GPU_ONLY, "gpu": nv.GPU_ONLY,
                     "hybrid": nv.HYBRID_CPU_GPU}
            kind = kinds[backend]
            self.dec = nv.Decoder(device_id=device.index or 0,
                                  backends=None if kind is None else [nv.Backend(kind)])
        self.params = nv.DecodeParams(apply_exif_orientation=True, color_spec=nv.SRGB,
                                      sample_format=nv.I_RGB)

    def __call__(self, datas: list, regions: list):
        if self.backend == "pil":
            return self._pil(datas, regions), []
        nv = self.nv
        streams = []
        for d, r in zip(datas, regions):
            cs = nv.CodeStream(d)
            streams.append(cs if r is None else cs.get_sub_code_stream(region=nv.Region(*r)))
        ptr = torch.cuda.current_stream().cuda_stream if self.device.type == "cuda" else 0
        imgs = self.dec.decode(streams, params=self.params, cuda_stream=ptr)
        bad = len(streams) - sum(i is not None for i in imgs)
        if bad:
            raise RuntimeError(f"{self.backend}: {bad} of {len(streams)} images not decoded")
        if self.device.type == "cuda":
            return [_on_device(i, self.device) for i in imgs], imgs
        return [torch.from_numpy(np.asarray(i)) for i in imgs], imgs

    def _pil(self, datas, regions):
        from pipelines.torch_backend.decode import pil_image

        out = []
        for d, r in zip(datas, regions):
            a = np.array(pil_image(d))
            out.append(torch.from_numpy(a if r is None else a[r[0]:r[2], r[1]:r[3]].copy())
                       .to(self.device))
        return out


def _on_device(img, device) -> torch.Tensor:
    """A decoded image as a tensor on its memory, through ``__cuda_array_interface__`` (DLPack
    where torch refuses that)."""
    try:
        return torch.as_tensor(img, device=device)
    except (TypeError, RuntimeError, ValueError):
        return torch.from_dlpack(img)


# -- one variant ------------------------------------------------------------------------------
class Batches:
    """Batch ``k`` of the sample stream, decoded and packed: ``(x, win, holders)``; ``x`` is
    the packed uint8 buffer (``bmm`` / ``bmmcat``) or the list of images (``interp`` / ``none``),
    ``win`` the ``N x 5`` windows in their coordinates."""

    def __init__(self, variant: str, data, idx, rows, batch: int, device):
        self.backend, self.crop, self.resize, self.mode = parse(variant)
        self.datas, self.sizes, self.oriented = data
        self.idx, self.rows, self.batch, self.device = idx, rows, batch, device
        self.decode = Decode("cpu" if self.backend == "cached" and device.type == "cpu"
                             else "all" if self.backend == "cached" else self.backend, device)
        self.cached = None

    def __call__(self, k: int):
        if self.backend == "cached":
            if self.cached is None:
                self.cached = self._make(0)
            return self.cached
        return self._make(k)

    def _make(self, k: int):
        sel = slice(k * self.batch, (k + 1) * self.batch)
        idx, win = self.idx[sel], self.rows[sel].copy()
        if len(idx) < self.batch:
            raise ValueError("the sample stream is too short (a bug in the batch count)")
        roi = (self.oriented[idx] == 1) if self.crop == "roi" else np.zeros(len(idx), bool)
        t, l, h, w = (win[:, c].astype(np.int64) for c in range(4))
        regions = [(int(a), int(b), int(a + c), int(b + d)) if r else None
                   for a, b, c, d, r in zip(t, l, h, w, roi)]
        imgs, holders = self.decode([self.datas[i] for i in idx], regions)
        want = np.where(roi[:, None], np.stack([h, w], 1), self.sizes[idx])
        for n, im in enumerate(imgs):  # a region or EXIF turn read wrongly shows here
            if tuple(im.shape) != (int(want[n, 0]), int(want[n, 1]), 3):
                raise RuntimeError(f"image {idx[n]}: decoded {tuple(im.shape)}, expected "
                                   f"{tuple(want[n])} x 3")
        win[roi, 0:2] = 0
        if self.resize in ("bmm", "bmmcat"):
            x = (pack_copy if self.resize == "bmm" else pack_cat)(imgs)
            return x, to_device(win, self.device), holders
        return imgs, win, holders


def resize(kind: str, x, win, out: int, dtype) -> torch.Tensor | None:
    if kind == "none":
        return None
    if kind == "interp":
        return finish(resize_naive(x, win, out))
    return finish(crop_resize(x, win, out, dtype))


class Prefetch:
    """``make(k)`` for k = 0, 1, ... on a thread and a CUDA stream of its own, ``depth`` ahead.
    ``next()`` returns the next item after making the current stream wait for it, and re-raises
    the thread's error."""

    def __init__(self, make, depth: int, device):
        self.q: queue.Queue = queue.Queue(depth)
        self.stop = threading.Event()
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.t = threading.Thread(target=self._run, args=(make,), daemon=True)
        self.t.start()

    def _run(self, make):
        k = 0
        try:
            while not self.stop.is_set():
                if self.cuda:
                    with torch.cuda.stream(self.stream):
                        item = make(k)
                        ev = torch.cuda.Event()
                        ev.record(self.stream)
                else:
                    item, ev = make(k), None
                self._put((item, ev))
                k += 1
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            self._put(e)

    def _put(self, v):
        while not self.stop.is_set():
            try:
                self.q.put(v, timeout=0.1)
                return
            except queue.Full:
                continue

    def next(self, timeout: float = 120.0):
        try:
            v = self.q.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"overlap: no batch from the decode thread in {timeout:.0f} s") \
                from None
        if isinstance(v, BaseException):
            raise v
        item, ev = v
        if ev is not None:  # the buffers were made on the thread's stream: used on this one
            cur = torch.cuda.current_stream()
            cur.wait_event(ev)
            for t in item[:2]:
                if isinstance(t, torch.Tensor):
                    t.record_stream(cur)
        return item

    def close(self):
        self.stop.set()
        self.t.join(timeout=30)


def run_variant(variant: str, data, idx, rows, args, device) -> dict:
    """One JSON record: img/s of ``--repeats`` runs of ``--batches`` batches."""
    make = Batches(variant, data, idx, rows, args.batch_size, device)
    out, dtype = args.out_size, getattr(torch, args.dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    pre = Prefetch(make, args.depth, device) if make.mode == "overlap" else None
    held = []  # the previous batch's decoded images and an event after its last reader
    k = 0

    def step():
        nonlocal k
        x, win, holders = pre.next() if pre else make(k)
        k += 1
        resize(make.resize, x, win, out, dtype)
        ev = None
        if device.type == "cuda":
            ev = torch.cuda.Event()
            ev.record()
        if held and held[0][0] is not None:
            held[0][0].synchronize()
        held[:] = [(ev, holders)]

    # a stream of our own: the legacy default stream would serialise with the decoder's
    ctx = torch.cuda.stream(torch.cuda.Stream(device)) if device.type == "cuda" else \
        contextlib.nullcontext()
    try:
        with ctx:
            for _ in range(args.warmup):
                step()
            rates = []
            for _ in range(args.repeats):
                sync()
                t0 = time.perf_counter()
                for _ in range(args.batches):
                    step()
                sync()
                rates.append(args.batches * args.batch_size / (time.perf_counter() - t0))
    finally:
        if pre:
            pre.close()
    med = statistics.median(rates)
    return {"variant": variant, "median_img_s": round(med, 1), "min_img_s": round(min(rates), 1),
            "max_img_s": round(max(rates), 1),
            "spread_pct": round(100 * (max(rates) - min(rates)) / med, 1),
            "batches": args.batches * args.repeats, "batch_size": args.batch_size,
            "rates": [round(r, 1) for r in rates]}


def parse(variant: str) -> tuple[str, str, str, str]:
    parts = variant.split(".")
    if len(parts) != 4 or parts[0] not in BACKENDS or parts[1] not in CROPS or \
            parts[2] not in RESIZES or parts[3] not in MODES:
        raise ValueError(f"--variants: {variant!r} is not BACKEND.CROP.RESIZE.MODE with BACKEND "
                         f"in {BACKENDS}, CROP in {CROPS}, RESIZE in {RESIZES}, MODE in {MODES}")
    return parts[0], parts[1], parts[2], parts[3]


# -- the run ----------------------------------------------------------------------------------
def check(data, idx, rows, batch: int, device, out: int, dtype) -> dict:
    """On one batch: the ``bmm`` resize against per-image ``interpolate`` (uint8 levels after
    rounding), ``bmmcat`` against ``bmm``, and the ``roi`` decode against the ``full`` one
    cropped (pixel levels)."""
    backend = "all" if device.type == "cuda" else "cpu"
    full = Batches(f"{backend}.full.interp.serial", data, idx, rows, batch, device)
    roi = Batches(f"{backend}.roi.interp.serial", data, idx, rows, batch, device)
    imgs, win, _ = full(0)
    crops, rwin, _ = roi(0)
    w = to_device(win, device)
    a = crop_resize(pack_copy(imgs), w, out, dtype).float().round().clamp(0, 255)
    b = resize_naive(imgs, win, out).round().clamp(0, 255)
    c = crop_resize(pack_cat(imgs), w, out, dtype).float().round().clamp(0, 255)
    roi_diff = 0
    for t, r, (top, left, h, wd) in zip(imgs, crops, win[:, :4].astype(np.int64)):
        ref = t[top:top + h, left:left + wd]
        if r.shape != ref.shape:
            raise RuntimeError(f"roi decode gave {tuple(r.shape)}, crop is {tuple(ref.shape)}")
        roi_diff = max(roi_diff, int((r.int() - ref.int()).abs().max()))
    return {"check": backend, "bmm_vs_interp_max_levels": float((a - b).abs().max()),
            "bmm_vs_interp_equal_frac": round(float((a == b).float().mean()), 5),
            "bmmcat_vs_bmm_max_levels": float((a - c).abs().max()),
            "roi_vs_full_decode_max_levels": roi_diff}


def environment(device, n: int, load_s: float, draw_s: float, sizes, datas, oriented) -> dict:
    env = {"env": True, "torch": torch.__version__, "device": str(device), "cpus": os.cpu_count(),
           "images": n, "load_s": round(load_s, 2), "draws_us_per_image": round(1e6 * draw_s, 2),
           "mean_kib": round(sum(map(len, datas)) / n / 1024, 1),
           "mean_hw": [round(float(v)) for v in sizes.mean(0)],
           "exif_oriented": int((oriented != 1).sum())}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    try:
        from nvidia import nvimgcodec
        env["nvimgcodec"] = getattr(nvimgcodec, "__version__", "?")
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        env["nvimgcodec"] = one_line(e)
    return env


def backends_ok(datas, device) -> dict:
    """Which decoders decode one image here (a missing hardware decoder or nvJPEG shows)."""
    res = {}
    for b in (("all", "hw", "gpu", "hybrid", "cpu") if device.type == "cuda" else ("cpu",)):
        try:
            imgs, _ = Decode(b, device)(datas[:1], [None])
            res[b] = "ok " + "x".join(map(str, imgs[0].shape))
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            res[b] = one_line(e)
    rec = {"backends": res}
    if device.type == "cuda" and res.get("all", "").startswith("ok") and \
            not any(res.get(b, "").startswith("ok") for b in ("hw", "gpu", "hybrid")):
        rec["warning"] = "no GPU decoder works here: the 'all' variants decode on the CPU"
    return rec


def one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:400]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.gpu_decode", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="ImageFolder-style folder of JPEGs")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--batches", type=int, default=30, help="timed batches per repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3, help="untimed batches first")
    p.add_argument("--variants", default="", help="comma list of BACKEND.CROP.RESIZE.MODE; "
                   "default: a set for the device")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    p.add_argument("--out-size", type=int, default=224)
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"),
                   help="matmul inputs of the bmm resize (fp32 accumulation)")
    p.add_argument("--depth", type=int, default=2, help="overlap: batches decoded ahead")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-limit", type=float, default=240.0,
                   help="seconds; variants not started by then are reported skipped")
    p.add_argument("--no-check", action="store_true", help="skip the accuracy line")
    args = p.parse_args(argv)
    for name in ("batch_size", "batches", "repeats", "depth", "out_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    if args.warmup < 0:
        p.error(f"--warmup={args.warmup} must be >= 0")
    start = time.perf_counter()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device (use --device cpu to test the math)")
    variants = [v for v in args.variants.split(",") if v] or \
        list(CUDA_VARIANTS if device.type == "cuda" else CPU_VARIANTS)
    try:
        for v in variants:
            parse(v)
        paths = list_jpegs(args.data)
    except ValueError as e:
        p.error(str(e))
    if device.type == "cuda":
        torch.cuda.set_device(device.index or 0)
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    datas, sizes, oriented = load(paths)
    load_s = time.perf_counter() - start
    count = (args.warmup + args.batches * args.repeats) * args.batch_size
    t0 = time.perf_counter()
    idx, rows = sample_stream(sizes, count, args.seed)
    draw_s = (time.perf_counter() - t0) / len(idx)
    data = (datas, sizes, oriented)
    print(json.dumps(environment(device, len(paths), load_s, draw_s, sizes, datas, oriented)),
          flush=True)
    print(json.dumps(backends_ok(datas, device)), flush=True)
    if not args.no_check:
        try:
            rec = check(data, idx, rows, min(args.batch_size, 64), device, args.out_size,
                        getattr(torch, args.dtype))
        except Exception as e:  # noqa: BLE001 - one line, then the variants
            rec = {"check": "failed", "error": one_line(e)}
        print(json.dumps(rec), flush=True)
    for v in variants:
        if time.perf_counter() - start > args.time_limit:
            print(json.dumps({"variant": v, "error": f"skipped: --time-limit {args.time_limit}s "
                              "reached"}), flush=True)
            continue
        t0 = time.perf_counter()
        try:
            rec = run_variant(v, data, idx, rows, args, device)
        except Exception as e:  # noqa: BLE001 - one line per variant, then the next
            rec = {"variant": v, "error": one_line(e)}
        rec["wall_s"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(rec), flush=True)
        gc.collect()  # the variant's decoders
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
