"""``Source``: the samples of a dataset root, whatever its kind, and how to read one.

A root is a folder in ImageFolder layout (``pipelines.sources.folder``), a file list
(``pipelines.sources.lists``: CSV, TSV or "path label" text) or WebDataset tar shards
(``pipelines.sources.shards``). Each gives names, labels and classes, and a ``read(i) -> bytes``; the
epoch plan, sharding, bad-file policy and resume are the same for all three (shards add
``groups``, the samples of each shard, to the plan), and so is ``LoaderConfig.classes``, one
class list that each source's labels are mapped onto (``pipelines.sources.classes``). Files
are read by path (DALI reads them in its own threads); shard samples by offset. A folder's
listing and each shard's index are cached (``pipelines.sources.cache``): made once, then read
back while the files are unchanged.

Tar shards may also be remote: ``http(s)://``, ``s3://`` or ``pipe:`` URLs with brace ranges,
or a list of them (``pipelines.sources.remote``), indexed once (``remote_index``) and read from
a local spool (``spool``). Any other scheme (``gs://``, ``ftp://``, ...) raises one
``DatasetRootError`` naming it (``check_local_root``), from ``source_kind``, ``open_source`` and
``list_dataset`` alike, so every backend and command-line tool says the same. A path that
exists locally is local, whatever it looks like.
"""
from __future__ import annotations

import enum
import io
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from pipelines.sources import remote, remote_index
from pipelines.sources.cache import cached_listing
from pipelines.sources.classes import (
    check_classes,
    check_empty,
    count_of,
    fix_listing,
    fix_shards,
)
from pipelines.sources.classes import check_target as check_classes_target
from pipelines.sources.folder import (
    IMAGE_EXTENSIONS,
    DatasetRootError,
    check_extensions,
    class_folders,
    walk_folder,
)
from pipelines.sources.lists import is_file_list, list_file
from pipelines.sources.shards import ShardReader, is_shard_root, list_shards
from pipelines.sources.targets import from_source

SIZE_SAMPLE = 16  # files whose headers stand for a dataset's image sizes
# scheme "://" (or ":/": ``Path`` folds the two slashes, and LoaderConfig stores a Path); one
# letter is a Windows drive, not a scheme
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]+):/(/?)")


def root_base(root) -> str:
    """The folder a listing's paths are relative to: the root folder, or the folder of a file
    list or a single shard."""
    if isinstance(root, (list, tuple)) or remote.is_remote(root):
        first = remote.shown(root).lstrip("[").split(",")[0].rstrip("]")
        return os.path.dirname(first)
    root = str(root)
    return root if os.path.isdir(root) else os.path.dirname(root)


def check_local_root(root) -> None:
    """Raise ``DatasetRootError`` when ``root`` is a URL this package does not read (module
    doc; ``pipelines.sources.remote.check_root``); ``TypeError`` when it is not a str path, a
    URL or a list of them (bytes, a number). ``None`` and ``""`` are left to the listing, which
    names them."""
    if root is None or isinstance(root, bool):
        return
    if isinstance(root, (list, tuple)):
        remote.check_root(list(root))
        return
    try:
        s = os.fspath(root)
    except TypeError:
        s = root
    if not isinstance(s, str):
        raise TypeError(f"root={root!r} must be a str or os.PathLike path, not {type(s).__name__}")
    remote.check_root(unfold(s))


def unfold(s: str) -> str:
    """A URL as its user wrote it: ``Path`` folds ``s3://b`` to ``s3:/b``."""
    m = _URL.match(s)
    if m is None or m.group(2) or os.path.exists(s):
        return s
    return f"{s[:m.end()]}/{s[m.end():]}"


def as_root(root):
    """``root`` as ``LoaderConfig`` stores it: a URL as a str (``unfold``), a list of shards as
    a tuple, a local path as a ``Path``."""
    if isinstance(root, (list, tuple)):
        return tuple(unfold(os.fspath(r)) for r in root)
    s = unfold(os.fspath(root))
    return s if remote.scheme_of(s) else Path(s)


