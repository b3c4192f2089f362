"""What ``Batch.labels`` holds (``LoaderConfig.target``), computed once when the dataset is
listed, so every backend yields the same targets for the same indices.

* ``"class"`` (default): the class index of each sample, as the source lists it (class
  folders, a list's label column, a shard's ``.cls`` / ``.json``); the backends carry it
  themselves.
* ``"multilabel"``: several classes per sample, float32 multi-hot ``N x C``, from a file list's
  label cell (a ``labels`` column if there is one, else the class label column) or a shard's
  ``KEY.txt``, ``KEY.cls`` or ``KEY.json`` (the first present; in JSON the key ``"labels"``,
  else ``"label"`` / ``"cls"``, a list or one value). A cell holds class ids or names separated
  by whitespace, ``;`` or ``|`` (``"3;7"``, ``"cat dog"``). Ids are used as given (``C`` = the
  largest id + 1, classes ``"0" ..``); names are sorted into the class list, as folder classes
  are. One dataset may not mix ids and names; an empty cell, a negative id or one too large to
  be a class index (``pipelines.sources.lists.index_limit``) is a bad row. ``LoaderConfig.classes``
  fixes ``C`` and the columns instead: ids index it, names are looked up in it
  (``pipelines.sources.classes``).
* a tuple of column names or JSON keys, e.g. ``("age", "score")`` (regression): float32
  ``N x K``, those columns of a CSV / TSV list's header (any case) or those keys of each shard
  sample's ``KEY.json``. A missing, empty, non-numeric or non-finite value is a bad row.
* ``"none"``: no label: ``labels`` are the samples' dataset indices (int64), so
  self-supervised code can look samples up. A folder may then be flat (images and no class
  folders), and a list may have only a path column.
* a callable ``target_fn(relative_path)``: called once per sample when the loader is built,
  with the sample's path relative to the root (a shard sample's ``SHARD.tar/KEY.ext``); it
  returns an int (``labels``: int64 ``N``) or a sequence of floats, the same length for every
  sample (``labels``: float32 ``N x K``; multi-hot vectors for multi-label data, values for
  regression). Nothing is pickled per sample and no worker calls it. Folders may be flat and
  lists path-only, as for ``"none"``.

``"multilabel"`` and column targets are read by the list and shard sources (a folder root
refuses them, naming ``target``: a folder gives one class per image). A bad row is, as for a bad
class label, one ``ValueError`` / ``ShardError`` naming the file and line or the shard and key
(and the column and ``target``) under ``on_bad_file="error"``, and dropped, counted and named
in one warning under ``"skip"``. The values are read from the files on every listing (the shard
index cache holds only where each sample's label members lie), so an edited list or shard never
serves stale targets. Targets other than ``"class"`` are gathered by the dataset indices of each
batch (``Batch.indices``) and copied to the device with the batch.
"""
from __future__ import annotations

import math
import os
import re
import reprlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

KINDS = ("class", "multilabel", "none")
SEPARATORS = re.compile(r"[\s;|]+")


def check_target(target: Any) -> Any:
    """``target`` if it is one of ``KINDS``, a tuple (or list, stored as a tuple) of distinct
    column names, or a callable, else a ``ValueError`` naming it."""
    if callable(target) or (isinstance(target, str) and target in KINDS):
        return target
    if (isinstance(target, (tuple, list)) and target
            and all(isinstance(k, str) and k.strip() for k in target)
            and len({k.strip().lower() for k in target}) == len(target)):
        return tuple(k.strip() for k in target)
    raise ValueError(f"target={target!r} must be one of {list(KINDS)}, a tuple of distinct column "
                     "names or JSON keys (regression, e.g. ('age', 'score')), or a callable "
                     "target_fn(relative_path) -> int | sequence of float")


def from_source(target: Any) -> bool:
    """Whether the list or shard source reads ``target`` from its files (multi-label, columns)."""
    return isinstance(target, tuple) or (isinstance(target, str) and target == "multilabel")


