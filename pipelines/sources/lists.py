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
then indexed, as ``ImageFolder`` does with folders); one list may not mix the two. An
integer-valued number written as a float (``3.0``, ``3.00``, ``3e0``: what pandas writes for an
int column that held a NaN) is the integer: an index, not a name. A row with an empty or
malformed label is refused under ``on_bad_file="error"`` (one ``ValueError`` naming the file and
line) and dropped under ``"skip"`` (counted and named in one warning). So is a row whose index
label is too large to be a class index of this dataset (``index_limit``: a typo or an id, which
would otherwise make billions of class names). A row whose file is missing is a bad file when
it is read, under the same policy as any unreadable file.
"""
from __future__ import annotations

import csv
import math
import os
import warnings
from pathlib import Path
from typing import cast

import numpy as np

LIST_SUFFIXES = (".csv", ".tsv", ".txt")
PATH_COLUMNS = ("path", "file", "filename", "image", "image_path")
LABEL_COLUMNS = ("label", "class", "target", "class_name", "category")
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


def _rows(path: Path) -> list[tuple[int, str, str]]:
    """``(line, path, label)`` rows of the list (module NOTE)."""
    suffix = path.suffix.lower()
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"root={str(path)!r}: cannot read the file list ({e})") from None
    if suffix == ".txt":
        out = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            parts = line.rsplit(None, 1)
            out.append((n, parts[0].strip(), parts[1] if len(parts) == 2 else ""))
        return out
    reader = csv.reader(text.splitlines(), delimiter="\t" if suffix == ".tsv" else ",")
    header = next(reader, None)
    if header is None:
        raise ValueError(f"root={str(path)!r}: the file list is empty")
    names = [h.strip().lower() for h in header]
    pi = next((names.index(c) for c in PATH_COLUMNS if c in names), None)
    li = next((names.index(c) for c in LABEL_COLUMNS if c in names), None)
    if pi is None or li is None:
        raise ValueError(f"root={str(path)!r}: the header {header} must name a path column "
                         f"(one of {', '.join(PATH_COLUMNS)}) and a label column (one of "
                         f"{', '.join(LABEL_COLUMNS)})")
    out = []
    for n, row in enumerate(reader, 2):
        if not row or not any(c.strip() for c in row):
            continue
        get = lambda i, row=row: row[i].strip() if i < len(row) else ""  # noqa: E731
        out.append((n, get(pi), get(li)))
    return out


def list_file(path, skip_bad: bool = False
              ) -> tuple[list[str], np.ndarray, list[str], list[str]]:
    """List a file-list dataset (module NOTE).

    Returns:
        ``(paths, labels, classes, dropped)``: ``dropped`` names the rows left out under
        ``skip_bad`` (``file:line: why``).

    Raises:
        ValueError: unreadable list, missing header columns, no rows, mixed label kinds, a
            negative index label, or (when not ``skip_bad``) a row with a bad label or an index
            label at or above ``index_limit(rows)``, naming the file and line.
    """
    path = Path(path)
    rows = _rows(path)
    base = path.parent
    good: list[tuple[int, str, str]] = []
    dropped: list[str] = []

    def bad(n: int, why: str) -> None:
        msg = f"{path}:{n}: {why}"
        if not skip_bad:
            raise ValueError(f"root={str(path)!r}: line {n}: {why} (on_bad_file='skip' drops "
                             "such rows)")
        dropped.append(msg)

    for n, rel, label in rows:
        if not rel:
            bad(n, "no path")
        elif not label:
            bad(n, f"no label for {rel!r}")
        else:
            good.append((n, os.path.join(base, rel) if not os.path.isabs(rel) else rel, label))
    if not good:
        raise ValueError(f"root={str(path)!r}: the file list names no sample")
    ints = [as_int(label) for _, _, label in good]
    if all(i is not None for i in ints):
        known = cast("list[int]", ints)  # every label an integer
        if min(known) < 0:
            raise ValueError(f"root={str(path)!r}: label {min(known)} is negative; integer "
                             "labels are class indices >= 0")
        limit = index_limit(len(good))
        keep: list[tuple[tuple[int, str, str], int]] = []
        for row, i in zip(good, known):
            if i >= limit:
                bad(row[0], f"label {row[2]!r} is too large to be a class index of a list of "
                            f"{len(good)} rows (index labels must be below {limit:,}: "
                            "pipelines.sources.lists.index_limit); an id or a typo?")
            else:
                keep.append((row, i))
        if not keep:
            raise ValueError(f"root={str(path)!r}: the file list names no sample")
        good = [row for row, _ in keep]
        known = [i for _, i in keep]
        classes = [str(i) for i in range(max(known) + 1)]
        labels = np.asarray(known, dtype=np.int64)
    elif any(i is not None for i in ints):
        num = next(label for (_, _, label), i in zip(good, ints) if i is not None)
        name = next(label for (_, _, label), i in zip(good, ints) if i is None)
        raise ValueError(f"root={str(path)!r}: labels mix integers (e.g. {num!r}) and class "
                         f"names (e.g. {name!r}); use one kind")
    else:
        classes = sorted({label for _, _, label in good})
        index = {c: k for k, c in enumerate(classes)}
        labels = np.asarray([index[label] for _, _, label in good], dtype=np.int64)
    if dropped:
        more = f" and {len(dropped) - 5} more" if len(dropped) > 5 else ""
        warnings.warn(f"root={str(path)!r}: dropped {len(dropped)} rows with a bad label or path: "
                      + "; ".join(dropped[:5]) + more, RuntimeWarning, stacklevel=4)
    return [p for _, p, _ in good], labels, classes, dropped


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

