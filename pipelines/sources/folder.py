"""``list_samples``: the ImageFolder listing every backend reads, safe against links and junk.

NOTE [listing]
It follows torchvision's ``ImageFolder`` conventions: the root's sub-folders are the classes,
in sorted order, and every image file below a class folder (recursively, sorted) belongs to that
class. An image file is one whose extension, in any case, is in ``extensions`` (default
``IMAGE_EXTENSIONS``: the formats both engines decode, JPEG, PNG, WebP and BMP); the others are
skipped, counted and named in one warning. Beyond that:

* Hidden files and folders (a leading ``.``, which includes macOS ``._*`` resource forks) and
  OS metadata (``Thumbs.db``, ``desktop.ini``, ``__MACOSX``, ``@eaDir``) are ignored.
* A class folder may itself be a link (``root/cat -> /data/cats``): that is how subsets are
  built, and it is followed silently.
* A directory link *inside* a class folder is followed at most once. It is not followed when it
  would loop (it points at one of its own ancestors, e.g. ``cat/up -> ..`` or ``loop -> .``) or
  when it points inside a class folder: those files are listed once, under their real class.
  A link that leaves the root is followed once (a folder reached twice is listed once). Every
  such link is named in one warning.
* A file link whose target lies in a class folder is a duplicate and is skipped (named in the
  same warning); the target is listed under its real class.
* A class folder with no image raises, as in ``ImageFolder``, unless ``allow_empty=True``
  (``LoaderConfig.allow_empty_classes``).
* ``LoaderConfig.classes`` fixes the class ids instead of the sorted folders
  (``pipelines.sources.classes``, applied to this listing): a missing class folder keeps the
  ids, and a class folder outside the list is refused or skipped.
* A root with no class folder raises, unless ``flat=True`` (``LoaderConfig.target="none"`` or a
  callable: no class is needed): its image files are then the samples, with no classes.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
OS_METADATA = frozenset({"thumbs.db", "desktop.ini", "__macosx", "@eadir", "$recycle.bin"})


class DatasetRootError(ValueError):
    """The dataset root is missing, empty or holds no images."""


def _ignored(name: str) -> bool:
    return name.startswith(".") or name.lower() in OS_METADATA


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip(os.sep) + os.sep)


class _Walker:
    """Depth-first, sorted, pre-order walk of the class folders (files of a folder first, then
    its sub-folders, like ``os.walk``), with the link rules of the module note."""

    def __init__(self, root: Path, classes: list[str], extensions: tuple[str, ...]):
        self.root = root
        self.extensions = extensions
        self.trees = [os.path.realpath(root / c) for c in classes]
        self.visited: set = set()
        self.not_followed: list[str] = []
        self.followed: list[str] = []
        self.skipped: list[str] = []  # files with other extensions

    def _in_classes(self, real: str) -> bool:
        return any(_within(real, t) for t in self.trees)

    def files(self, top: str) -> list[str]:
        out: list[str] = []
        stack = [(top, os.path.realpath(top))]
        if stack[0][1] in self.visited:
            self.not_followed.append(f"{top} (class folder reaches {stack[0][1]} a second time)")
            return out
        self.visited.add(stack[0][1])
        while stack:
            d, real_d = stack.pop()
            try:
                entries = sorted(os.scandir(d), key=lambda e: e.name)
            except OSError as err:
                raise DatasetRootError(f"cannot list {d!r}: {err.strerror or err}") from None
            subdirs = []
            for e in entries:
                if _ignored(e.name):
                    continue
                link = e.is_symlink()
                if e.is_dir(follow_symlinks=True):
                    if not link:
                        real = os.path.join(real_d, e.name)
                    else:
                        real = os.path.realpath(e.path)
                        if _within(real_d, real):
                            self.not_followed.append(f"{e.path} (loops back to {real})")
                            continue
                        if self._in_classes(real):
                            self.not_followed.append(
                                f"{e.path} (points inside the dataset, listed under {real})")
                            continue
                        if real in self.visited:
                            self.not_followed.append(f"{e.path} (reaches {real} a second time)")
                            continue
                        self.followed.append(f"{e.path} -> {real}")
                    if real in self.visited:
                        continue
                    self.visited.add(real)
                    subdirs.append((e.path, real))
                elif e.name.lower().endswith(self.extensions):
                    if link and self._in_classes(os.path.realpath(e.path)):
                        self.not_followed.append(
                            f"{e.path} (file link to {os.path.realpath(e.path)}, listed there)")
                        continue
                    out.append(e.path)
                else:
                    self.skipped.append(e.path)
            stack.extend(reversed(subdirs))
        return out

    def warn_skipped(self, root: Path) -> None:
        if not self.skipped:
            return
        names = ", ".join(self.skipped[:5]) + (f" and {len(self.skipped) - 5} more"
                                                if len(self.skipped) > 5 else "")
        warnings.warn(f"root={str(root)!r}: skipped {len(self.skipped)} files whose extension is "
                      f"not one of {', '.join(self.extensions)} (LoaderConfig.extensions): "
                      f"{names}", RuntimeWarning, stacklevel=4)

    def warn(self, root: Path) -> None:
        notes = [f"not followed: {s}" for s in self.not_followed]
        notes += [f"followed once, leaves the root: {s}" for s in self.followed]
        if not notes:
            return
        more = f"; and {len(notes) - 10} more" if len(notes) > 10 else ""
        warnings.warn(f"root={str(root)!r}: {len(notes)} links inside class folders: "
                      + "; ".join(notes[:10]) + more, RuntimeWarning, stacklevel=4)


def check_extensions(extensions) -> tuple[str, ...]:
    """``extensions`` as a tuple of lower-case ``.ext`` strings, or a ``ValueError`` naming
    the option."""
    if isinstance(extensions, str) or not all(
            isinstance(e, str) and e.startswith(".") and len(e) > 1 for e in extensions or ()):
        raise ValueError(f"extensions={extensions!r} must be a non-empty sequence of '.ext' "
                         f"strings, e.g. {IMAGE_EXTENSIONS}")
    return tuple(e.lower() for e in extensions)


def class_folders(root: str | os.PathLike) -> list[str]:
    """The sorted class folder names of ``root`` (its visible sub-folders)."""
    return sorted(e.name for e in os.scandir(os.fspath(root))
                  if not _ignored(e.name) and e.is_dir(follow_symlinks=True))


def _walk_flat(root: Path, extensions: tuple[str, ...]
               ) -> tuple[tuple[list[str], np.ndarray, list[str]], list[str]]:
    walker = _Walker(root, [], extensions)
    paths = walker.files(str(root))
    if not paths:
        raise DatasetRootError(f"root={str(root)!r} holds no {'/'.join(extensions)} files")
    walker.warn_skipped(root)
    return (paths, np.zeros(len(paths), np.int64), []), sorted(walker.visited)


def list_samples(root: str | os.PathLike, allow_empty: bool = False,
                 extensions: tuple[str, ...] = IMAGE_EXTENSIONS
                 ) -> tuple[list[str], np.ndarray, list[str]]:
    """List an ImageFolder root (see the module note); ``walk_folder`` without its folders."""
    return walk_folder(root, allow_empty, extensions)[0]


def walk_folder(root: str | os.PathLike, allow_empty: bool = False,
                extensions: tuple[str, ...] = IMAGE_EXTENSIONS, flat: bool = False
                ) -> tuple[tuple[list[str], np.ndarray, list[str]], list[str]]:
    """List an ImageFolder root (see the module note), and name every folder entered (the
    listing cache, ``pipelines.sources.cache``, checks their modification times).

    Args:
        root: a directory with one sub-directory per class.
        allow_empty: keep class folders with no image (their index is kept) instead of raising.
        extensions: the file extensions that are images (any case).
        flat: a root with no class folder lists its own image files, label 0, no classes.

    Returns:
        ``((paths, labels, classes), folders)``: the sorted paths, their int64 class indices and
        the sorted class names; the real paths of the folders walked.

    Raises:
        DatasetRootError: the root is missing, not a directory, holds no images, or has a class
            folder with no image (unless ``allow_empty``).
    """
    if root is None or (isinstance(root, str) and not root.strip()):
        raise DatasetRootError(f"root={root!r} must name a dataset folder")
    try:
        root = Path(root)
    except TypeError:
        raise DatasetRootError(f"root={root!r} must be a path") from None
    if not root.exists():
        raise DatasetRootError(f"root={str(root)!r} does not exist")
    if not root.is_dir():
        raise DatasetRootError(f"root={str(root)!r} is not a directory")
    classes = class_folders(root)
    if not classes and flat:
        return _walk_flat(root, check_extensions(extensions))
    if not classes:
        raise DatasetRootError(
            f"root={str(root)!r} has no class sub-folders; expected ImageFolder layout root/<class>/*.jpg"
        )
    extensions = check_extensions(extensions)
    walker = _Walker(root, classes, extensions)
    paths: list[str] = []
    labels: list[int] = []
    empty = []
    for ci, c in enumerate(classes):
        found = walker.files(os.path.join(root, c))
        if not found:
            empty.append(c)
        paths += found
        labels += [ci] * len(found)
    walker.warn(root)
    kinds = "/".join(extensions)
    if not paths:
        extra = (f" ({len(walker.skipped)} files with other extensions were ignored)"
                 if walker.skipped else "")
        raise DatasetRootError(f"root={str(root)!r} holds no {kinds} files{extra}")
    walker.warn_skipped(root)
    if empty and not allow_empty:
        names = ", ".join(repr(c) for c in empty[:5]) + (" ..." if len(empty) > 5 else "")
        raise DatasetRootError(
            f"root={str(root)!r}: {len(empty)} class folder(s) hold no {kinds} file: {names}; "
            "remove them or pass allow_empty_classes=True")
    return (paths, np.asarray(labels, dtype=np.int64), classes), sorted(walker.visited)
