"""What a conversion's ``--out`` holds: its manifest, its shards, and how sample names map to keys.

NOTE [the output folder]
``--out`` holds ``manifest.json`` and tar shards ``shard-NNNNNN.tar``; nothing else, except
while a run is under way (a shard being written is ``.shard-NNNNNN.tar.partial``; remote source
shards are copied into ``.fetch/``). The manifest is written first (an empty folder then holds
only it), rewritten after each finished shard (a temporary name, then ``os.replace``), and
lists each shard with its sha256, so an interrupted run is resumed by the same command: the
shards whose bytes still match are kept, anything else of ours is removed and made again. A
folder that holds anything else, or a manifest of another source or other parameters, is
refused; the source is only read.

NOTE [keys]
Each sample's tar key is its name relative to the source (``os.path.relpath`` from the root
folder, or from the folder of a file list or of the shards, as ``LoaderConfig.target``'s
``target_fn`` receives it: a shard sample's ``SHARD.tar/KEY.EXT``), percent-encoded with
``urllib.parse.quote`` (``/`` kept) and every ``.`` written ``%2E``, since WebDataset ends a key
at the first dot of its base name. ``urllib.parse.unquote(key)`` gives the name back:
``class_a/img.001.jpg`` is the key ``class_a/img%2E001%2Ejpg`` and the members
``class_a/img%2E001%2Ejpg.jpg`` and ``class_a/img%2E001%2Ejpg.cls``. A name the source lists
more than once (a file list may) gets ``%23N`` (``#N``) appended from its second listing on, so
two samples never share a key (WebDataset would join their members into one sample).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from urllib.parse import quote, unquote

import numpy as np

GENERATOR = "gpu-feed data_gen convert v1"
MANIFEST = "manifest.json"
FETCH = ".fetch"
_OURS = re.compile(r"shard-\d{6}\.tar|\.shard-\d{6}\.tar\.partial|\.manifest\.json\.tmp")


def shard_name(n: int) -> str:
    return f"shard-{n:06d}.tar"


def partial_name(n: int) -> str:
    return f".{shard_name(n)}.partial"


def key_of(rel: str) -> str:
    """The tar key of the sample named ``rel`` (NOTE [keys])."""
    return quote(rel.replace(os.sep, "/"), safe="/").replace(".", "%2E")


def keys_of(rels: list[str]) -> list[str]:
    """``key_of`` of each name, a repeated name's later keys suffixed ``%23N`` (NOTE [keys])."""
    seen: dict[str, int] = {}
    out = []
    for rel in rels:
        key = key_of(rel)
        n = seen[key] = seen.get(key, 0) + 1
        out.append(key if n == 1 else f"{key}%23{n}")
    return out


def name_of(key: str) -> str:
    """The relative name that ``key_of`` made ``key`` from."""
    return unquote(key)


def signature(rels: list[str], labels: np.ndarray, targets: np.ndarray | None) -> str:
    """A hash of the source's listing: every sample's relative name, label and target, in
    order (a moved source keeps its signature; an edited one does not)."""
    h = hashlib.sha256()
    for rel, label in zip(rels, np.asarray(labels).tolist()):
        h.update(f"{rel}\0{label}\n".encode("utf-8", "surrogateescape"))
    if targets is not None:
        h.update(np.ascontiguousarray(targets, np.float32).tobytes())
    return h.hexdigest()


def read(out: Path) -> dict | None:
    """The manifest a conversion wrote in ``out``, or ``None``."""
    try:
        m = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and m.get("generator") == GENERATOR else None


def write(out: Path, manifest: dict) -> None:
    """Write ``out/manifest.json`` durably: a temporary name, fsync, then ``os.replace``."""
    tmp = out / ".manifest.json.tmp"
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out / MANIFEST)


def survey(out: Path, label: str, ident: dict) -> dict | None:
    """The manifest of an earlier run of the same conversion in ``out`` (to resume), or
    ``None`` when ``out`` is missing or empty. Reads only.

    Raises:
        FileExistsError: ``out`` is not a folder, holds files this converter did not write,
            or a conversion of another source or with other parameters.
    """
    if not out.is_dir():
        if os.path.lexists(out):
            raise FileExistsError(f"{label} exists and is not a directory")
        return None
    entries = sorted(os.listdir(out))
    if not entries or entries == [".manifest.json.tmp"]:  # killed while writing its first
        return None
    old = read(out)
    if old is None:
        raise FileExistsError(f"{label} is not empty and was not written by data_gen convert "
                              f"(no {MANIFEST} of it); choose a new or empty folder")
    foreign = [e for e in entries if e not in (MANIFEST, FETCH) and not _OURS.fullmatch(e)]
    if foreign:
        raise FileExistsError(f"{label} holds {len(foreign)} files data_gen convert did not "
                              f"write (e.g. {foreign[0]!r}); choose a new or empty folder")
    for k in ("source", "params"):
        if old.get(k) != json.loads(json.dumps(ident[k])):
            diff = sorted(n for n in set(ident[k]) | set(old.get(k) or {})
                          if (old.get(k) or {}).get(n) != ident[k].get(n))
            raise FileExistsError(f"{label} holds a conversion of another source or with other "
                                  f"parameters ({k}: {', '.join(diff)} differ); delete it or "
                                  "choose another folder")
    return old


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def verified(out: Path, shards: list[dict]) -> list[dict]:
    """The shard records whose file is there, in ``out`` and named as ours, with the recorded
    size and sha256."""
    keep = []
    for rec in shards:
        name = str(rec.get("path", "")) if isinstance(rec, dict) else ""
        p = out / name
        try:
            if (re.fullmatch(r"shard-\d{6}\.tar", name) and p.stat().st_size == rec.get("bytes")
                    and sha256_of(p) == rec.get("sha256")):
                keep.append(rec)
        except OSError:
            continue
    return keep
