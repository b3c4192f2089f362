"""The conversion run: list the source, plan the shards, convert on every core, write shard by
shard (``manifest`` NOTE [the output folder]), resume what an interrupted run left."""
from __future__ import annotations

import io
import json
import math
import multiprocessing as mp
import numbers
import os
import shutil
import signal
import sys
import tarfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, cast

import numpy as np

from data_gen.generate import _Hashing, _member  # one reproducible tar writer
from pipelines.sources import remote
from pipelines.sources.root import Source, SourceKind, open_source, root_base

from . import manifest as mf
from .photo import Done, Where, convert_chunk

CHUNK = 16  # photos per task: the pool's overhead is per task
SHUFFLE = 0xC0  # the spawn key of a folder or list source's sample order


@dataclass(frozen=True)
class ConvertConfig:
    """What to convert, and how.

    Args:
        src: any root the loader reads (``LoaderConfig.root``): a folder, a file list, tar
            shards, remote shards (a URL pattern or a list of URLs).
        out: the output folder (new, empty, or an earlier run's to resume).
        max_side: the longer side of a converted photo, in pixels; smaller photos keep their
            bytes.
        quality: the JPEG quality of the converted photos.
        shard_size: samples per output shard (the last holds the rest).
        seed: the order of a folder's or file list's samples in the shards (a seeded
            permutation, so shards are not sorted by class); shards keep their order.
        target: as ``LoaderConfig.target``: ``"class"``, ``"multilabel"``, ``"none"`` or a
            tuple of column names; what each sample's label members carry.
        workers: processes (default: all cores).
        storage_options: for ``s3://`` sources, keyword arguments of ``s3fs.S3FileSystem``.
    """

    src: object
    out: str
    max_side: int = 512
    quality: int = 90
    shard_size: int = 1000
    seed: int = 0
    target: object = "class"
    workers: int | None = None
    storage_options: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.out, (str, os.PathLike)) or not str(self.out):
            raise TypeError(f"out={self.out!r} (--out) must be a folder path")
        for name, lo, hi in (("max_side", 16, 65535), ("quality", 1, 100),
                             ("shard_size", 1, 10**7), ("seed", 0, 2**63 - 1)):
            _int(self, name, lo, hi)
        if self.workers is not None:
            _int(self, "workers", 1, 4096)

    def params(self) -> dict:
        """What decides the output's bytes (recorded in the manifest; a resume must match)."""
        target = list(self.target) if isinstance(self.target, tuple) else self.target
        return {"max_side": self.max_side, "quality": self.quality,
                "shard_size": self.shard_size, "seed": self.seed, "target": target}


def _int(cfg: ConvertConfig, name: str, lo: int, hi: int) -> None:
    v = getattr(cfg, name)
    option = "--" + name.replace("_", "-")
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name}={v!r} ({option}) must be an int")
    if not lo <= int(v) <= hi:
        raise ValueError(f"{name}={v} ({option}) must be in [{lo}, {hi}]")


# -- the source --------------------------------------------------------------------------------
def _check_apart(src, out: Path) -> None:
    """Refuse an ``out`` inside a source folder (an ImageFolder, a folder of shards): the
    source is only read, and its listing would change."""
    if isinstance(src, (list, tuple)) or remote.is_remote(src) or not os.path.isdir(str(src)):
        return
    base = Path(str(src)).resolve()
    if out.resolve() == base or out.resolve().is_relative_to(base):
        raise ValueError(f"--out {str(out)!r} is inside the source {str(src)!r}; choose a "
                         "folder outside it (the source is only read)")


class Fetched:
    """Remote source shards copied into ``out/.fetch/`` as the plan reaches them, and deleted
    once no sample still to convert lies in them (source shards keep their order)."""

    def __init__(self, folder: Path, names: tuple[str, ...], stamps: np.ndarray):
        self.folder, self.names, self.stamps = folder, names, stamps
        self.have: set[int] = set()

    def path(self, s: int) -> str:
        p = self.folder / f"{s:06d}.tar"
        if s not in self.have:
            self.folder.mkdir(exist_ok=True)
            remote.download(self.names[s], str(p), expect=int(self.stamps[s][0]))
            self.have.add(s)
        return str(p)

    def release_below(self, s: int) -> None:
        for k in sorted(k for k in self.have if k < s):
            (self.folder / f"{k:06d}.tar").unlink(missing_ok=True)
            self.have.discard(k)


