"""``LoaderConfig.classes``: one class list for every split, so the ids never depend on what a
split holds.

NOTE [one class list]
Without ``classes`` each split numbers its own classes: the sorted class folders, a list's
sorted names, the largest integer label. A validation split that lacks one class then shifts
the id of every class after it, silently. ``classes=`` fixes the ids for every split: a
sequence of distinct names (id = position; ``train_loader.classes`` is one), or a count ``n``
for integer ids (the names ``"0" .. "n-1"``). Each source lists as it always does, and its own
classes are then mapped onto the list (``fix_labels``), the same way for every source:

* a folder: each class folder's name is looked up in the list;
* a file list or tar shards: an integer label (a list's label cell, a shard's ``.cls`` /
  ``.json``, a multi-label id) is an id, an index into the list, in ``[0, len(classes))``; any
  other label is a class name, looked up in the list. Multi-label rows map each label so.

A class of the list that a split lacks keeps its id (and its name in ``loader.classes``). A
class the split holds that is not in the list (a folder, a name, an id ``>= len(classes)``) is
one ``DatasetRootError`` naming it and ``classes`` under ``on_bad_file="error"``; under
``"skip"`` its samples (a multi-label row with any such label) are left out, named in one
warning and counted in ``loader.stats``. A folder of the list with no image is refused unless
``allow_empty_classes``, as without ``classes``; folders outside the list may be empty under
``"skip"``. The listing cache holds each folder's own listing, so one entry serves every class
list (``pipelines.sources.cache``).
"""
from __future__ import annotations

import operator
import reprlib
import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from pipelines.sources.folder import DatasetRootError
from pipelines.sources.shards import ShardSet
from pipelines.sources.targets import as_int

MAX_CLASSES = 2**24  # a larger count is a typo or an id: its names alone would take gigabytes


def check_classes(classes: Any) -> tuple[str, ...] | int | None:
    """``classes`` as ``LoaderConfig`` stores it: ``None``, a count (int) or a tuple of names.

    Raises:
        TypeError: naming ``classes``: not a count or a sequence of names.
        ValueError: naming ``classes``: a count outside ``[1, 2**24]``, no names, a name that
            is not a non-empty string, or a name given twice.
    """
    if classes is None:
        return None
    if isinstance(classes, bool):
        raise TypeError(f"classes={classes!r} must be a count of class ids or a sequence of "
                        "class names")
    try:
        n = operator.index(classes)
    except TypeError:
        n = None
    if n is not None:
        if not 1 <= n <= MAX_CLASSES:
            raise ValueError(f"classes={classes!r}: a count of class ids must be in "
                             f"[1, {MAX_CLASSES:,}]")
        return n
    if isinstance(classes, (str, bytes, Mapping)) or not hasattr(classes, "__iter__"):
        raise TypeError(f"classes={_short(classes)} must be a count of class ids or a sequence "
                        "of class names in id order (e.g. train_loader.classes)")
    names = list(classes)
    bad = next((c for c in names if not isinstance(c, str) or not c), None)
    if not names or bad is not None:
        raise ValueError(f"classes={_short(classes)}: " + (
            "no class names" if not names else f"{bad!r} is not a non-empty str class name"))
    twice = next((c for c, k in Counter(names).items() if k > 1), None)
    if twice is not None:
        raise ValueError(f"classes={_short(classes)}: {twice!r} is named twice; each class "
                         "once, in id order")
    return tuple(str(c) for c in names)


def check_target(classes: Any, target: Any) -> None:
    """``ValueError`` naming both when ``classes`` is set for a ``target`` without classes."""
    if classes is not None and not (isinstance(target, str) and target in ("class", "multilabel")):
        raise ValueError(f"classes fixes class ids, and target={_short(target)} has none; use "
                         "target='class' or 'multilabel', or leave classes=None")


def class_names(classes: tuple[str, ...] | int) -> list[str]:
    """The names of a checked ``classes``: its names, or ``"0" .. "n-1"`` for a count."""
    return [str(i) for i in range(classes)] if isinstance(classes, int) else list(classes)


def count_of(classes: tuple[str, ...] | int | None) -> int:
    """How many classes a checked ``classes`` holds, ``0`` for ``None``: every id below it is
    valid, so no source refuses one as too large (``pipelines.sources.lists.index_limit``)."""
    return 0 if classes is None else classes if isinstance(classes, int) else len(classes)


def _short(v: Any) -> str:
    return reprlib.repr(v)


def _describe(names: list[str]) -> str:
    if names == [str(i) for i in range(len(names))]:
        return f"classes={len(names)}: ids 0..{len(names) - 1}"
    shown = ", ".join(repr(c) for c in names[:3]) + (", ..." if len(names) > 3 else "")
    return f"classes: {len(names)} names ({shown})"