def split_labels(cell: Any, limit: int) -> list[str]:
    """The labels of one multi-label cell (module doc): a string of ids or names, or a JSON
    value (a list, an int or a string). Ids come back as canonical ``str(int)``.

    Raises:
        ValueError: saying why (no label, a negative id, an id at or above ``limit``, a value
            that is neither an id nor a name).
    """
    items = cell if isinstance(cell, list) else [cell]
    tokens: list[str] = []
    for v in items:
        if isinstance(v, bool) or v is None or isinstance(v, (dict, list)):
            raise ValueError(f"{v!r} is not a class id or name")
        if isinstance(v, float):
            if not (math.isfinite(v) and v.is_integer()):
                raise ValueError(f"{v!r} is not a class id")
            v = int(v)
        tokens += [str(v)] if isinstance(v, int) else [t for t in SEPARATORS.split(v) if t]
    if not tokens:
        raise ValueError("no label")
    out = []
    for t in tokens:
        i = as_int(t)
        if i is not None and i < 0:
            raise ValueError(f"label {t!r} is negative")
        if i is not None and i >= limit:
            raise ValueError(f"label {t!r} is too large to be a class index (below {limit:,}: "
                             "pipelines.sources.lists.index_limit)")
        out.append(t if i is None else str(i))
    return out


def as_int(s: str) -> int | None:
    """``s`` as an integer label: an integer, or an integer-valued float (``"3.0"``, as pandas
    writes an int column that held a NaN); ``None`` when it is neither (a class name)."""
    try:
        return int(s)
    except ValueError:
        pass
    try:
        f = float(s)
    except ValueError:
        return None
    return int(f) if math.isfinite(f) and f.is_integer() else None


def multi_hot(rows: Sequence[list[str]], where: str) -> tuple[np.ndarray, list[str]]:
    """``(float32 N x C multi-hot, classes)`` of the rows' labels (``split_labels``): ids as
    given, or names sorted into the class list; ``ValueError`` (``where``: the root) when the
    rows mix the two."""
    ints = {t for r in rows for t in r if t.lstrip("-").isdigit()}
    names = {t for r in rows for t in r} - ints
    if ints and names:
        raise ValueError(f"{where}: multi-label targets mix class ids (e.g. {min(ints)!r}) and "
                         f"class names (e.g. {min(names)!r}); use one kind")
    classes = ([str(i) for i in range(max(map(int, ints)) + 1)] if ints else sorted(names))
    index = {c: k for k, c in enumerate(classes)}
    out = np.zeros((len(rows), len(classes)), np.float32)
    for n, r in enumerate(rows):
        out[n, [index[t] for t in r]] = 1.0
    return out, classes


