"""``list_file``: a dataset given as a file list (CSV, TSV or a plain "path label" text file).

NOTE [file lists]
``LoaderConfig(root=...)`` may name a list file instead of a folder:

* ``.csv`` / ``.tsv``: a header row naming a path column (``path``, ``file``, ``filename``,
  ``image``, ``image_path``) and a label column (``label``, ``class``, ``target``,
  ``class_name``, ``category``), in any case and order; other columns are ignored.
* ``.txt``: one ``path label`` pair per line, split at the last run of whitespace (so paths may
  hold spaces), no header: the layout of the ImageNet validation lists (``val.txt``: a flat
  folder of files and one label per file).

Paths are relative to the list file's folder (absolute ones are kept). Labels are integers (the
class indices as given; ``classes`` are their names ``"0" .. "max"``) or class names (sorted,
then indexed, as ``ImageFolder`` does with folders); one list may not mix the two.
``LoaderConfig.classes`` fixes the class list instead (``pipelines.sources.classes``): an
integer label is then an id into it, a name is looked up in it. An
integer-valued number written as a float (``3.0``, ``3.00``, ``3e0``: what pandas writes for an
int column that held a NaN) is the integer: an index, not a name. A row with an empty or
malformed label is refused under ``on_bad_file="error"`` (one ``ValueError`` naming the file and
line) and dropped under ``"skip"`` (counted and named in one warning). So is a row whose index
label is too large to be a class index of this dataset (``index_limit``: a typo or an id, which
would otherwise make billions of class names). A row whose file is missing is a bad file when
it is read, under the same policy as any unreadable file.

Other targets (``LoaderConfig.target``, ``pipelines.sources.targets``): ``"multilabel"`` reads the
``labels`` column if the header has one, else the label column, as a multi-label cell (a
``.txt`` line's label: ``path 3;7``); a tuple of column names reads those columns (CSV / TSV
only: a ``.txt`` list has no header) and needs no label column; ``"none"`` and a callable need
no label column either (a ``.txt`` line's label is then ignored, and a line may be a bare
path without whitespace).
"""
from __future__ import annotations

import csv
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np

from pipelines.sources.targets import as_int, as_number, from_source, multi_hot, split_labels

LIST_SUFFIXES = (".csv", ".tsv", ".txt")
PATH_COLUMNS = ("path", "file", "filename", "image", "image_path")
LABEL_COLUMNS = ("label", "class", "target", "class_name", "category")
MULTI_COLUMNS = ("labels",) + LABEL_COLUMNS  # target="multilabel": a "labels" column first
MIN_CLASS_LIMIT = 1_000_000  # index labels below this are always accepted (index_limit)
MAX_CLASS_LIMIT = 2 ** 31  # and none at or above it (labels are int32 on some paths)


def index_limit(rows: int) -> int:
    """How many classes the integer labels of a dataset of ``rows`` samples may imply: every
    index label must be below ``min(2**31, max(1_000_000, 4 * rows))``.

    Integer labels are class indices, and the class names are ``"0"`` to the largest one, so a
    label is also a class count. The floor of a million covers every classification taxonomy in
    use (ImageNet-21k has 21,841 classes; face-identity sets reach a few hundred thousand) even for
    a small subset of such a dataset, at a cost of about 60 MB of names. Above it, a label may
    imply at most four classes per sample: more means most classes have no sample at all, which
    is an id or a typo (``3000000000``), not an index, and building its class names would exhaust
    memory. Such labels are bad rows (a ``ValueError`` naming where, or dropped under ``skip``):
    relabel them ``0 .. classes - 1``, or give the ids as class names (e.g. ``id3000000000``).
    """
    return min(MAX_CLASS_LIMIT, max(MIN_CLASS_LIMIT, 4 * int(rows)))


def is_file_list(root) -> bool:
    p = Path(root)
    return p.suffix.lower() in LIST_SUFFIXES and p.is_file()


