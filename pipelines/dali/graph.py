"""The DALI graph, a pure function of the loader's ``TvPlan``, ``LoaderConfig`` and
``DaliOptions`` (no iterator logic).

The plan is the loader's ``TransformPlan.dali_plan()`` (``pipelines.transforms.plan``): either
``AugmentSpec``'s recipe or the translation of the user's torchvision Compose, op by op as
torchvision computes it. Train: the random-resized-crop window, drawn on the host as torchvision
draws it, fused into the decoder (``decoders.image_slice``) -> resize to ``size`` ->
``crop_mirror_normalize`` with the fed flip as its mirror. The graph has no random operator:
every random number is a column of the row fed with each sample (``pipelines.dali.draws``;
``pipelines.transforms.draws`` NOTE [one plan]). Eval: decode -> resize the shorter side to
``resize_size`` -> centre crop -> ``crop_mirror_normalize``. With ``AugmentSpec``'s recipe the
sizes are columns of that row too (the epoch's, ``pipelines.resolution``), so one graph serves
every size ``set_resolution`` sets, with no rebuild.

With ``AugmentSpec(views=k)``, k > 1 (:func:`augment_views`), the decoder cannot fuse the crop:
each image is decoded whole, once, and each view slices its own fed window from it, resizes and
normalises; the k views are stacked per sample, which the loader turns into ``N * k`` rows
(``pipelines.transforms.draws`` NOTE [views]).

On a GPU the decoder is ``device="mixed"`` (nvJPEG, with the hardware JPEG decoder taking
``hw_decoder_load`` of the images where the GPU has one) and the rest runs on the GPU; with
``DaliOptions.decode_on="cpu"`` the decoder (with a fused crop and its resize) runs on the CPU
and its output moves to the GPU for the rest. With ``device_id=None`` the same graph runs on
CPU operators (how CI tests it).
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, cast

from nvidia.dali import fn, pipeline_def, types

from pipelines.config import DecodeOn, LoaderConfig, OutputDType
from pipelines.dali import draws, geometry
from pipelines.options import DaliOptions
from pipelines.transforms.draws import DrawPlan, Step
from pipelines.transforms.migrate import Op, Problem, TvPlan, UnsupportedTransformError
from pipelines.transforms.migrate.ops import build, entry

# uint8 -> the output dtype that DALI can produce directly (bf16 is cast in torch); uint8 output
# is not normalised (OutputDType.UINT8).
DALI_DTYPE = {
    OutputDType.FLOAT32: types.FLOAT,
    OutputDType.BFLOAT16: types.FLOAT,
    OutputDType.FLOAT16: types.FLOAT16,
    OutputDType.UINT8: types.UINT8,
}
OUTPUTS = ("images", "labels", "indices")

# A graph that draws nothing (eval) leaves the row of draws unused; the source then feeds one
# zero per sample, so DALI's hint to compute only the outputs used does not apply.
warnings.filterwarnings("ignore", message=r"The external source node .* produces 3 outputs, "
                        r"but the output at the index 2 is not used")


def decodes_on_gpu(opt: DaliOptions, gpu: bool) -> bool:
    """Whether the decoder is the mixed one (nvJPEG): on a GPU, unless ``decode_on="cpu"``."""
    return gpu and opt.decode_on is DecodeOn.GPU


def decoder_kwargs(opt: DaliOptions, gpu: bool) -> dict:
    """nvJPEG / hardware-decoder tuning; only the mixed decoder accepts these."""
    if not decodes_on_gpu(opt, gpu):
        return {}
    kw = dict(
        hw_decoder_load=opt.load_for(),  # resolved by the loader; unresolved "auto" is 0.0
        device_memory_padding=opt.device_memory_padding,
        host_memory_padding=opt.host_memory_padding,
    )
    if opt.preallocate_width_hint:
        kw["preallocate_width_hint"] = opt.preallocate_width_hint
    if opt.preallocate_height_hint:
        kw["preallocate_height_hint"] = opt.preallocate_height_hint
    return kw


def augment(jpegs, plan: TvPlan, cfg: LoaderConfig, dec_kw: dict, gpu: bool,
            mixed: bool | None = None):
    """The augmentation graph on encoded JPEGs, from a ``TvPlan``; returns normalised images
    (the crop's uint8 pixels with ``OutputDType.UINT8``).

    Each op is built by its op registry entry (``pipelines.transforms.migrate.ops``). A leading op whose
    entry can ``decode`` (random-resized-crop: only the crop window is decoded) is fused into
    the decoder; a trailing op whose entry gives a ``mirror`` (horizontal flip) is fused into
    ``crop_mirror_normalize``, and so is the plan's last value map (``mean`` / ``std``).
    ``mixed``: the decoder is nvJPEG (default: on a GPU); on a GPU without it, the decoder's
    output moves to the GPU after the decode (and the fused crop's resize).
    """
    mixed = gpu if mixed is None else mixed
    dec = "mixed" if mixed else "cpu"
    ops = list(plan.ops)
    if ops and entry(ops[0]).decode is not None:
        op = ops.pop(0)
        _building(op)
        images = cast("Callable[..., Any]", entry(op).decode)(jpegs, op, dec, dec_kw)  # checked above
    else:
        images = _decode(jpegs, dec, dec_kw)
    if gpu and not mixed:
        images = images.gpu()  # DecodeOn.CPU: the rest of the recipe runs on the GPU
    return _finish(images, ops, plan, cfg)


def augment_views(jpegs, row, plan: TvPlan, cfg: LoaderConfig, dec_kw: dict, gpu: bool,
                  mixed: bool, views: int):
    """``AugmentSpec.views`` > 1: each image decoded whole once, then the plan run on it once
    per view, view ``v`` taking its columns of the fed ``row`` (the ``v``-th block of
    ``width`` columns; ``pipelines.transforms.draws`` NOTE [views]). A leading op that
    :func:`augment` fuses into the decoder slices its host-drawn window from the decoded
    image instead (``geometry.window_random_resized_crop``).

    Returns:
        ``(images, draw_plan)``: per sample the ``views`` normalised images stacked on a new
        leading axis, and the row layout (a ``DrawPlan`` with ``views``).
    """
    images = _decode(jpegs, "mixed" if mixed else "cpu", dec_kw)
    if gpu and not mixed:
        images = images.gpu()
    ops = list(plan.ops)
    first = ops.pop(0) if ops and entry(ops[0]).decode is not None else None
    outs: list = []
    steps: tuple[Step, ...] = ()
    width = 0
    for v in range(views):
        with draws.building(row if v == 0 else row[v * width:(v + 1) * width]) as fed:
            x = images
            if first is not None:
                _building(first)
                x = geometry.window_random_resized_crop(x, first)
            outs.append(_finish(x, ops, plan, cfg))
        if v == 0:
            steps, width = tuple(fed.steps), fed.width
        elif tuple(fed.steps) != steps:  # pragma: no cover - the same ops take the same steps
            raise RuntimeError(f"view {v} draws other numbers than view 0")
    return fn.stack(*outs), DrawPlan(steps, views)


def _augmented(jpegs, row, plan: TvPlan, cfg: LoaderConfig, dec_kw: dict, gpu: bool,
               mixed: bool):
    """``(images, draw_plan)``: :func:`augment`, or :func:`augment_views` for ``views`` > 1,
    taking its random numbers from the fed ``row``."""
    if cfg.augment.views > 1:
        return augment_views(jpegs, row, plan, cfg, dec_kw, gpu, mixed, cfg.augment.views)
    with draws.building(row) as fed:
        images = augment(jpegs, plan, cfg, dec_kw, gpu, mixed)
    return images, fed.plan()


def _decode(jpegs, dec: str, dec_kw: dict):
    return fn.decoders.image(jpegs, device=dec, output_type=types.RGB,
                             jpeg_fancy_upsampling=True, **dec_kw)


def _finish(images, ops: list[Op], plan: TvPlan, cfg: LoaderConfig):
    """The plan's ``ops`` after the decode on ``images``, then ``crop_mirror_normalize`` (a
    trailing flip fused as its mirror)."""
    ops = list(ops)
    kw = {}
    last = ops.pop() if ops and entry(ops[-1]).mirror is not None else None
    for op in ops:
        images = _apply(images, op)
    if last is not None:  # drawn after the ops before it, in the transforms' order
        _building(last)
        kw["mirror"] = cast("Callable[[Op], Any]", entry(last).mirror)(last)  # checked above
    _building(None)
    mean, std = plan.mean, plan.std
    if cfg.dtype is OutputDType.UINT8 and cfg.transform is None:  # the model normalises
        mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    return fn.crop_mirror_normalize(
        images, dtype=DALI_DTYPE[cfg.dtype], output_layout="HWC" if cfg.channels_last else "CHW",
        mean=list(mean), std=list(std), **kw)


def conditional(plan: TvPlan) -> bool:
    """Whether ``plan`` needs DALI's conditional execution (a per-sample branch)."""
    return any(entry(op).conditional for op in plan.ops)


_BUILDING: list[Op] = []  # the op whose graph is being built (for ``_graph_error``)


def _apply(images, op: Op):
    """One translated torchvision op on decoded HWC images (uint8, or float after ``affine``):
    its op registry entry's builder (``pipelines.transforms.migrate.ops``)."""
    _building(op)
    return build(images, op)


def _building(op: Op | None) -> None:
    _BUILDING.clear()
    if op is not None:
        _BUILDING.append(op)


def _graph_error(err: BaseException) -> UnsupportedTransformError:
    """One line for a DALI or AutoGraph error met while the graph of a translated op was being
    built: the transform (its op kind and parameters) and DALI's own last line. Translation
    refuses what it knows DALI cannot run; this is the net under it."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    why = lines[-1] if lines else type(err).__name__
    op = _BUILDING[0]
    names = " / ".join(entry(op).torchvision) or op.kind
    params = ", ".join(f"{k}={v!r}" for k, v in op.args if k != "ops")
    return UnsupportedTransformError(
        f"DALI cannot build {names} ({params}): {why}. The torch backends run this transform",
        [Problem(-1, names, params, why)])


def _resolve(ops) -> None:
    """Import the builder of every op, those inside branches (an ``ops`` argument) too."""
    for op in ops:
        b = entry(op).build
        if hasattr(b, "resolve"):
            b.resolve()
        inner = dict(op.args).get("ops")
        if inner:
            _resolve(inner)


def build_pipeline(cfg: LoaderConfig, opt: DaliOptions, plan: TvPlan, source: Callable,
                   device_id: int | None, lane: int = 0, encoded: bool = False):
    """Build the pipeline reading ``(jpegs, labels, indices)`` batches from ``source``; its
    ``draw_plan`` attribute is the layout of the fed rows of draws (``pipelines.transforms.draws``).

    Args:
        cfg: the loader config (batch size, threads, seed, dtype, layout).
        opt: the DALI options (queue depth, pipelines, decoder knobs, mmap).
        plan: the augmentation, as the loader's ``TransformPlan.dali_plan()``.
        source: a DALI batch callable taking ``BatchInfo`` and returning ``(paths, meta,
            draws)`` (see ``pipelines.dali.source``); it must keep fed buffers alive
            (``no_copy``).
        device_id: the CUDA device, or ``None`` for a CPU-only pipeline.
        lane: which of the ``opt.pipelines`` side-by-side pipelines this is; it gets
            ``num_workers // pipelines`` threads.
        encoded: ``source`` gives encoded images, not paths (tar shards;
            ``pipelines.dali.source`` NOTE [bytes]).
    """
    gpu = device_id is not None
    dec_kw = decoder_kwargs(opt, gpu)
    _resolve(plan.ops)  # import each builder now, outside the traced graph

    # exec_dynamic: newer than the keywords DALI's stub for pipeline_def lists
    @pipeline_def(  # type: ignore[call-overload]
        batch_size=cfg.batch_size,
        num_threads=max(1, cast(int, cfg.num_workers) // cast(int, opt.pipelines)),  # both set by now
        device_id=device_id,
        prefetch_queue_depth=opt.queue_depth,
        seed=0,  # unused: the graph has no random operator
        enable_conditionals=conditional(plan),
        exec_dynamic=True,  # DALI's default executor (the pipelined one was no faster)
    )
    def graph():
        paths, meta, row = fn.external_source(
            source=source, num_outputs=3, batch=True, batch_info=True,
            dtype=[types.UINT8, types.INT64, types.FLOAT], ndim=[1, 1, 1], no_copy=True,
        )
        # Read in DALI's C++ threads (see pipelines.dali.source). Plain reads, not mmap, by
        # default (DaliOptions.use_mmap; docs/results/h200/dali-io-probe).
        jpegs = paths if encoded else fn.io.file.read(paths, dont_use_mmap=not opt.use_mmap)
        labels, indices = meta[0:1], meta[1:2]
        images, drawn = _augmented(jpegs, row, plan, cfg, dec_kw, gpu, decodes_on_gpu(opt, gpu))
        rows.append(drawn)
        if gpu:
            labels = labels.gpu()
        return images, labels, indices

    _BUILDING.clear()
    rows: list = []
    try:
        pipe = graph()
        pipe.draw_plan = rows[0]
        return pipe
    except Exception as e:  # the graph is traced here (DALI / AutoGraph errors)
        if not _BUILDING:
            raise
        raise _graph_error(e) from None
    finally:
        _BUILDING.clear()
