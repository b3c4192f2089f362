"""WebDataset tar shards as a dataset: each shard indexed once, each sample read by its offset.

A root is a shard set when it is a ``.tar`` file, a glob or brace pattern of them
(``/data/train-*.tar``, ``/data/train-{000000..000031}.tar``), or a folder that holds ``.tar``
files and no sub-folders. A sample is the consecutive members that share a key (the member name
up to the first ``.`` of its base name, WebDataset's convention): one image (an extension of
``LoaderConfig.extensions``) and its label, ``KEY.cls`` (an integer as text) or ``KEY.json``
(an object with an integer ``"label"`` or ``"cls"``). An integer-valued float (``2.0``) is that
integer. The class names are ``"0"`` to the largest label, so a label must be a plausible class
index: below ``pipelines.sources.lists.index_limit`` of the set's sample count (a label at or above it
is a bad label, NOTE [bad input]); ``LoaderConfig.classes`` fixes the class list instead, a
label being an id into it (``pipelines.sources.classes``). With another ``LoaderConfig.target``
(``pipelines.sources.targets``) a sample needs no class label: ``"multilabel"`` reads its
``KEY.txt``, ``KEY.cls`` or ``KEY.json`` (the first present), a tuple of keys reads its
``KEY.json``, and ``"none"`` or a callable read nothing; a sample whose target is missing or bad
is a bad sample as a bad class label is.

NOTE [index]
Indexing a shard walks its tar headers and reads only the labels: every image's byte offset and
size, and where its ``.cls`` / ``.txt`` / ``.json`` members lie, go into an index (targets other
than class labels are read from those members at each listing, never from the cache), so a
sample is one ``os.pread`` of the shard, in any order. The index of
each shard is cached in ``<listing cache>/shards/`` (``pipelines.sources.cache.cache_dir``), keyed by
the shard's real path and checked against its size and mtime; a shard modified in the last
``RACY_S`` seconds is not cached. The same index serves every rank, epoch and backend. The index
holds no path (the samples are named after the shard path the caller gave), and as for listings
(``pipelines.sources.cache`` NOTE [listing cache]) an entry that cannot be read or whose arrays do not
agree is a miss, indexed again and rewritten, never an error; entries are written durably
(``listcache.write_npz``).

NOTE [the plan for shards: what is exact]
Every backend reads shards through ``pipelines.epoch_plan``'s plan with ``groups`` (the samples of
each shard), so all of them read the same samples in the same order:

* **Exact**: every sample is read exactly once per epoch across the ranks (padding or dropping
  as the last-batch policy says, as for folders); the order is a pure function of (seed, epoch,
  rank, world size), so it is reproducible and resumes exactly (``state_dict``).
* **Approximate**: the order is not a uniform permutation of the samples, as it is for folders.
  Each epoch the shards are permuted and concatenated; rank ``r`` takes the ``r``-th contiguous
  slice of that stream (whole shards, and parts of at most two at its edges); its samples are
  then shuffled within windows of ``LoaderConfig.shuffle_window`` consecutive samples. A rank
  thus reads few shards at once, as a streaming reader with a shuffle buffer does, and samples
  of one shard stay near each other, as they do there. Shards must not be sorted by class
  (``data_gen --format wds`` shuffles before it writes).

NOTE [why DALI is fed bytes, not fn.readers.webdataset]
DALI's ``fn.readers.webdataset`` reads shards in C++ with index files, but it cannot follow the
shared plan: it splits the samples into ``num_shards`` contiguous ranges whose batch counts can
differ by one between ranks (a DDP hang), shuffles with its own buffer (so its order would
differ from the torch backends' and resume would rest on its checkpoint alone), and has its own
rules for missing components. So the DALI backend is fed the encoded bytes of the plan's
samples, read with ``os.pread`` in the source's read-ahead threads
(``pipelines.dali.source`` NOTE [bytes]): the same samples, order, policies and resume as the
other backends. What that costs against DALI reading files by path is measured on the H200
(docs/results/h200/README.md, folder against shards).

The torch backends read the shards with the same index, not with the ``webdataset`` library:
it streams each shard as an ``IterableDataset`` (shards split over ranks and workers, a shuffle
buffer), which cannot give every rank equal steps, exactly-once epochs and exact resume through
the shared plan; and reading the bytes through it was the slower of the two
(``python -m tools.microbench shard-read``, docs/results/cpu/README.md).

NOTE [bad input]
A shard that cannot be opened, that is not a tar, that is truncated (a member ends past the
file's end, or the end-of-archive blocks are missing) or that holds data its headers do not
account for, and a sample without an image or without a valid label (one that is not an
integer, is negative, or is too large to be a class index: ``index_limit``), raise one
``ShardError`` naming the shard and the key under ``on_bad_file="error"``. Under ``"skip"``
they are dropped, counted and named in one warning: the samples of a truncated shard that lie
wholly inside the file are kept. A sample whose image bytes do not decode is a bad file as in a
folder (the backends' ``BadFilePolicy``).
"""
from __future__ import annotations