def header_sizes(source: Source, k: int = SIZE_SAMPLE) -> list[tuple[int, int]]:
    """``(width, height)`` of ``k`` images spread evenly over ``source``, from their headers
    (PIL reads no pixels). Files PIL cannot open are left out: the loader reports them later."""
    count = len(source.names)
    picks = sorted({i * count // k for i in range(min(k, count))})
    if getattr(source.read, "remote", False) and source.groups is not None:  # one shard's copy
        first = int(source.groups[0])
        picks = sorted({i * first // k for i in range(min(k, first))})
    out = []
    for i in picks:
        try:
            f = source.names[i] if source.by_path else io.BytesIO(source.read(i))
            with Image.open(f) as im:
                out.append(im.size)
        except Exception:  # an unreadable or non-image file
            continue
    return out


def median_megapixels(source: Source) -> float | None:
    """The median size, in megapixels, of the images ``header_sizes`` samples from ``source``;
    ``None`` when none opened."""
    sizes = [w * h / 1e6 for w, h in header_sizes(source)]
    return float(np.median(sizes)) if sizes else None


class SourceKind(str, enum.Enum):
    FOLDER = "folder"
    LIST = "list"
    SHARDS = "shards"


class FileReader:
    """``reader(i) -> bytes``: the whole file ``paths[i]``."""

    def __init__(self, paths: Sequence[str]):
        self.paths = paths

    def __call__(self, i: int) -> bytes:
        with open(self.paths[i], "rb") as f:
            return f.read()


@dataclass(frozen=True)
class Source:
    """What a loader reads.

    Attributes:
        kind: folder, file list or tar shards.
        names: each sample's path (for shards ``<shard>/<key>.<ext>``): messages, bad-file
            reports and the resume fingerprint.
        labels, classes: the labels and the class names (index = label); with no class
            (a flat folder, a path-only list, column targets) zeros and ``[]``. With
            ``LoaderConfig.classes``, that list (``pipelines.sources.classes``).
        read: ``read(i) -> bytes``, sample ``i``'s encoded image (picklable).
        groups: samples per shard, in order (the plan's ``groups``); ``None`` unless shards.
        targets: the float32 targets read from the files for a ``"multilabel"`` or column
            ``target`` (``pipelines.sources.targets``), else ``None``.
        skipped: ``(name, why)`` of the samples left out because their class is not in
            ``LoaderConfig.classes`` (``on_bad_file="skip"``), for ``loader.stats``.
    """

    kind: SourceKind
    names: list[str]
    labels: np.ndarray
    classes: list[str]
    read: Callable[[int], bytes]
    groups: np.ndarray | None = None
    targets: np.ndarray | None = None
    skipped: tuple[tuple[str, str], ...] = ()

    @property
    def by_path(self) -> bool:
        """Each sample is a whole file at ``names[i]`` (DALI may read it by path)."""
        return self.kind is not SourceKind.SHARDS


def source_kind(root) -> SourceKind:
    """Which kind of root ``root`` is (no listing is made); ``DatasetRootError`` for a URL."""
    check_local_root(root)
    if is_shard_root(root):
        return SourceKind.SHARDS
    if root is not None and not isinstance(root, bool) and is_file_list(root):
        return SourceKind.LIST
    return SourceKind.FOLDER


def open_source(root, *, allow_empty: bool = False,
                extensions: tuple[str, ...] = IMAGE_EXTENSIONS, skip_bad: bool = False,
                target: object = "class", storage: remote.Storage | None = None,
                classes: object = None) -> Source:
    """The ``Source`` of ``root`` (arguments as ``list_dataset``'s; ``target`` as
    ``LoaderConfig.target``: which labels the files must hold, ``pipelines.sources.targets``;
    ``storage``: how remote shards are reached, ``pipelines.sources.remote``; ``classes`` as
    ``LoaderConfig.classes``: the class list the labels are mapped onto,
    ``pipelines.sources.classes``).

    Raises:
        ValueError: naming ``target``: a ``"multilabel"`` or column target for a folder root;
            naming ``classes``: a bad list, or a class of ``root`` outside it
            (``DatasetRootError``, unless ``skip_bad``).
    """
    check_local_root(root)
    classes = check_classes(classes)
    check_classes_target(classes, target)
    if isinstance(root, (str, os.PathLike)) and not isinstance(root, str):
        root = unfold(os.fspath(root))
    if remote.is_remote(root):
        return _remote_source(root, extensions, skip_bad, storage or remote.Storage(), target,
                              classes)
    if is_shard_root(root):
        s = list_shards(root, check_extensions(extensions), skip_bad=skip_bad, target=target,
                        min_limit=count_of(classes))
        s, skipped = fix_shards(s, classes, skip_bad, f"root={remote.shown(root)!r}")
        labels, targets = _split_targets(s.labels)
        return Source(SourceKind.SHARDS, s.names, labels, s.classes,
                      ShardReader(s.shards, s.shard_of, s.offsets, s.sizes), s.groups, targets,
                      skipped)
    kind = source_kind(root)
    if kind is SourceKind.FOLDER and from_source(target):
        raise ValueError(f"target={target!r} needs a file list or tar shards; root={str(root)!r} is "
                         "a folder, which gives one class per image (use target='class', 'none' "
                         "or a target_fn)")
    paths, labels, names, skipped = _list_files(root, allow_empty, extensions, skip_bad, target,
                                                classes)
    labels, targets = _split_targets(labels)
    return Source(kind, paths, labels, names, FileReader(paths), None, targets, skipped)


def _split_targets(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """``(int64 labels, float32 targets or None)``: a listing's 2-D labels are targets, and the
    backends then carry zeros."""
    if labels.ndim == 2:
        return np.zeros(len(labels), np.int64), labels.astype(np.float32)
    return labels, None


def _remote_source(root, extensions, skip_bad: bool, storage: remote.Storage,
                   target: object = "class", classes=None) -> Source:
    """Remote shards (``pipelines.sources.remote``), read from their spooled copies."""
    from pipelines.sources.spool import SpoolReader

    names = remote.register(root, storage)
    if any(not remote.scheme_of(n) for n in names):
        raise DatasetRootError(f"root={remote.shown(root)!r}: a list mixes local and remote "
                               "shards; list only one kind")
    if from_source(target):
        raise ValueError(f"target={target!r} is read from each sample's label members, which "
                         "remote shards do not serve yet; use target='class', 'none' or a "
                         "target_fn, or copy the shards to a local folder")
    s = list_shards(root, check_extensions(extensions), skip_bad=skip_bad, target=target,
                    min_limit=count_of(classes))
    s, skipped = fix_shards(s, classes, skip_bad, f"root={remote.shown(root)!r}")
    labels, targets = _split_targets(s.labels)
    known = remote_index.STAMPS
    stamps = np.stack([known[n] if n in known else remote.stamp(n) for n in s.shards])
    files = [remote_index.spool_key(n, st) + ".tar" for n, st in zip(s.shards, stamps)]
    return Source(SourceKind.SHARDS, s.names, labels, s.classes,
                  SpoolReader(s.shards, files, s.shard_of, s.offsets, s.sizes, stamps,
                              storage.timeout), s.groups, targets, skipped)


def list_dataset(root: str | os.PathLike, *, allow_empty: bool = False,
                 extensions: tuple[str, ...] = IMAGE_EXTENSIONS, skip_bad: bool = False
                 ) -> tuple[list[str], np.ndarray, list[str]]:
    """``(names, labels, classes)`` of a folder, a file list or tar shards.

    Args:
        root: an ImageFolder root, a ``.csv`` / ``.tsv`` / ``.txt`` file list, or tar shards
            (a ``.tar``, a glob or brace pattern, a folder of ``.tar`` files).
        allow_empty: for folders (``list_samples``).
        extensions: the image extensions of folders and shards.
        skip_bad: for file lists and shards: drop rows with a bad label, and bad shards or
            samples (counted and named in one warning) instead of raising
            (``on_bad_file="skip"``).

    Raises:
        DatasetRootError: (a ``ValueError``) the root is missing, empty, holds no images, or is
            a URL (remote roots are not supported yet); ``ShardError`` for bad shards.
        ValueError: a bad file list (``pipelines.sources.lists``).
    """
    s = open_source(root, allow_empty=allow_empty, extensions=extensions, skip_bad=skip_bad)
    return s.names, s.labels, s.classes


def _list_files(root, allow_empty: bool, extensions, skip_bad: bool, target: object = "class",
                classes=None) -> tuple[list[str], np.ndarray, list[str], tuple]:
    """``(paths, labels, classes, skipped)`` of a file list or a folder, on the fixed class
    list when ``classes`` is given (``pipelines.sources.classes``)."""
    where = f"root={str(root)!r}"
    if root is not None and not isinstance(root, bool) and is_file_list(root):
        paths, labels, own, _ = list_file(root, skip_bad=skip_bad, target=target,
                                          min_limit=count_of(classes))
        return fix_listing(paths, labels, own, classes, by_name=False, skip_bad=skip_bad,
                           where=where)
    extensions = check_extensions(extensions)
    try:
        missing = not os.path.isdir(root)
    except TypeError:
        missing = True
    if missing:  # no cache entry for what is not a folder: the walk gives the error
        return (*walk_folder(root, allow_empty, extensions)[0], ())
    # "none" and a target_fn need no class: a folder without class folders is then flat
    flat = target != "class" and not class_folders(root)
    # with classes, empty folders are judged after the mapping (check_empty): the walk keeps them
    walk_empty = allow_empty or classes is not None
    paths, labels, own = cached_listing(
        root, extensions, walk_empty, lambda: walk_folder(root, walk_empty, extensions, flat), flat)
    if classes is None:
        return paths, labels, own, ()
    fixed = fix_listing(paths, labels, own, classes, by_name=True, skip_bad=skip_bad,
                        where=where)
    check_empty(own, labels, classes, allow_empty=allow_empty, skip_bad=skip_bad, where=where,
                kinds="/".join(extensions))
    return fixed

