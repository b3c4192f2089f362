"""Parallel, reproducible generation of a dataset of real JPEGs, with a manifest: an ImageFolder,
a file list, or WebDataset tar shards."""
from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import numbers
import os
import signal
import sys
import tarfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .outdir import (
    GENERATOR_TAG,
    MANIFEST,
    Kind,
    Replace,
    Target,
    manifest_paths,
    read_manifest,
    survey,
    unlink_and_prune,
)
from .partial import Partial, plain_os_errors
from .sources import load_sources
from .synth import make_jpeg

__all__ = ["GENERATOR_TAG", "MANIFEST", "GenConfig", "Kind", "ensure_dataset", "generate",
           "read_manifest", "summarize"]


@dataclass(frozen=True)
class GenConfig:
    """What to generate. The same values give byte-identical files.

    Args:
        out: output directory (its files depend on ``layout``).
        num_images: number of JPEGs.
        classes: number of class folders.
        seed: base seed.
        width_range: image width range in pixels (inclusive); heights follow mixed aspect ratios.
        quality_range: JPEG quality range (inclusive).
        mix_formats: write every 8th image (from the 2nd) as PNG, every 8th from the 4th as
            lossy WebP and every 8th from the 6th as BMP, the rest as JPEG (``--mix-formats``):
            a folder as real datasets are, with formats both engines decode.
        layout: ``"folder"`` (ImageFolder: ``class_XXXX/img_XXXXXXX.jpg``), ``"list"`` (the
            same images in one flat ``images/`` folder plus ``labels.csv`` with ``path`` and
            ``label`` columns, the label a class name: a file-list dataset, ``--format list``) or
            ``"wds"`` (the same images in WebDataset tar shards ``shard-NNNNNN.tar``, in a seeded
            shuffled order so shards are not sorted by class; each sample is ``<key>.<ext>`` then
            ``<key>.cls``, the key the image's index and the label its class index as ASCII
            digits: ``--format wds``).
        shard_size: samples per shard with ``layout="wds"``, the last shard holding the rest
            (``--shard-size``); other layouts ignore it, and it is not part of their recipe.
        target: ``"class"`` (default), ``"multilabel"`` or ``"regression"`` (``--target``;
            list and wds layouts only): what else each sample carries besides its class.
            ``multilabel``: the classes ``multilabels(i)`` (its own and at times a second), as
            a ``labels`` column of class names joined by ``;`` in ``labels.csv``, or a
            ``<key>.txt`` of class ids joined by spaces; ``regression``: the image's
            ``width`` and ``height`` as numeric ``labels.csv`` columns, or in a ``<key>.json``
            (``{"label": c, "width": w, "height": h}``). Load them with
            ``LoaderConfig(target="multilabel")`` or ``target=("width", "height")``.
        workers: processes (default: all cores).
        force: write beside files that ``data_gen`` did not write (they stay; a warning counts
            them), and replace a data_gen output of another kind (``--force``).
    """

    out: str
    num_images: int = 1000
    classes: int = 10
    seed: int = 0
    width_range: tuple[int, int] = (300, 800)
    quality_range: tuple[int, int] = (75, 95)
    mix_formats: bool = False
    layout: str = "folder"
    shard_size: int = 1000
    target: str = "class"
    workers: int | None = None
    force: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.out, (str, os.PathLike)) or not str(self.out):
            raise TypeError(f"out={self.out!r} (--out) must be a folder path")
        _int(self, "num_images", 1)
        _int(self, "classes", 1)
        _int(self, "seed", 0)
        _int(self, "shard_size", 1)
        if self.workers is not None:
            _int(self, "workers", 1)
        if self.classes > self.num_images:
            raise ValueError(f"classes={self.classes} (--classes) must be <= num_images="
                             f"{self.num_images} (--num-images): every class needs an image")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout={self.layout!r} (--format) must be one of "
                             f"{', '.join(LAYOUTS)}")
        if self.target not in TARGETS:
            raise ValueError(f"target={self.target!r} (--target) must be one of "
                             f"{', '.join(TARGETS)}")
        if self.target != "class" and self.layout == "folder":
            raise ValueError(f"target={self.target!r} (--target) needs --format list or wds: a "
                             "folder gives one class per image")
        lo, hi = _pair(self, "width_range")
        if not 16 <= lo <= hi <= 8192:
            raise ValueError(f"width_range={self.width_range} (--width-range) must satisfy "
                             "16 <= lo <= hi <= 8192")
        lo, hi = _pair(self, "quality_range")
        if not 1 <= lo <= hi <= 100:
            raise ValueError(f"quality_range={self.quality_range} (--quality-range) must satisfy "
                             "1 <= lo <= hi <= 100")

    def recipe(self) -> dict:
        """The arguments that decide the bytes (not out, workers or force; shard_size only for
        the wds layout; target only when it is not ``"class"``, so older recipes still match)."""
        d = asdict(self)
        for k in ("out", "workers", "force") + (() if self.layout == "wds" else ("shard_size",)):
            d.pop(k)
        if self.target == "class":
            d.pop("target")
        return d


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _int(cfg: GenConfig, name: str, lo: int) -> None:
    """Check ``cfg.<name>`` is an int (not a bool) >= ``lo``; store it as a plain int."""
    v = getattr(cfg, name)
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name}={v!r} ({_option(name)}) must be an int")
    if v < lo:
        raise ValueError(f"{name}={v} ({_option(name)}) must be >= {lo}")
    object.__setattr__(cfg, name, int(v))


