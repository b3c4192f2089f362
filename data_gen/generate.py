"""Parallel, reproducible generation of an ImageFolder dataset of real JPEGs, with a manifest."""
from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from .sources import load_sources
from .synth import make_jpeg

MANIFEST = "manifest.json"
GENERATOR_TAG = "gpu-feed data_gen v1"


@dataclass(frozen=True)
class GenConfig:
    """What to generate. The same values give byte-identical files.

    Args:
        out: output directory (ImageFolder layout: ``out/class_XXXX/img_XXXXXXX.jpg``).
        num_images: number of JPEGs.
        classes: number of class folders.
        seed: base seed.
        width_range: image width range in pixels (inclusive); heights follow mixed aspect ratios.
        quality_range: JPEG quality range (inclusive).
        workers: processes (default: all cores).
        force: allow writing into a non-empty directory that ``data_gen`` did not make.
    """

    out: str
    num_images: int = 1000
    classes: int = 10
    seed: int = 0
    width_range: Tuple[int, int] = (300, 800)
    quality_range: Tuple[int, int] = (75, 95)
    workers: Optional[int] = None
    force: bool = False

    def __post_init__(self) -> None:
        if self.num_images < 1:
            raise ValueError(f"num_images={self.num_images} must be >= 1")
        if self.classes < 1:
            raise ValueError(f"classes={self.classes} must be >= 1")
        lo, hi = self.width_range
        if not 16 <= lo <= hi <= 8192:
            raise ValueError(f"width_range={self.width_range} must satisfy 16 <= lo <= hi <= 8192")
        lo, hi = self.quality_range
        if not 1 <= lo <= hi <= 100:
            raise ValueError(f"quality_range={self.quality_range} must satisfy 1 <= lo <= hi <= 100")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers={self.workers} must be >= 1")

    def recipe(self) -> Dict:
        """The arguments that decide the bytes (not out, workers or force)."""
        d = asdict(self)
        for k in ("out", "workers", "force"):
            d.pop(k)
        return d


_SOURCES = None


def _init_worker() -> None:
    global _SOURCES
    _SOURCES = load_sources(verbose=False)


def _one(args) -> Dict:
    i, cfg = args
    label = i % cfg.classes
    rng = np.random.default_rng((cfg.seed, i))
    enc = make_jpeg(rng, _SOURCES, label, cfg.width_range, cfg.quality_range)
    rel = f"class_{label:04d}/img_{i:07d}.jpg"
    path = Path(cfg.out) / rel
    with open(path, "wb") as f:
        f.write(enc.data)
    return {
        "path": rel, "label": label, "width": enc.width, "height": enc.height,
        "bytes": len(enc.data), "sha256": hashlib.sha256(enc.data).hexdigest(),
        "mode": enc.mode, "subsampling": enc.subsampling, "progressive": enc.progressive,
        "quality": enc.quality, "source": enc.source,
    }


def read_manifest(out: str | os.PathLike) -> Optional[Dict]:
    """The manifest of a ``data_gen`` directory, or ``None`` when there is none."""
    p = Path(out) / MANIFEST
    if not p.is_file():
        return None
    try:
        m = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and m.get("generator") == GENERATOR_TAG else None


def _prepare_out(cfg: GenConfig) -> None:
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {str(out)!r} exists and is not a directory")
    if out.exists() and any(out.iterdir()):
        old = read_manifest(out)
        if old is None and not cfg.force:
            raise FileExistsError(
                f"--out {str(out)!r} is not empty and was not made by data_gen; "
                "choose another directory or pass --force"
            )
        if old is not None:  # our own earlier output: remove exactly what we wrote
            for rec in old.get("files", []):
                (out / rec["path"]).unlink(missing_ok=True)
            (out / MANIFEST).unlink()
    for c in range(cfg.classes):
        (out / f"class_{c:04d}").mkdir(parents=True, exist_ok=True)


def summarize(files: List[Dict]) -> Dict:
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


def generate(cfg: GenConfig, progress: bool = True) -> Dict:
    """Generate the dataset described by ``cfg`` and write its manifest.

    Returns:
        The manifest (also written to ``out/manifest.json``).
    """
    _prepare_out(cfg)
    sources = load_sources(verbose=True)
    workers = cfg.workers or max(1, os.cpu_count() or 1)
    jobs = [(i, cfg) for i in range(cfg.num_images)]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.num_images, unit="img", desc="data_gen", dynamic_ncols=True)
    files: List[Dict] = []
    if workers == 1:
        _init_worker()
        it = map(_one, jobs)
        for rec in it:
            files.append(rec)
            bar and bar.update(1)
    else:
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        with ctx.Pool(workers, initializer=_init_worker) as pool:
            for rec in pool.imap_unordered(_one, jobs, chunksize=16):
                files.append(rec)
                bar and bar.update(1)
    if bar:
        bar.close()
    files.sort(key=lambda r: r["path"])
    manifest = {
        "generator": GENERATOR_TAG,
        "args": cfg.recipe(),
        "sources": [n for n, _ in sources],
        "stats": summarize(files),
        "files": files,
    }
    (Path(cfg.out) / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def ensure_dataset(cfg: GenConfig, progress: bool = True) -> Path:
    """Generate ``cfg`` unless ``cfg.out`` already holds exactly that recipe (a cache)."""
    old = read_manifest(cfg.out)
    if old is not None and old.get("args") == json.loads(json.dumps(cfg.recipe())):
        if all((Path(cfg.out) / f["path"]).is_file() for f in old["files"]):
            return Path(cfg.out)
    generate(cfg, progress=progress)
    return Path(cfg.out)