def as_number(value: Any, column: str) -> float:
    """One regression value (a cell's text or a JSON value) as a finite float; ``ValueError``
    naming ``column`` when it is missing, not a number or not finite."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"no {column!r} value")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{column!r} is {value!r}, not a number")
    try:
        f = float(value)
    except ValueError:
        raise ValueError(f"{column!r} is {value!r}, not a number") from None
    if not math.isfinite(f):
        raise ValueError(f"{column!r} is {value!r}, not a finite number")
    return f


def build_targets(target: Any, paths: Sequence[str], base: str | os.PathLike,
                  read: np.ndarray | None = None, shards: Sequence[str] | None = None,
                  shard_of: np.ndarray | None = None) -> torch.Tensor | None:
    """The targets of every sample (a CPU tensor indexed by dataset index), or ``None`` for
    ``"class"`` (the backends' own labels).

    Args:
        target: ``LoaderConfig.target``.
        paths, base: the listing and the folder its paths are relative to
            (``pipelines.sources.root.root_base``), for a callable.
        read: the float32 targets the source read (``"multilabel"``, column tuples).
        shards, shard_of: for tar shards, the shard paths and each sample's shard, so a
            ``target_fn`` is given ``SHARD.tar/MEMBER`` with the member name as it is (a
            ``..`` in it is not resolved against the shard's path).

    Raises:
        ValueError: naming ``target`` and the sample: the callable raised, or returned
            something that is not an int (in int64) or a sequence of floats finite in float32,
            of one length (a ``str`` or ``bytes`` is refused, not split into characters).
    """
    if target == "class":
        return None
    if from_source(target):
        if read is None:  # pragma: no cover - open_source reads them or refuses the root
            raise ValueError(f"target={target!r}: the source read no targets")
        return torch.from_numpy(np.ascontiguousarray(read, np.float32))
    if target == "none":
        return torch.arange(len(paths), dtype=torch.int64)
    fn: Callable[[str], Any] = target
    rows: list = []
    for i, p in enumerate(paths):
        shard = shards[int(shard_of[i])] if shards is not None and shard_of is not None else None
        rel = relative_path(p, base, shard)
        try:
            v = fn(rel)
        except Exception as e:  # noqa: BLE001 - the user's function, named with its sample
            raise ValueError(f"target: target_fn({rel!r}) raised {type(e).__name__}: {e}"
                             ) from None
        rows.append(_value(v, rel, rows[0] if rows else None))
    if not rows:
        return torch.empty(0, dtype=torch.int64)
    if isinstance(rows[0], int):
        return torch.tensor(rows, dtype=torch.int64)
    return torch.tensor(rows, dtype=torch.float32)


def relative_path(path: str, base: str | os.PathLike, shard: str | None = None) -> str:
    """``path`` relative to ``base``, as a ``target_fn`` is given it: for a member of the tar
    ``shard`` (``path`` is ``SHARD/MEMBER``), the shard's relative path, ``/`` and the member
    name as the tar holds it."""
    if shard is not None and path.startswith(shard + "/"):
        return f"{os.path.relpath(shard, base)}/{path[len(shard) + 1:]}"
    return os.path.relpath(path, base)


INT64 = (-(2**63), 2**63)


def _value(v: Any, rel: str, first: Any) -> Any:
    """One ``target_fn`` result as a Python int (in int64) or a list of floats finite in
    float32 (the dtypes of ``labels``), or a ``ValueError`` naming ``target`` and the
    sample."""
    if isinstance(v, (np.integer, int)) and not isinstance(v, (bool, np.bool_)):
        v = int(v)  # numpy integer scalars are ints
        if not INT64[0] <= v < INT64[1]:
            raise ValueError(f"target: target_fn({rel!r}) returned {v}, beyond int64; return "
                             "a class index or id that fits in int64")
    elif isinstance(v, (str, bytes, bytearray)) or not _floats(v):
        raise ValueError(f"target: target_fn({rel!r}) returned {_short(v)}; it must return an "
                         "int or a sequence of floats finite in float32")
    if isinstance(v, int):
        if first is not None and not isinstance(first, int):
            raise ValueError(f"target: target_fn({rel!r}) returned an int, but a sequence for "
                             "the first sample; return one kind for every sample")
        return v
    out = [float(x) for x in np.asarray([float(x) for x in v], np.float32).tolist()]
    if first is not None and (isinstance(first, int) or len(first) != len(out)):
        raise ValueError(f"target: target_fn({rel!r}) returned {len(out)} values, the first "
                         f"sample {1 if isinstance(first, int) else len(first)}; return one "
                         "length for every sample")
    return out


def _short(v: Any) -> str:
    return reprlib.repr(v)


def _floats(v: Any) -> bool:
    """Whether ``v`` is a non-empty sequence of numbers (no bools, strings or nested
    sequences) that are finite once converted to float32."""
    try:
        if isinstance(v, (str, bytes, bytearray)) or len(v) == 0:
            return False
        vals = []
        for x in v:
            if isinstance(x, (bool, np.bool_, str, bytes, bytearray)):
                return False
            vals.append(float(x))
        with np.errstate(over="ignore"):
            return bool(np.isfinite(np.asarray(vals, np.float32)).all())
    except (TypeError, ValueError, OverflowError):
        return False