def _where_of(source: Source, fetched: Fetched | None) -> tuple[Callable[[int], Where],
                                                                 Callable[[int], int]]:
    """``(where(i), source shard of i)`` for the kind of ``source``."""
    r = source.read
    if source.kind is not SourceKind.SHARDS:
        return (lambda i: Where(source.names[i])), (lambda i: 0)
    shard_of, offsets, sizes = r.shard_of, r.offsets, r.sizes  # type: ignore[attr-defined]
    if fetched is not None:
        return ((lambda i: Where(fetched.path(int(shard_of[i])), int(offsets[i]), int(sizes[i]))),
                lambda i: int(shard_of[i]))
    shards = r.shards  # type: ignore[attr-defined]
    return ((lambda i: Where(shards[int(shard_of[i])], int(offsets[i]), int(sizes[i]))),
            lambda i: int(shard_of[i]))


def _order(source: Source, seed: int) -> np.ndarray:
    n = len(source.names)
    if source.kind is SourceKind.SHARDS:
        return np.arange(n)
    seq = np.random.SeedSequence(seed, spawn_key=(SHUFFLE,))
    return np.random.default_rng(seq).permutation(n)


def _label_members(source: Source, i: int, target) -> list[tuple[str, bytes]]:
    label = int(source.labels[i])
    out = [("cls", str(label).encode("ascii"))]
    if source.targets is not None and target == "multilabel":
        ids = np.flatnonzero(source.targets[i] > 0).tolist()
        out.append(("txt", " ".join(map(str, ids)).encode("ascii")))
    elif source.targets is not None:
        obj = {"label": label, **{k: float(v) for k, v in zip(target, source.targets[i].tolist())}}
        out.append(("json", json.dumps(obj, sort_keys=True).encode("ascii")))
    return out


# -- writing a shard ---------------------------------------------------------------------------


class ShardWriter:
    """One output shard: written under its partial name, renamed when whole."""

    def __init__(self, out: Path, n: int):
        self.out, self.n = out, n
        self.f = open(out / mf.partial_name(n), "wb")
        self.h = _Hashing(self.f)
        self.tar = tarfile.open(fileobj=cast(IO[bytes], self.h), mode="w", format=tarfile.PAX_FORMAT)
        self.rec: dict = {"path": mf.shard_name(n), "samples": 0, "resized": 0, "kept": 0,
                          "bytes_in": 0, "bytes_out": 0, "pixels_in": 0, "pixels_out": 0,
                          "failed": []}

    def add(self, key: str, rel: str, done: Done, labels: list[tuple[str, bytes]]) -> None:
        r = self.rec
        if done.why:
            r["failed"].append([rel, done.why])
            return
        for ext, data in [(done.ext, done.data), *labels]:
            self.tar.addfile(_member(f"{key}.{ext}", len(data)), io.BytesIO(data))
        r["samples"] += 1
        r["resized" if done.resized else "kept"] += 1
        r["bytes_in"] += done.bytes_in
        r["bytes_out"] += len(done.data)
        r["pixels_in"] += done.pixels_in
        r["pixels_out"] += done.pixels_out

    def finish(self) -> dict:
        self.tar.close()
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.out / mf.partial_name(self.n), self.out / mf.shard_name(self.n))
        return {**self.rec, "bytes": self.h.n, "sha256": self.h.sha.hexdigest()}

    def abandon(self) -> None:
        self.f.close()


# -- the run -----------------------------------------------------------------------------------
def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent stops the pool


def _results(tasks: Iterator[tuple], workers: int) -> Iterator[tuple[tuple, list[Done]]]:
    """Each task with its results, in task order; at most ``4 x workers`` tasks in flight. A
    worker's exception (a bug, not a bad photo) is re-raised here."""
    if workers == 1:
        for t in tasks:
            yield t, convert_chunk(t[1])
        return
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_ignore_sigint)
    pending: deque[tuple[tuple, Future]] = deque()
    try:
        for t in tasks:
            pending.append((t, pool.submit(convert_chunk, t[1])))
            if len(pending) >= 4 * workers:
                t0, fut = pending.popleft()
                yield t0, fut.result()
        while pending:
            t0, fut = pending.popleft()
            yield t0, fut.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _summary(shards: list[dict], samples: int, seconds: float, done_now: int) -> dict:
    tot = {k: sum(int(r[k]) for r in shards) for k in
           ("samples", "resized", "kept", "bytes_in", "bytes_out", "pixels_in", "pixels_out",
            "bytes")}
    failed = [f for r in shards for f in r["failed"]]
    n = max(tot["samples"], 1)
    return {
        "source_samples": samples, "converted": tot["samples"], "resized": tot["resized"],
        "kept": tot["kept"], "failed": len(failed), "failed_files": failed,
        "shards": len(shards), "bytes_before": tot["bytes_in"], "bytes_after": tot["bytes_out"],
        "shard_bytes": tot["bytes"],
        "mean_megapixels_before": round(tot["pixels_in"] / n / 1e6, 4),
        "mean_megapixels_after": round(tot["pixels_out"] / n / 1e6, 4),
        "seconds": round(seconds, 2),
        "photos_per_s": round(done_now / seconds, 1) if seconds > 0 else 0.0,
    }