def _rows(path: Path, target: Any = "class") -> list[tuple[int, str, tuple[str, ...]]]:
    """``(line, path, cells)`` rows of the list (module NOTE): ``cells`` is ``(label,)``, the
    tuple target's columns, or ``()`` when the target needs no label and the list has none."""
    suffix = path.suffix.lower()
    where = f"root={str(path)!r}"
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: cannot read the file list ({e})") from None
    need_label = target == "class" or target == "multilabel"
    if suffix == ".txt":
        if isinstance(target, tuple):
            raise ValueError(f"target={target!r}: {where} is a .txt list, which has no header "
                             "and so no columns; use a .csv or .tsv list whose header names them")
        out: list[tuple[int, str, tuple[str, ...]]] = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            parts = line.rsplit(None, 1)
            label = parts[1] if len(parts) == 2 else ""
            out.append((n, parts[0].strip(), (label,) if need_label else ()))
        return out
    reader = csv.reader(text.splitlines(), delimiter="\t" if suffix == ".tsv" else ",")
    header = next(reader, None)
    if header is None:
        raise ValueError(f"{where}: the file list is empty")
    names = [h.strip().lower() for h in header]
    pi = next((names.index(c) for c in PATH_COLUMNS if c in names), None)
    label_cols = MULTI_COLUMNS if target == "multilabel" else LABEL_COLUMNS
    li = next((names.index(c) for c in label_cols if c in names), None)
    if pi is None or (li is None and need_label):
        raise ValueError(f"{where}: the header {header} must name a path column "
                         f"(one of {', '.join(PATH_COLUMNS)})" + (
                             f" and a label column (one of {', '.join(label_cols)})"
                             if need_label else ""))
    if isinstance(target, tuple):
        missing = [c for c in target if c.lower() not in names]
        if missing:
            raise ValueError(f"target={target!r}: {where}: the header {header} has no column "
                             f"{missing[0]!r}")
        cols = [names.index(c.lower()) for c in target]
    else:
        cols = [] if li is None else [li]
    out = []
    for n, row in enumerate(reader, 2):
        if not row or not any(c.strip() for c in row):
            continue
        get = lambda i, row=row: row[i].strip() if i < len(row) else ""  # noqa: E731
        out.append((n, get(pi), tuple(get(i) for i in cols)))
    return out


def list_file(path, skip_bad: bool = False, target: Any = "class", min_limit: int = 0
              ) -> tuple[list[str], np.ndarray, list[str], list[str]]:
    """List a file-list dataset (module NOTE).

    Args:
        path: the list file.
        skip_bad: drop bad rows (counted and named in one warning) instead of raising.
        target: ``LoaderConfig.target``: which columns are read, and how (module NOTE).
        min_limit: index labels below it are never too large (``index_limit``): the length
            of ``LoaderConfig.classes``, whose ids are all valid.

    Returns:
        ``(paths, labels, classes, dropped)``: ``labels`` are int64 class indices, or float32
        ``N x C`` / ``N x K`` targets for ``"multilabel"`` and column tuples (int64 zeros and no
        classes when the list has no label column); ``dropped`` names the rows left out under
        ``skip_bad`` (``file:line: why``).

    Raises:
        ValueError: unreadable list, missing header columns, no rows, mixed label kinds, a
            negative index label, or (when not ``skip_bad``) a row with a bad label or target
            or an index label at or above ``index_limit(rows)``, naming the file and line.
    """
    path = Path(path)
    rows = _rows(path, target)
    base = path.parent
    good: list[tuple[int, str, tuple[str, ...]]] = []
    dropped: list[str] = []

    def bad(n: int, why: str) -> None:
        msg = f"{path}:{n}: {why}"
        if not skip_bad:
            raise ValueError(f"root={str(path)!r}: line {n}: {why} (on_bad_file='skip' drops "
                             "such rows)")
        dropped.append(msg)

    columns = isinstance(target, tuple)
    for n, rel, cells in rows:
        if not rel:
            bad(n, "no path")
        elif cells and not columns and not cells[0]:
            bad(n, ("target='multilabel': " if target == "multilabel" else "")
                + f"no label for {rel!r}")
        else:
            good.append((n, os.path.join(base, rel) if not os.path.isabs(rel) else rel, cells))
    if not good:
        raise ValueError(f"root={str(path)!r}: the file list names no sample")
    if from_source(target):
        good, labels, classes = _targets(good, target, bad, f"root={str(path)!r}", min_limit)
    elif not good[0][2]:  # no label column: "none" or a target_fn
        labels, classes = np.zeros(len(good), np.int64), []
    else:
        good, labels, classes = _classes(good, bad, path, min_limit)
    if dropped:
        more = f" and {len(dropped) - 5} more" if len(dropped) > 5 else ""
        warnings.warn(f"root={str(path)!r}: dropped {len(dropped)} rows with a bad label or "
                      "path: " + "; ".join(dropped[:5]) + more, RuntimeWarning, stacklevel=4)
    return [p for _, p, _ in good], labels, classes, dropped