def _pair(cfg: GenConfig, name: str) -> tuple[int, int]:
    """Check ``cfg.<name>`` is two ints; store it as a tuple."""
    v = getattr(cfg, name)
    try:
        lo, hi = v
    except (TypeError, ValueError):
        raise TypeError(f"{name}={v!r} ({_option(name)}) must be two ints (LO, HI)") from None
    if any(isinstance(x, bool) or not isinstance(x, numbers.Integral) for x in (lo, hi)):
        raise TypeError(f"{name}={v!r} ({_option(name)}) must be two ints (LO, HI)")
    object.__setattr__(cfg, name, (int(lo), int(hi)))
    return int(lo), int(hi)


LAYOUTS = ("folder", "list", "wds")
TARGETS = ("class", "multilabel", "regression")
REGRESSION = ("width", "height")  # the columns / JSON keys of target="regression"
LIST_FILE = "labels.csv"
SHARD_SHUFFLE = 0x5AD  # the spawn key of the shard order's random stream
MIXED = {1: "png", 3: "webp", 5: "bmp"}  # i % 8 -> format with --mix-formats; others JPEG


def image_format(cfg: GenConfig, i: int) -> str:
    """The format of image ``i``: ``"jpg"``, or with ``mix_formats`` one of ``MIXED``."""
    return MIXED.get(i % 8, "jpg") if cfg.mix_formats else "jpg"


def image_path(cfg: GenConfig, i: int) -> str:
    """Where image ``i`` goes, relative to ``out`` (with ``layout="wds"``, relative to the partial
    folder's ``data/``, until it is packed into a shard)."""
    folder = "images" if cfg.layout in ("list", "wds") else f"class_{i % cfg.classes:04d}"
    return f"{folder}/img_{i:07d}.{image_format(cfg, i)}"


def class_name(label: int) -> str:
    return f"class_{label:04d}"