def convert(cfg: ConvertConfig, progress: bool | None = None) -> dict:
    """Convert ``cfg.src`` into tar shards in ``cfg.out`` (package NOTE); resume an
    interrupted run of the same conversion.

    Returns:
        The manifest (also ``out/manifest.json``); its ``summary`` says what was done.

    Raises:
        FileExistsError: ``out`` holds anything this converter did not write, or another
            conversion (one line naming ``--out``).
        ValueError: ``out`` lies inside the source; a bad option; the loader's errors for a bad
            source (``DatasetRootError``).
    """
    from data_gen.generate import progress_shown

    t0 = time.perf_counter()
    out, label = Path(cfg.out), f"--out {str(cfg.out)!r}"
    _check_apart(cfg.src, out)
    source = open_source(cfg.src, target=cfg.target,
                         storage=remote.Storage(options=dict(cfg.storage_options)))
    base = root_base(cfg.src)
    rels = [os.path.relpath(n, base) for n in source.names]
    ident = {"source": {"kind": source.kind.value, "samples": len(rels),
                        "listing_sha256": mf.signature(rels, source.labels, source.targets)},
             "params": cfg.params()}
    old = mf.survey(out, label, ident)
    done = mf.verified(out, old.get("shards", [])) if old else []
    out.mkdir(parents=True, exist_ok=True)
    keep = {r["path"] for r in done} | {mf.MANIFEST}
    for e in os.listdir(out):  # ours (survey checked): a torn or unrecorded shard, a fetch
        if e not in keep:
            p = out / e
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    manifest: dict = {"generator": mf.GENERATOR, "root": remote.shown(cfg.src)
                if isinstance(cfg.src, (list, tuple)) or remote.is_remote(cfg.src)
                else os.fspath(cast(str, cfg.src)), **ident, "classes": source.classes,
                "complete": False, "shards": sorted(done, key=lambda r: r["path"])}
    mf.write(out, manifest)
    order, size = _order(source, cfg.seed), cfg.shard_size
    nshards = max(1, math.ceil(len(order) / size))
    finished = {r["path"] for r in done}
    todo = [n for n in range(nshards) if mf.shard_name(n) not in finished]
    fetched = None
    if getattr(source.read, "remote", False):
        r = source.read
        fetched = Fetched(out / mf.FETCH, r.names, r.stamps)  # type: ignore[attr-defined]
    where, shard_of = _where_of(source, fetched)
    keys = mf.keys_of(rels)

    def tasks() -> Iterator[tuple]:
        for n in todo:
            idx = order[n * size:(n + 1) * size].tolist()
            for c in range(0, len(idx), CHUNK):
                part = idx[c:c + CHUNK]
                yield (n, c + CHUNK >= len(idx)), (part, [where(i) for i in part],
                                                   cfg.max_side, cfg.quality)

    progress = progress_shown() if progress is None else progress
    skipped = len(order) - sum(len(order[n * size:(n + 1) * size]) for n in todo)
    if progress and done:
        print(f"convert: resuming: {len(done)} of {nshards} shards are already converted",
              file=sys.stderr)
    from tqdm import tqdm  # type: ignore[import-untyped]

    bar = tqdm(total=len(order), initial=skipped, unit="img", desc="convert", file=sys.stderr,
               dynamic_ncols=True, disable=not progress, smoothing=0.05)
    writer: ShardWriter | None = None
    count = 0
    workers = min(cfg.workers or max(1, os.cpu_count() or 1), max(1, len(todo) * size // CHUNK))
    try:
        for ((n, last), (part, *_)), results in _results(tasks(), workers):
            if writer is None:
                writer = ShardWriter(out, n)
            for i, d in zip(part, results):
                writer.add(keys[i], rels[i], d, _label_members(source, i, cfg.target))
            count += len(part)
            bar.update(len(part))
            if last:
                manifest["shards"] = sorted([*manifest["shards"], writer.finish()],
                                            key=lambda r: r["path"])
                writer = None
                mf.write(out, manifest)
                if fetched is not None:
                    nxt = (n + 1) * size
                    fetched.release_below(shard_of(int(order[nxt])) if nxt < len(order)
                                          else len(fetched.names))
    finally:
        bar.close()
        if writer is not None:
            writer.abandon()
    if fetched is not None:
        shutil.rmtree(out / mf.FETCH, ignore_errors=True)
    manifest["complete"] = True
    manifest["summary"] = _summary(manifest["shards"], len(order), time.perf_counter() - t0,
                                   count)
    mf.write(out, manifest)
    return manifest