import glob
import hashlib
import json
import math
import os
import re
import tarfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

import numpy as np

from pipelines.sources import remote
from pipelines.sources.cache import RACY_S, _join, cache_dir, write_npz
from pipelines.sources.folder import IMAGE_EXTENSIONS, DatasetRootError
from pipelines.sources.lists import MAX_CLASS_LIMIT, as_int, index_limit
from pipelines.sources.remote import braces  # noqa: F401  (re-exported: WebDataset's brace URLs)
from pipelines.sources.targets import as_number, from_source, multi_hot, split_labels

INDEX_VERSION = 3  # 2: integer-valued float labels, labels >= 2**31 refused; 3: label members
LABEL_MEMBERS = ("cls", "txt", "json")  # ShardIndex.members: where each lies in the shard
INDEXED = frozenset({e[1:] for e in IMAGE_EXTENSIONS}
                    | {"tif", "tiff", "jp2", "j2k", "jpx", "pnm", "ppm", "pgm"})
_BLOCK = 512
_GLOB = re.compile(r"[*?\[]")


class ShardError(DatasetRootError):
    """A shard, or a sample in one, that cannot be read (``on_bad_file="error"``)."""


# -- which roots are shard sets ------------------------------------------------------------------
def _is_tar_name(s: str) -> bool:
    return s.lower().endswith(".tar")


def is_shard_root(root) -> bool:
    """Whether ``root`` names tar shards (a ``.tar``, a pattern of them, or a folder of them)."""
    if root is None or isinstance(root, bool):
        return False
    if isinstance(root, (list, tuple)) or remote.is_remote(root):  # pipelines.sources.remote
        return True
    try:
        s = os.fspath(root)
    except TypeError:
        return False
    if not isinstance(s, str):
        return False
    if _is_tar_name(s):
        return True
    if os.path.isdir(s):
        try:
            entries = [e for e in os.scandir(s) if not e.name.startswith(".")]
        except OSError:
            return False
        return (any(e.is_file() and _is_tar_name(e.name) for e in entries)
                and not any(e.is_dir() for e in entries))
    return False


def shard_paths(root) -> list[str]:
    """The shards of ``root``, sorted; ``ShardError`` when none match. Remote shards and lists
    of shards are named in the order given (``pipelines.sources.remote.names``)."""
    if isinstance(root, (list, tuple)) or remote.is_remote(root):
        return remote.names(root)
    s = os.fspath(root)
    if os.path.isdir(s):
        found = sorted(os.path.join(s, n) for n in os.listdir(s)
                       if _is_tar_name(n) and not n.startswith(".")
                       and os.path.isfile(os.path.join(s, n)))
    else:
        found = []
        for p in braces(s):
            found += sorted(glob.glob(p)) if _GLOB.search(p) else [p]
        missing = [p for p in found if not os.path.isfile(p)]
        if missing:
            raise ShardError(f"root={s!r}: shard {missing[0]!r} does not exist"
                             + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    if not found:
        raise ShardError(f"root={s!r}: no .tar shards match")
    return found


# -- one shard's index ---------------------------------------------------------------------------
@dataclass
class ShardIndex:
    """The samples of one shard, in member order.

    Attributes:
        keys, exts: each sample's key and image extension (``""`` when it has no image).
        offsets, sizes: the image's byte range in the shard.
        labels: the label, ``-1`` when missing or invalid (``problems`` says why).
        members: ``N x 3 x 2``: the ``(offset, size)`` of each sample's ``LABEL_MEMBERS``,
            offset ``-1`` when it has none.
        problems: ``(key, why)`` of samples that cannot be used (as class-labelled samples).
        damage: why the shard is truncated or corrupt, ``""`` when it is whole.
    """

    keys: list[str]
    exts: list[str]
    offsets: np.ndarray
    sizes: np.ndarray
    labels: np.ndarray
    members: np.ndarray
    problems: list[tuple[str, str]]
    damage: str


def _split_name(name: str) -> tuple[str, str]:
    d, base = os.path.split(name)
    if "." not in base:
        return name, ""
    stem, ext = base.split(".", 1)
    return (f"{d}/{stem}" if d else stem), ext.lower()


def _label(ext: str, data: bytes) -> int:
    if ext == "cls":
        text = data.decode("ascii").strip()
        value = as_int(text) if text else None
        if value is None:
            raise ValueError(f"{text[:60]!r} is not an integer")
    else:
        obj = json.loads(data)
        value = obj.get("label", obj.get("cls")) if isinstance(obj, dict) else obj
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)  # 2.0: the index 2
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"no integer 'label' or 'cls' in {data[:60]!r}")
    if value < 0:
        raise ValueError(f"label {value} < 0")
    if value >= MAX_CLASS_LIMIT:
        raise ValueError(f"label {value} is too large to be a class index (index_limit)")
    return value