Row = tuple[int, str, tuple[str, ...]]


def _targets(good: list[Row], target: Any, bad: Callable[[int, str], None], where: str,
             min_limit: int = 0) -> tuple[list[Row], np.ndarray, list[str]]:
    """The rows whose multi-label cell or columns parse, and their float32 targets."""
    limit = max(index_limit(len(good)), min_limit)
    keep: list[Row] = []
    values: list[Any] = []
    for row in good:
        n, p, cells = row
        try:
            if isinstance(target, tuple):
                values.append([as_number(v, c) for v, c in zip(cells, target)])
            else:
                values.append(split_labels(cells[0], limit))
            keep.append(row)
        except ValueError as e:
            bad(n, f"target={target!r}: {e} for {os.path.basename(p)!r}")
    if not keep:
        raise ValueError(f"{where}: the file list names no sample")
    if isinstance(target, tuple):
        return keep, np.asarray(values, np.float32).reshape(len(keep), len(target)), []
    hot, classes = multi_hot(values, where)
    return keep, hot, classes


def _classes(good: list[Row], bad: Callable[[int, str], None], path: Path, min_limit: int = 0
             ) -> tuple[list[Row], np.ndarray, list[str]]:
    """The rows whose class label is valid, their int64 class indices and the classes."""
    ints = [as_int(cells[0]) for _, _, cells in good]
    if all(i is not None for i in ints):
        known = cast("list[int]", ints)  # every label an integer
        if min(known) < 0:
            raise ValueError(f"root={str(path)!r}: label {min(known)} is negative; integer "
                             "labels are class indices >= 0")
        limit = max(index_limit(len(good)), min_limit)
        keep: list[tuple[Row, int]] = []
        for row, i in zip(good, known):
            if i >= limit:
                bad(row[0], f"label {row[2][0]!r} is too large to be a class index of a list of "
                            f"{len(good)} rows (index labels must be below {limit:,}: "
                            "pipelines.sources.lists.index_limit); an id or a typo?")
            else:
                keep.append((row, i))
        if not keep:
            raise ValueError(f"root={str(path)!r}: the file list names no sample")
        known = [i for _, i in keep]
        return ([row for row, _ in keep], np.asarray(known, dtype=np.int64),
                [str(i) for i in range(max(known) + 1)])
    if any(i is not None for i in ints):
        num = next(c[0] for (_, _, c), i in zip(good, ints) if i is not None)
        name = next(c[0] for (_, _, c), i in zip(good, ints) if i is None)
        raise ValueError(f"root={str(path)!r}: labels mix integers (e.g. {num!r}) and class "
                         f"names (e.g. {name!r}); use one kind")
    classes = sorted({c[0] for _, _, c in good})
    index = {c: k for k, c in enumerate(classes)}
    return good, np.asarray([index[c[0]] for _, _, c in good], dtype=np.int64), classes