def multilabels(i: int, classes: int) -> list[int]:
    """The classes of image ``i`` with ``target="multilabel"``: its class ``i % classes``, and
    every third image also ``(i // 3) % classes`` (sorted, distinct)."""
    return sorted({i % classes} | ({(i // 3) % classes} if i % 3 == 0 else set()))


def _index(rec: dict) -> int:
    return int(Path(rec["path"]).stem.split("_")[-1])


def _label_list(cfg: GenConfig, images: list[dict]) -> dict[str, bytes]:
    """``labels.csv`` of a ``layout="list"`` dataset: every image, its class name and, with
    ``cfg.target``, its multi-label cell or regression columns."""
    head, rows = "path,label", []
    if cfg.target == "multilabel":
        head += ",labels"
    elif cfg.target == "regression":
        head += "," + ",".join(REGRESSION)
    for r in sorted(images, key=lambda r: r["path"]):
        row = f"{r['path']},{class_name(r['label'])}"
        if cfg.target == "multilabel":
            row += "," + ";".join(class_name(c) for c in multilabels(_index(r), cfg.classes))
        elif cfg.target == "regression":
            row += "," + ",".join(str(r[k]) for k in REGRESSION)
        rows.append(row + "\n")
    return {LIST_FILE: (head + "\n" + "".join(rows)).encode()}


def shard_name(n: int) -> str:
    return f"shard-{n:06d}.tar"


def sample_key(i: int) -> str:
    """The WebDataset key of image ``i`` (its index, as in ``image_path``)."""
    return f"{i:08d}"


def shard_order(cfg: GenConfig) -> np.ndarray:
    """The image indices in the order the wds layout's shards hold them: a seeded permutation.

    Shards are read in order with a bounded shuffle buffer, so they must not be sorted by class.
    The stream is spawned from ``cfg.seed`` (not ``(seed, k)``, which is image ``k``'s stream).
    """
    seq = np.random.SeedSequence(cfg.seed, spawn_key=(SHARD_SHUFFLE,))
    return np.random.default_rng(seq).permutation(cfg.num_images)


class _Hashing:
    """A write-only file object that counts and hashes what is written through it."""

    def __init__(self, f):
        self.f, self.sha, self.n = f, hashlib.sha256(), 0

    def write(self, b) -> int:
        self.f.write(b)
        self.sha.update(b)
        self.n += len(b)
        return len(b)

    def tell(self) -> int:
        return self.n


def _member(name: str, size: int) -> tarfile.TarInfo:
    """A tar header that depends only on the name and size (so shards are reproducible)."""
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode, ti.type = size, 0, 0o644, tarfile.REGTYPE
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


def _write_shards(cfg: GenConfig, partial: Partial, images: list[dict],
                  progress: bool) -> tuple[list[dict], list[dict]]:
    """Pack the rendered images into tar shards in ``partial.data``, then delete the images.

    The shards are not journalled: a resumed run packs them again from the journalled images.

    Returns:
        The shards' file records (with ``samples``), and every image's record in shard order,
        its ``path`` replaced by ``key`` and ``shard``.
    """
    import io

    by_path = {r["path"]: r for r in images}
    order = shard_order(cfg).tolist()
    starts = range(0, len(order), cfg.shard_size)
    shards: list[dict] = []
    samples: list[dict] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(starts), unit="shard", desc="data_gen shards", dynamic_ncols=True)
    try:
        for n, start in enumerate(starts):
            name = shard_name(n)
            idx = order[start:start + cfg.shard_size]
            with open(partial.data / name, "wb") as f:
                h = _Hashing(f)
                with tarfile.open(fileobj=h, mode="w", format=tarfile.USTAR_FORMAT) as tar:
                    for i in idx:
                        rec, key = by_path[image_path(cfg, i)], sample_key(i)
                        data = (partial.data / rec["path"]).read_bytes()
                        cls = str(rec["label"]).encode("ascii")
                        tar.addfile(_member(f"{key}.{rec['format']}", len(data)), io.BytesIO(data))
                        tar.addfile(_member(f"{key}.cls", len(cls)), io.BytesIO(cls))
                        for ext, extra in _extra_members(cfg, i, rec):
                            tar.addfile(_member(f"{key}.{ext}", len(extra)), io.BytesIO(extra))
                        samples.append({"key": key, "shard": name,
                                        **{k: v for k, v in rec.items() if k != "path"}})
            shards.append({"path": name, "bytes": h.n, "sha256": h.sha.hexdigest(),
                           "samples": len(idx)})
            bar and bar.update(1)
    finally:
        if bar:
            bar.close()
    for rec in images:  # only the shards go into place
        unlink_and_prune(partial.data, rec["path"])
    return shards, samples


def _extra_members(cfg: GenConfig, i: int, rec: dict) -> list[tuple[str, bytes]]:
    """A wds sample's members beside its image and ``.cls``, for ``cfg.target``."""
    if cfg.target == "multilabel":
        return [("txt", " ".join(map(str, multilabels(i, cfg.classes))).encode("ascii"))]
    if cfg.target == "regression":
        obj = {"label": rec["label"], **{k: rec[k] for k in REGRESSION}}
        return [("json", json.dumps(obj, sort_keys=True).encode("ascii"))]
    return []


def _reencode(jpeg: bytes, fmt: str) -> bytes:
    """The JPEG's pixels in another format (PNG and BMP lossless, WebP at quality 90)."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(jpeg)) as im:
        out = io.BytesIO()
        im.convert("RGB").save(out, {"png": "PNG", "webp": "WEBP", "bmp": "BMP"}[fmt],
                               **({"quality": 90} if fmt == "webp" else {}))
    return out.getvalue()


_SOURCES = None


def _init_worker() -> None:
    global _SOURCES
    _SOURCES = load_sources(verbose=False)


def _init_pool_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent stops the pool, quietly
    _init_worker()


def _one(args) -> dict:
    i, cfg, folder = args
    label = i % cfg.classes
    rng = np.random.default_rng((cfg.seed, i))
    enc = make_jpeg(rng, _SOURCES, label, cfg.width_range, cfg.quality_range)
    rel = image_path(cfg, i)
    fmt = image_format(cfg, i)
    data = enc.data if fmt == "jpg" else _reencode(enc.data, fmt)
    with open(Path(folder) / rel, "wb") as f:
        f.write(data)
    return {
        "path": rel, "label": label, "width": enc.width, "height": enc.height, "format": fmt,
        "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
        "mode": enc.mode, "subsampling": enc.subsampling, "progressive": enc.progressive,
        "quality": enc.quality, "source": enc.source,
    }


def _render(cfg: GenConfig, partial: Partial, progress: bool) -> list[dict]:
    """Make the images the partial folder does not hold yet; returns every image's record."""
    paths = [image_path(cfg, i) for i in range(cfg.num_images)]
    files = [partial.done[p] for p in paths if p in partial.done]
    jobs = [(i, cfg, str(partial.data)) for i, p in enumerate(paths) if p not in partial.done]
    for c in range(cfg.classes):
        (partial.data / image_path(cfg, c)).parent.mkdir(exist_ok=True)
    bar = None
    if progress:
        from tqdm import tqdm

        if files:
            print(f"data_gen: resuming an interrupted run: {len(files)} of {len(paths)} images "
                  "are already made", file=sys.stderr)
        bar = tqdm(total=len(paths), initial=len(files), unit="img", desc="data_gen",
                   dynamic_ncols=True)

    def finished(rec: dict) -> None:
        partial.record(rec)  # the worker has closed the file
        files.append(rec)
        bar and bar.update(1)

    workers = min(cfg.workers or max(1, os.cpu_count() or 1), len(jobs))
    try:
        if workers == 1:
            _init_worker()
            for rec in map(_one, jobs):
                finished(rec)
        elif workers > 1:
            ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
            with ctx.Pool(workers, initializer=_init_pool_worker) as pool:
                for rec in pool.imap_unordered(_one, jobs, chunksize=16):
                    finished(rec)
    finally:
        if bar:
            bar.close()
    return sorted(files, key=lambda r: r["path"])


def summarize(files: list[dict]) -> dict:
    b = np.array([f["bytes"] for f in files], dtype=np.float64)
    w = np.array([f["width"] for f in files])
    h = np.array([f["height"] for f in files])
    count = lambda k, v: int(sum(1 for f in files if f[k] == v))  # noqa: E731
    return {
        "num_images": len(files),
        "total_bytes": int(b.sum()),
        "mean_kib": round(float(b.mean()) / 1024, 2),
        "median_kib": round(float(np.median(b)) / 1024, 2),
        "width_min_max": [int(w.min()), int(w.max())],
        "height_min_max": [int(h.min()), int(h.max())],
        "mean_megapixels": round(float((w * h).mean()) / 1e6, 4),
        "subsampling_420": count("subsampling", "4:2:0"),
        "subsampling_444": count("subsampling", "4:4:4"),
        "grayscale": count("mode", "L"),
        "progressive": count("progressive", True),
    }


def progress_shown() -> bool:
    """Whether progress bars are drawn: as ``GPU_FEED_PROGRESS`` says when it is set (``0`` or
    ``1``), else when stdout is a terminal, so that a log file, CI or a pipe keeps only the
    lines the commands print (``compare.progress`` draws its bars by the same rule)."""
    env = os.environ.get("GPU_FEED_PROGRESS", "").strip().lower()
    if env in ("0", "off", "no", "false"):
        return False
    if env in ("1", "on", "yes", "true"):
        return True
    return sys.stdout.isatty()


def generate(
    cfg: GenConfig,
    progress: bool | None = None,
    *,
    kind: Kind = Kind.DATASET,
    extra: Callable[[Path, list[dict]], dict[str, bytes]] | None = None,
    target: Target | None = None,
) -> dict:
    """Generate the dataset described by ``cfg`` and write its manifest.

    The files are made in a partial folder next to ``cfg.out`` and renamed into place when all
    are there; an interrupted run is resumed by the next one (NOTE [atomic output] in
    ``partial.py``). Only files an earlier data_gen run wrote are ever replaced.

    Args:
        cfg: what to generate, and where.
        progress: show a progress bar (``None``: ``progress_shown()``).
        kind: what the manifest says the folder holds.
        extra: ``(folder, image records) -> {relative path: bytes}``: more files to write beside
            the images (the bad-inputs corpus); the manifest lists them too.
        target: how to name the folder in errors and what may be replaced there (default:
            ``--out cfg.out``, with ``cfg.force``).

    Returns:
        The manifest (also written to ``out/manifest.json``). Its ``files`` are what ``out``
        holds; with ``layout="wds"`` those are the shards, and ``samples`` lists the images.

    Raises:
        FileExistsError: ``out`` holds files data_gen did not write (without ``force``), or a
            data_gen output of another kind.
        ValueError: the manifest already in ``out`` lists a path outside it.
        OSError: ``out`` cannot be written (one line that names it).
    """
    target = target or Target.cli("--out", cfg.out, cfg.force)
    progress = progress_shown() if progress is None else progress
    with plain_os_errors(target.label):
        existing = survey(target, kind)  # refuse before anything is written
        args = cfg.recipe()
        partial = Partial(target, {"generator": GENERATOR_TAG, "kind": kind.value, "args": args})
        try:
            sources = load_sources(verbose=True)
            images = _render(cfg, partial, progress)
            more = extra(partial.data, images) if extra else {}
            if cfg.layout == "list":
                more.update(_label_list(cfg, images))
            stats, placed, samples = summarize(images), images, {}
            if cfg.layout == "wds":  # the shards go into place instead of the images
                placed, recs = _write_shards(cfg, partial, images, progress)
                stats["shards"] = len(placed)
                samples = {"samples": recs}
            files = placed + [partial.write(rel, data) for rel, data in more.items()]
            manifest = {
                "generator": GENERATOR_TAG,
                "kind": kind.value,
                "args": args,
                "sources": [n for n, _ in sources],
                "stats": stats,
                "files": sorted(files, key=lambda r: r["path"]),
                **samples,
            }
            existing = survey(target, kind)  # again: the folder may have changed meanwhile
            partial.commit(manifest, existing)
        finally:
            partial.close()
    if existing.foreign:
        print(f"data_gen: warning: {target.label} holds {len(existing.foreign)} files that "
              f"data_gen did not write; they stay, and {MANIFEST} does not list them",
              file=sys.stderr)
    return manifest


def ensure_dataset(cfg: GenConfig, progress: bool | None = None,
                   elsewhere: str = "choose another folder") -> Path:
    """Generate ``cfg`` unless ``cfg.out`` already holds exactly that recipe (a cache).

    The cache folder is the program's own: an earlier data_gen output there (another recipe,
    missing files, the other kind) is replaced and an interrupted run is resumed, without
    ``force``. Files data_gen did not write are never touched; they make it raise.

    Args:
        cfg: the dataset; ``cfg.out`` is the cache folder.
        progress: show a progress bar when generating (``None``: ``progress_shown()``).
        elsewhere: how the user picks another folder, for the error about foreign files.

    Raises:
        FileExistsError: the folder holds files data_gen did not write.
        ValueError: its manifest lists a path outside it.
    """
    out = Path(cfg.out)
    target = Target(out.resolve(), f"dataset cache {str(out)!r}",
                    Replace.FORCE if cfg.force else Replace.ANY_KIND, f"delete it or {elsewhere}")
    old = read_manifest(out)
    if (old is not None and old.get("kind", Kind.DATASET.value) == Kind.DATASET.value
            and old.get("args") == json.loads(json.dumps(cfg.recipe()))):
        try:
            paths = manifest_paths(target.path, old, target.label)
        except ValueError:
            paths = None  # generate() says why
        if paths is not None and all((out / p).is_file() for p in paths):
            return out
    generate(cfg, progress=progress, target=target)
    return out