def fix_labels(names: list[str], labels: np.ndarray, own: list[str], classes: tuple[str, ...] | int,
               *, by_name: bool, skip_bad: bool, where: str
               ) -> tuple[np.ndarray, np.ndarray, list[str], list[tuple[str, str]]]:
    """Map a listing onto the fixed class list (module NOTE).

    Args:
        names: each sample's name (messages and ``loader.stats``).
        labels: the source's own int64 class indices (``N``) or float32 multi-hot rows
            (``N x C``), both indexing ``own``.
        own: the source's own class names.
        classes: the checked ``LoaderConfig.classes``.
        by_name: a folder: every own class is a name (a list's or shard's integer label is an
            id).
        skip_bad: ``on_bad_file="skip"``: leave out the samples of classes outside the list.
        where: ``root=...`` for messages.

    Returns:
        ``(keep, labels, class names, skipped)``: the kept samples' positions, their labels on
        the fixed list, the fixed names and ``(name, why)`` of each sample left out.

    Raises:
        DatasetRootError: naming the class and ``classes``: a class outside the list (unless
            ``skip_bad``), or no sample left.
    """
    fixed = class_names(classes)
    index = {c: k for k, c in enumerate(fixed)}
    table = np.full(len(own), -1, np.int64)
    for k, c in enumerate(own):
        i = None if by_name else as_int(c)
        if i is None:
            table[k] = index.get(c, -1)
        elif 0 <= i < len(fixed):
            table[k] = i
    outside = np.flatnonzero(table < 0)
    multi = labels.ndim == 2
    if multi:
        hit = labels[:, outside] > 0 if len(outside) else np.zeros((len(labels), 0), bool)
        bad_rows = hit.any(axis=1)
    else:
        hit = None
        bad_rows = np.isin(labels, outside)
    if bad_rows.any():
        rows = np.flatnonzero(bad_rows)
        first = int(rows[0])
        c = own[int(outside[int(np.argmax(hit[first]))])] if hit is not None else own[int(labels[first])]
        what = (f"class folder {c!r}" if by_name else
                f"label {c!r}" + (" (an id)" if as_int(c) is not None else ""))
        if not skip_bad:
            count = len(rows)
            raise DatasetRootError(
                f"{where}: {what} ({count} sample{'s' if count > 1 else ''}, e.g. "
                f"{names[first]!r}) is not in {_describe(fixed)}; add it to classes, or pass "
                "on_bad_file='skip' to leave such samples out, counted")
        per: dict[str, int] = {}
        skipped = []
        for r in rows.tolist():
            cls = (own[int(labels[r])] if hit is None else
                   own[int(outside[int(np.argmax(hit[r]))])])
            per[cls] = per.get(cls, 0) + 1
            skipped.append((names[r], f"class {cls!r} is not in classes"))
        shown = ", ".join(f"{c!r} ({n})" for c, n in list(per.items())[:5])
        warnings.warn(f"{where}: skipped {len(skipped)} samples of {len(per)} classes not in "
                      f"{_describe(fixed)} (on_bad_file='skip'): {shown}"
                      + (f" and {len(per) - 5} more" if len(per) > 5 else ""),
                      RuntimeWarning, stacklevel=4)
    else:
        skipped = []
    keep = np.flatnonzero(~bad_rows)
    if not len(keep):
        raise DatasetRootError(f"{where} holds no sample of {_describe(fixed)}")
    if multi:
        out = np.zeros((len(keep), len(fixed)), np.float32)
        inside = np.flatnonzero(table >= 0)
        out[:, table[inside]] = labels[keep][:, inside]
        return keep, out, fixed, skipped
    return keep, table[labels[keep]], fixed, skipped


def check_empty(own: list[str], labels: np.ndarray, classes: tuple[str, ...] | int, *,
                allow_empty: bool, skip_bad: bool, where: str, kinds: str) -> None:
    """A folder walked with ``allow_empty`` for ``classes``: what the mapping (``fix_labels``)
    cannot see, its class folders with no image. One outside the list is refused naming it
    and ``classes`` (skipped under ``skip_bad``); one of the list is refused as the walk would
    have refused it, unless ``allow_empty``."""
    fixed = class_names(classes)
    known = set(fixed)
    counts = np.bincount(labels, minlength=len(own)) if len(labels) else np.zeros(len(own), int)
    empty = [c for c, n in zip(own, counts.tolist()) if n == 0]
    outside = [c for c in empty if c not in known]
    if outside and not skip_bad:
        raise DatasetRootError(
            f"{where}: class folder {outside[0]!r} (no image) is not in {_describe(fixed)}; "
            "remove it, add it to classes, or pass on_bad_file='skip' to skip it")
    empty = [c for c in empty if c in known]
    if empty and not allow_empty:
        names = ", ".join(repr(c) for c in empty[:5]) + (" ..." if len(empty) > 5 else "")
        raise DatasetRootError(
            f"{where}: {len(empty)} class folder(s) hold no {kinds} file: {names}; "
            "remove them or pass allow_empty_classes=True")

Skipped = tuple[tuple[str, str], ...]


def fix_listing(paths: list[str], labels: np.ndarray, own: list[str], classes, *, by_name: bool,
                skip_bad: bool, where: str) -> tuple[list[str], np.ndarray, list[str], Skipped]:
    """A folder's or file list's ``(paths, labels, classes, skipped)`` on the fixed class list
    (``fix_labels``); the listing itself, nothing skipped, when ``classes`` is ``None``."""
    if classes is None:
        return paths, labels, own, ()
    keep, labels, names, skipped = fix_labels(paths, labels, own, classes, by_name=by_name,
                                              skip_bad=skip_bad, where=where)
    return [paths[i] for i in keep.tolist()], labels, names, tuple(skipped)


def fix_shards(s: ShardSet, classes, skip_bad: bool, where: str) -> tuple[ShardSet, Skipped]:
    """A shard set on the fixed class list (``fix_labels``), the samples left out dropped
    from its arrays and ``groups``; ``s`` itself when ``classes`` is ``None``."""
    if classes is None:
        return s, ()
    keep, labels, names, skipped = fix_labels(s.names, s.labels, s.classes, classes,
                                              by_name=False, skip_bad=skip_bad, where=where)
    shard_of = s.shard_of[keep]
    return replace(s, names=[s.names[i] for i in keep.tolist()], labels=labels, classes=names,
                   shard_of=shard_of, offsets=s.offsets[keep], sizes=s.sizes[keep],
                   groups=np.bincount(shard_of, minlength=len(s.shards)).astype(np.int64)
                   ), tuple(skipped)
