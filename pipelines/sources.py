"""``Source``: the samples of a dataset root, whatever its kind, and how to read one.

A root is a folder in ImageFolder layout (``pipelines.listing``), a file list
(``pipelines.filelist``: CSV, TSV or "path label" text) or WebDataset tar shards
(``pipelines.shards``). Each gives names, labels and classes, and a ``read(i) -> bytes``; the
epoch plan, sharding, bad-file policy and resume are the same for all three (shards add
``groups``, the samples of each shard, to the plan). Files are read by path (DALI reads them
in its own threads); shard samples by offset. A folder's listing and each shard's index are
cached (``pipelines.listcache``): made once, then read back while the files are unchanged.
"""
from __future__ import annotations

import enum
import io
import os
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

from .filelist import is_file_list, list_file
from .listcache import cached_listing
from .listing import IMAGE_EXTENSIONS, check_extensions, walk_folder
from .shards import ShardReader, is_shard_root, list_shards


SIZE_SAMPLE = 16  # files whose headers stand for a dataset's image sizes


def header_sizes(source: "Source", k: int = SIZE_SAMPLE) -> List[Tuple[int, int]]:
    """``(width, height)`` of ``k`` images spread evenly over ``source``, from their headers
    (PIL reads no pixels). Files PIL cannot open are left out: the loader reports them later."""
    count = len(source.names)
    picks = sorted({i * count // k for i in range(min(k, count))})
    out = []
    for i in picks:
        try:
            f = source.names[i] if source.by_path else io.BytesIO(source.read(i))
            with Image.open(f) as im:
                out.append(im.size)
        except Exception:  # an unreadable or non-image file
            continue
    return out


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
        labels, classes: the labels and the class names (index = label).
        read: ``read(i) -> bytes``, sample ``i``'s encoded image (picklable).
        groups: samples per shard, in order (the plan's ``groups``); ``None`` unless shards.
    """

    kind: SourceKind
    names: List[str]
    labels: np.ndarray
    classes: List[str]
    read: Callable[[int], bytes]
    groups: Optional[np.ndarray] = None

    @property
    def by_path(self) -> bool:
        """Each sample is a whole file at ``names[i]`` (DALI may read it by path)."""
        return self.kind is not SourceKind.SHARDS


def source_kind(root) -> SourceKind:
    """Which kind of root ``root`` is (no listing is made)."""
    if is_shard_root(root):
        return SourceKind.SHARDS
    if root is not None and not isinstance(root, bool) and is_file_list(root):
        return SourceKind.LIST
    return SourceKind.FOLDER


def open_source(root: str | os.PathLike, *, allow_empty: bool = False,
                extensions: Tuple[str, ...] = IMAGE_EXTENSIONS, skip_bad: bool = False
                ) -> Source:
    """The ``Source`` of ``root`` (arguments as ``list_dataset``'s)."""
    if is_shard_root(root):
        s = list_shards(root, check_extensions(extensions), skip_bad=skip_bad)
        return Source(SourceKind.SHARDS, s.names, s.labels, s.classes,
                      ShardReader(s.shards, s.shard_of, s.offsets, s.sizes), s.groups)
    kind = source_kind(root)
    paths, labels, classes = _list_files(root, allow_empty, extensions, skip_bad)
    return Source(kind, paths, labels, classes, FileReader(paths))


def list_dataset(root: str | os.PathLike, *, allow_empty: bool = False,
                 extensions: Tuple[str, ...] = IMAGE_EXTENSIONS, skip_bad: bool = False
                 ) -> Tuple[List[str], np.ndarray, List[str]]:
    """``(names, labels, classes)`` of a folder, a file list or tar shards.

    Args:
        root: an ImageFolder root, a ``.csv`` / ``.tsv`` / ``.txt`` file list, or tar shards
            (a ``.tar``, a glob or brace pattern, a folder of ``.tar`` files).
        allow_empty: for folders (``list_samples``).
        extensions: the image extensions of folders and shards.
        skip_bad: for file lists and shards: drop rows with a bad label, and bad shards or
            samples (counted and named in one warning) instead of raising
            (``on_bad_file="skip"``).
    """
    s = open_source(root, allow_empty=allow_empty, extensions=extensions, skip_bad=skip_bad)
    return s.names, s.labels, s.classes


def _list_files(root, allow_empty: bool, extensions, skip_bad: bool
                ) -> Tuple[List[str], np.ndarray, List[str]]:
    if root is not None and not isinstance(root, bool) and is_file_list(root):
        paths, labels, classes, _ = list_file(root, skip_bad=skip_bad)
        return paths, labels, classes
    extensions = check_extensions(extensions)
    try:
        missing = not os.path.isdir(root)
    except TypeError:
        missing = True
    if missing:  # no cache entry for what is not a folder: the walk gives the error
        return walk_folder(root, allow_empty, extensions)[0]
    return cached_listing(root, extensions, allow_empty,
                          lambda: walk_folder(root, allow_empty, extensions))