def index_shard(path: str) -> ShardIndex:
    """Walk one shard's headers (module NOTE [index]); raises ``ShardError`` only when the file
    cannot be opened or is not a tar at all. A sample's image is its first member with an
    extension of ``INDEXED`` (the loader's ``extensions`` choose among them later, so one cached
    index serves every choice)."""
    image_exts = INDEXED
    keys: list[str] = []
    exts: list[str] = []
    offsets: list[int] = []
    sizes: list[int] = []
    labels: list[int] = []
    members: list[list[list[int]]] = []
    problems: list[tuple[str, str]] = []
    why: dict[int, str] = {}
    damage = ""
    end = 0
    try:
        size = os.path.getsize(path)
        tf = tarfile.open(path, mode="r:")
    except (OSError, tarfile.TarError) as e:
        raise ShardError(f"shard {path!r}: cannot be read as a tar ({type(e).__name__}: "
                         f"{e})") from None
    with tf:
        cur = None
        try:
            for m in tf:
                if not m.isfile():
                    continue
                data_end = m.offset_data + m.size
                if data_end > size:
                    damage = (f"truncated: member {m.name!r} ends at byte {data_end}, past the "
                              f"file's end ({size} bytes)")
                    break
                end = m.offset_data + -(-m.size // _BLOCK) * _BLOCK
                key, ext = _split_name(m.name)
                if key != cur:
                    cur = key
                    keys.append(key)
                    exts.append("")
                    offsets.append(0)
                    sizes.append(0)
                    labels.append(-1)
                    members.append([[-1, 0], [-1, 0], [-1, 0]])
                k = len(keys) - 1
                if ext in LABEL_MEMBERS and members[k][LABEL_MEMBERS.index(ext)][0] < 0:
                    members[k][LABEL_MEMBERS.index(ext)] = [m.offset_data, m.size]
                if ext in image_exts and not exts[k]:
                    exts[k], offsets[k], sizes[k] = ext, m.offset_data, m.size
                elif ext in ("cls", "json") and labels[k] < 0:
                    try:
                        labels[k] = _label(ext, cast(IO[bytes], tf.extractfile(m)).read())  # m.isfile()
                        why.pop(k, None)
                    except (ValueError, UnicodeDecodeError) as e:
                        why[k] = f"bad label in {m.name!r} ({e})"
        except (tarfile.TarError, OSError, EOFError) as e:
            damage = f"unreadable after byte {end} ({type(e).__name__}: {e})"
        if not damage:
            damage = _tail_damage(path, end, size)
    for k, key in enumerate(keys):
        if not exts[k]:
            problems.append((key, "no image member"))
        elif labels[k] < 0:
            problems.append((key, why.get(k, "no .cls or .json label")))
    return ShardIndex(keys, exts, np.asarray(offsets, np.int64), np.asarray(sizes, np.int64),
                      np.asarray(labels, np.int64),
                      np.asarray(members, np.int64).reshape(len(keys), 3, 2), problems, damage)


def _tail_damage(path: str, end: int, size: int) -> str:
    """Why the bytes after the last member are not a tar's end (two zero blocks, zero padding),
    or ``""``."""
    rest = size - end
    if rest < 2 * _BLOCK:
        return f"truncated: the end-of-archive blocks are missing ({rest} bytes after byte {end})"
    if rest > 2 * tarfile.RECORDSIZE:
        return f"{rest} bytes after byte {end} that no tar header accounts for"
    with open(path, "rb") as f:
        f.seek(end)
        tail = f.read(rest)
    if tail.strip(b"\0"):
        return f"data after byte {end} that no tar header accounts for"
    return ""


# -- the index cache -----------------------------------------------------------------------------
def _cache_file(path: str) -> Path | None:
    folder = cache_dir()
    if folder is None:
        return None
    raw = f"{INDEX_VERSION}\0{os.path.realpath(path)}".encode("utf-8", "surrogateescape")
    return folder / "shards" / f"{hashlib.sha256(raw).hexdigest()[:32]}.npz"


def _split(blob: np.ndarray, n: int) -> list[str]:
    """``listcache._split`` for a list of exactly ``n`` strings that may all be empty (an
    index's ``exts`` of image-less samples); ``ValueError`` when the blob holds another count."""
    if not isinstance(blob, np.ndarray) or blob.dtype != np.uint8 or blob.ndim != 1:
        raise ValueError("not a string blob")
    text = blob.tobytes().decode("utf-8", "surrogateescape")
    out = text.split("\0") if n else []
    if len(out) != n or (not n and text):
        raise ValueError(f"{len(out)} strings, expected {n}")
    return out


def _load_index(file: Path, stamp: np.ndarray) -> ShardIndex | None:
    """The cached index in ``file`` when it is of this shard state (``stamp``) and whole;
    ``None`` when it is missing, stale or damaged in any way (NOTE [index]: never an error)."""
    try:  # opened here: np.load leaks its own handle when the zip is damaged
        with open(file, "rb") as f, np.load(f, allow_pickle=False) as z:
            if not np.array_equal(z["stamp"], stamp):
                return None
            offsets, sizes, labels = z["offsets"], z["sizes"], z["labels"]
            members = z["members"]
            n = int(offsets.shape[0]) if offsets.ndim == 1 else -1
            if n < 0 or any(a.dtype != np.int64 or a.shape != (n,)
                            for a in (offsets, sizes, labels)):
                return None
            if members.dtype != np.int64 or members.shape != (n, 3, 2):
                return None
            nprob = int(z["nproblems"])
            probs = _split(z["problems"], nprob)
            if nprob % 2:
                return None
            damage = z["damage"]
            if damage.dtype.kind != "U" or damage.shape != ():
                return None
            return ShardIndex(_split(z["keys"], n), _split(z["exts"], n), offsets, sizes,
                              labels, members, list(zip(probs[0::2], probs[1::2])), str(damage))
    except Exception:  # noqa: BLE001 - zero bytes, truncated, garbage, missing arrays: a miss
        return None


def cached_index(path: str) -> ShardIndex:
    """``index_shard(path)``, from the cache while the shard's size and mtime are unchanged
    (a remote shard: ``pipelines.sources.remote_index``)."""
    if remote.scheme_of(path):
        return remote.index(path)
    file = _cache_file(path)
    st = os.stat(path)
    stamp = np.asarray([st.st_size, st.st_mtime_ns], np.int64)
    if file is not None:
        idx = _load_index(file, stamp)
        if idx is not None:
            return idx
    idx = index_shard(path)
    if file is not None and st.st_mtime_ns <= time.time_ns() - int(RACY_S * 1e9):
        store_index(file, stamp, idx)
    return idx


def store_index(file: Path, stamp: np.ndarray, idx: ShardIndex) -> None:
    """Write ``idx`` to the cache entry ``file`` (read back by ``_load_index``)."""
    try:
        write_npz(file, stamp=stamp, keys=_join(idx.keys), exts=_join(idx.exts),
                  offsets=idx.offsets, sizes=idx.sizes, labels=idx.labels, members=idx.members,
                  problems=_join([x for p in idx.problems for x in p]),
                  nproblems=np.int64(2 * len(idx.problems)), damage=np.str_(idx.damage))
    except (OSError, ValueError):
        pass  # a read-only cache: index again next time


# -- the shard set -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShardSet:
    """Every usable sample of a set of shards, in shard then member order.

    Attributes:
        shards: the shard paths.
        names: ``<shard path>/<key>.<ext>`` of each sample (messages, the resume fingerprint).
        labels, classes: as a folder's listing gives them.
        shard_of, offsets, sizes: where each sample's image is.
        groups: samples per shard (the plan's ``groups``).
    """

    shards: tuple[str, ...]
    names: list[str]
    labels: np.ndarray
    classes: list[str]
    shard_of: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    groups: np.ndarray


def list_shards(root, extensions: Sequence[str], skip_bad: bool = False,
                target: object = "class", min_limit: int = 0) -> ShardSet:
    """The samples of the shards of ``root`` (module NOTEs [index] and [bad input]); with a
    ``"multilabel"`` or column ``target`` the ``labels`` are float32 ``N x C`` / ``N x K``
    (``pipelines.sources.targets``), and without ``"class"`` a sample needs no class label.
    ``min_limit``: labels below it are never too large (``index_limit``): the length of
    ``LoaderConfig.classes``, whose ids are all valid.

    Raises:
        ShardError: no shard matches; or, without ``skip_bad``, a bad shard or sample (a
            label at or above ``index_limit`` of the usable samples is a bad sample).
    """
    exts = {e[1:] for e in extensions}
    shards = shard_paths(root)
    names: list[str] = []
    cols: dict[str, list[np.ndarray]] = {"labels": [], "shard_of": [], "offsets": [], "sizes": []}
    groups = np.zeros(len(shards), np.int64)
    dropped: list[str] = []
    other: dict[str, int] = {}
    usable: list[tuple[int, str, ShardIndex, np.ndarray]] = []
    by_class = target == "class"
    values: list = []  # the targets read from the files (from_source(target))
    for s, path in enumerate(shards):
        try:
            idx = cached_index(path)
        except (ShardError, OSError) as err:
            if not skip_bad:
                raise ShardError(f"{err}" if isinstance(err, ShardError) else
                                 f"shard {path!r}: {type(err).__name__}: {err}") from None
            dropped.append(f"{path}: {err}")
            continue
        if idx.damage and not skip_bad:
            raise ShardError(f"shard {path!r}: {idx.damage} (on_bad_file='skip' keeps its whole "
                             "samples, counted)")
        if idx.damage:
            dropped.append(f"{path}: {idx.damage}")
        problems = idx.problems if by_class else [(k, "no image member")
                                                  for k, e in zip(idx.keys, idx.exts) if not e]
        bad = dict(problems)
        keep = np.asarray([bool(e) and e in exts and k not in bad
                           for k, e in zip(idx.keys, idx.exts)], dtype=bool)
        for k, e in zip(idx.keys, idx.exts):
            if e and e not in exts and k not in bad:
                other[e] = other.get(e, 0) + 1
        for k, why in problems:
            if not skip_bad:
                raise ShardError(f"shard {path!r}, sample {k!r}: {why} (on_bad_file='skip' "
                                 "drops it, counted)")
            dropped.append(f"{path}/{k}: {why}")
        usable.append((s, path, idx, np.flatnonzero(keep)))
    total = sum(len(rows) for *_, rows in usable)
    limit = max(index_limit(total), min_limit)
    for s, path, idx, rows in usable:
        if from_source(target):
            rows = _read_targets(path, idx, rows, target, limit, values, dropped, skip_bad)
        over = rows[idx.labels[rows] >= limit] if by_class else rows[:0]
        for i in over.tolist():
            why = (f"label {int(idx.labels[i])} is too large to be a class index of a set of "
                   f"{total} samples (labels must be below {limit:,}: "
                   "pipelines.sources.lists.index_limit); an id or a typo?")
            if not skip_bad:
                raise ShardError(f"shard {path!r}, sample {idx.keys[i]!r}: {why} "
                                 "(on_bad_file='skip' drops it, counted)")
            dropped.append(f"{path}/{idx.keys[i]}: {why}")
        if len(over):
            rows = rows[idx.labels[rows] < limit]
        groups[s] = len(rows)
        names += [f"{path}/{idx.keys[i]}.{idx.exts[i]}" for i in rows.tolist()]
        cols["labels"].append(np.maximum(idx.labels[rows], 0))
        cols["shard_of"].append(np.full(len(rows), s, np.int32))
        cols["offsets"].append(idx.offsets[rows])
        cols["sizes"].append(idx.sizes[rows])
    if dropped:
        warnings.warn(f"root={remote.shown(root)!r}: skipped {len(dropped)} bad shards or samples "
                      f"(on_bad_file='skip'): " + "; ".join(dropped[:5])
                      + (f"; and {len(dropped) - 5} more" if len(dropped) > 5 else ""),
                      RuntimeWarning, stacklevel=4)
    if other:
        warnings.warn(f"root={remote.shown(root)!r}: skipped {sum(other.values())} samples whose "
                      "image extension is not in extensions (" + ", ".join(
                          f"{n} .{e}" for e, n in sorted(other.items())) + "); add them to "
                      "LoaderConfig.extensions to read them", RuntimeWarning, stacklevel=4)
    if not names:
        raise ShardError(f"root={remote.shown(root)!r}: the {len(shards)} shards hold no sample "
                         f"with an image ({', '.join(sorted(exts))}) and a label")
    cat = {k: np.concatenate(v) for k, v in cols.items()}
    labels: np.ndarray = cat["labels"].astype(np.int64)
    classes = [str(c) for c in range(int(labels.max()) + 1)]
    if isinstance(target, tuple):
        labels, classes = np.asarray(values, np.float32).reshape(len(names), len(target)), []
    elif from_source(target):
        try:
            labels, classes = multi_hot(values, f"root={os.fspath(root)!r}")
        except ValueError as e:
            raise ShardError(str(e)) from None
    return ShardSet(tuple(shards), names, labels, classes, cat["shard_of"].astype(np.int32),
                    cat["offsets"].astype(np.int64), cat["sizes"].astype(np.int64), groups)


def _read_targets(path: str, idx: ShardIndex, rows: np.ndarray, target, limit: int,
                  values: list, dropped: list[str], skip_bad: bool) -> np.ndarray:
    """The ``rows`` of one shard whose multi-label or column target reads and parses (appended
    to ``values``); the others are bad samples (raised, or named in ``dropped``)."""
    keep = []
    with open(path, "rb") as f:
        for i in rows.tolist():
            got = {ext: os.pread(f.fileno(), int(size), int(off))
                   for ext, (off, size) in zip(LABEL_MEMBERS, idx.members[i].tolist()) if off >= 0}
            try:
                values.append(_target_value(got, target, limit))
                keep.append(i)
            except (ValueError, UnicodeDecodeError) as e:
                why = f"target={target!r}: {e}"
                if not skip_bad:
                    raise ShardError(f"shard {path!r}, sample {idx.keys[i]!r}: {why} "
                                     "(on_bad_file='skip' drops it, counted)") from None
                dropped.append(f"{path}/{idx.keys[i]}: {why}")
    return np.asarray(keep, np.int64)


def _target_value(members: dict[str, bytes], target, limit: int) -> list:
    """One sample's multi-label tokens or column values from its label members (module doc)."""
    obj = json.loads(members["json"]) if "json" in members else None
    if isinstance(target, tuple):
        if not isinstance(obj, dict):
            raise ValueError("no .json object" if obj is None else ".json is not an object")
        return [as_number(obj.get(k), k) for k in target]
    for ext in ("txt", "cls"):
        if ext in members:
            return split_labels(members[ext].decode("utf-8"), limit)
    if isinstance(obj, dict):
        key = next((k for k in ("labels", "label", "cls") if k in obj), None)
        if key is None:
            raise ValueError("no 'labels', 'label' or 'cls' in .json")
        return split_labels(obj[key], limit)
    if obj is None:
        raise ValueError("no .txt, .cls or .json labels")
    return split_labels(obj, limit)


class ShardReader:
    """``reader(i) -> bytes``: sample ``i``'s image, one ``os.pread`` of its shard.

    Picklable for DataLoader workers: each process opens the shards it reads, once."""

    def __init__(self, shards: Sequence[str], shard_of: np.ndarray, offsets: np.ndarray,
                 sizes: np.ndarray):
        self.shards = tuple(shards)
        self.shard_of, self.offsets, self.sizes = shard_of, offsets, sizes
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_fds"] = {}
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._pid = os.getpid()

    def __call__(self, i: int) -> bytes:
        if self._pid != os.getpid():  # forked: the parent's descriptors are not ours to share
            self._fds, self._pid = {}, os.getpid()
        s = int(self.shard_of[i])
        fd = self._fds.get(s)
        if fd is None:  # DALI's read-ahead threads may race here: one descriptor wins
            new = os.open(self.shards[s], os.O_RDONLY)
            fd = self._fds.setdefault(s, new)
            if fd != new:
                os.close(new)
        size = int(self.sizes[i])
        data = os.pread(fd, size, int(self.offsets[i]))
        if len(data) != size:
            raise OSError(f"short read: {len(data)} of {size} bytes (the shard shrank)")
        return data

    def close(self) -> None:
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = {}

    def __del__(self):
        self.close()
