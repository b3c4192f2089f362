"""``list_dataset``: the samples of a dataset root, whatever its kind.

A root is a folder in ImageFolder layout (``pipelines.listing``) or a file list
(``pipelines.filelist``: CSV, TSV or "path label" text). Both give ``(paths, labels, classes)``
and every backend reads a sample by its path, so the epoch plan, sharding, bad-file policy and
resume are the same for both. A folder's listing is cached (``pipelines.listcache``): made once,
then read back while the tree is unchanged.
"""
from __future__ import annotations

import os
from typing import List, Tuple

import numpy as np

from .filelist import is_file_list, list_file
from .listcache import cached_listing
from .listing import IMAGE_EXTENSIONS, check_extensions, walk_folder


def list_dataset(root: str | os.PathLike, *, allow_empty: bool = False,
                 extensions: Tuple[str, ...] = IMAGE_EXTENSIONS, skip_bad: bool = False
                 ) -> Tuple[List[str], np.ndarray, List[str]]:
    """``(paths, labels, classes)`` of a folder or a file list.

    Args:
        root: an ImageFolder root, or a ``.csv`` / ``.tsv`` / ``.txt`` file list.
        allow_empty, extensions: for folders (``list_samples``).
        skip_bad: for file lists: drop rows with a bad label (counted and named in one
            warning) instead of raising (``on_bad_file="skip"``).
    """
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
