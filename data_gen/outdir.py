"""An output folder: what an earlier ``data_gen`` run wrote there, and what a run may replace.

``survey`` only reads. The writing side is ``partial.py`` (NOTE [atomic output]).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
from dataclasses import dataclass
from enum import Enum
from pathlib import Path, PurePosixPath

MANIFEST = "manifest.json"
GENERATOR_TAG = "gpu-feed data_gen v1"


class Kind(str, Enum):
    """What a data_gen folder holds (the manifest's ``"kind"``; manifests without one: DATASET)."""

    DATASET = "dataset"
    BAD_INPUTS = "bad-inputs"


_NOUN = {"dataset": "dataset", "bad-inputs": "bad-inputs corpus"}


class Replace(Enum):
    """What a run may replace in ``out``; each level allows what the one before it does.

    SAME_KIND: an earlier data_gen output of the same kind (``--out D`` over a dataset made by
        data_gen: replaced; over a bad-inputs corpus or a folder of your photos: refused).
    ANY_KIND: also a data_gen output of the other kind (a cache folder the program owns).
    FORCE: also write beside files data_gen did not write; they stay, with a warning (``--force``).
    """

    SAME_KIND = 1
    ANY_KIND = 2
    FORCE = 3


@dataclass(frozen=True)
class Target:
    """An output folder, and how refusals name it.

    Args:
        path: the folder, resolved.
        label: how messages name it, e.g. ``--out 'data'``.
        replace: what the run may replace there.
        remedy: what a refusal tells the user to do.
    """

    path: Path
    label: str
    replace: Replace = Replace.SAME_KIND
    remedy: str = "choose another directory or pass --force"

    @classmethod
    def cli(cls, option: str, out: str | os.PathLike, force: bool) -> Target:
        """The target of a command-line option such as ``--out``."""
        return cls(Path(out).resolve(), f"{option} {str(out)!r}",
                   Replace.FORCE if force else Replace.SAME_KIND)


def read_manifest(out: str | os.PathLike) -> dict | None:
    """The manifest of a ``data_gen`` directory, or ``None`` when there is none."""
    m = read_json(Path(out) / MANIFEST)
    return m if isinstance(m, dict) and m.get("generator") == GENERATOR_TAG else None


def manifest_paths(root: Path, manifest: dict, label: str) -> list[str]:
    """The manifest's file paths, each checked to stay inside ``root`` (resolved).

    Raises:
        ValueError: naming the first path that is absolute, has ``..`` or resolves outside.
    """
    files = manifest.get("files")
    if not isinstance(files, list):
        raise ValueError(f"{label}: its {MANIFEST} has no list of files; "
                         "remove it by hand if the folder is yours")
    paths = []
    for rec in files:
        p = rec.get("path") if isinstance(rec, dict) else rec
        rel = inside(root, p)
        if rel is None:
            raise ValueError(f"{label}: its {MANIFEST} lists {p!r}, which is not a path inside "
                             "the folder; refusing to delete or write anything")
        paths.append(rel)
    return paths


def inside(root: Path, p) -> str | None:
    """``p`` as a clean relative POSIX path, when it names something strictly inside ``root``."""
    if not isinstance(p, str) or not p:
        return None
    pp = PurePosixPath(p)
    if pp.is_absolute() or ".." in pp.parts:
        return None
    try:
        full = (root / pp).resolve()
    except (OSError, ValueError, RuntimeError):  # a NUL byte, a symlink loop
        return None
    return pp.as_posix() if full != root and full.is_relative_to(root) else None


def files_under(root: Path) -> set[str]:
    """Relative POSIX paths of everything under ``root`` that is not a directory (no symlinks
    followed; a symlink to a directory counts as a file)."""
    def fail(e: OSError) -> None:
        raise e

    found = set()
    for dirpath, dirnames, filenames in os.walk(root, onerror=fail):
        rel = Path(dirpath).relative_to(root)
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        found.update((rel / n).as_posix() for n in filenames + links)
    return found


@dataclass(frozen=True)
class Existing:
    """What ``out`` holds now."""

    ours: tuple[str, ...]     # files an earlier data_gen run wrote there, as it wrote them
    foreign: tuple[str, ...]  # files it did not write, or that changed since (``altered``)


def survey(target: Target, kind: Kind) -> Existing:
    """What ``target.path`` holds. Reads only; raises when the run may not write there.

    Raises:
        FileExistsError: ``out`` is a file, holds files data_gen did not write or a listed file
            whose bytes changed since (unless FORCE: then they stay, as ``foreign``), or holds a
            data_gen output of another kind (SAME_KIND).
        PermissionError: ``out`` cannot be written.
        ValueError: its manifest lists a path outside it.
    """
    out, label, remedy = target.path, target.label, target.remedy
    if not out.is_dir():
        if os.path.lexists(out):
            raise FileExistsError(f"{label} exists and is not a directory")
        return Existing((), ())
    if not os.access(out, os.W_OK | os.X_OK):  # fail now, not after generating
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(out))
    on_disk = files_under(out)
    if not on_disk:
        return Existing((), ())
    old = read_manifest(out)
    if old is None:
        if target.replace is not Replace.FORCE:
            raise FileExistsError(f"{label} is not empty and was not made by data_gen; {remedy}")
        return Existing((), tuple(sorted(on_disk)))
    paths = manifest_paths(out, old, label)
    old_kind = old.get("kind", Kind.DATASET.value)
    if old_kind != kind.value and target.replace is Replace.SAME_KIND:
        raise FileExistsError(f"{label} holds a data_gen {_NOUN.get(old_kind, old_kind)}, "
                              f"not a {_NOUN[kind.value]}; {remedy}")
    changed = sorted(p for p, rec in zip(paths, old["files"]) if p in on_disk
                     and altered(out / p, rec))
    if changed and target.replace is not Replace.FORCE:
        raise FileExistsError(f"{label}: {changed[0]!r} no longer holds the bytes data_gen wrote "
                              f"(its {MANIFEST} says otherwise), so it is yours now; {remedy}")
    listed = (set(paths) - set(changed)) | {MANIFEST}
    foreign = sorted(on_disk - listed)
    if foreign and target.replace is not Replace.FORCE:
        raise FileExistsError(f"{label} holds {len(foreign)} files that data_gen did not write "
                              f"(e.g. {foreign[0]!r}); {remedy}")
    return Existing(tuple(sorted(listed & on_disk)), tuple(foreign))


def altered(path: Path, rec) -> bool:
    """Whether the listed file ``path`` is no longer what data_gen wrote there (NOTE [atomic
    output]): a link, or bytes other than its manifest record's (size, then sha256; a record
    without them, as older manifests have: not checked)."""
    if path.is_symlink() or not path.is_file():
        return True
    if not isinstance(rec, dict):
        return False
    size, sha = rec.get("bytes"), rec.get("sha256")
    if size is not None and path.stat().st_size != size:
        return True
    if sha is None:
        return False
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest() != sha


def unlink_and_prune(out: Path, rel: str) -> None:
    """Delete ``out/rel`` (a file), then its parent folders that are left empty."""
    p = out / rel
    if p.is_symlink() or p.is_file():
        p.unlink()
    d = p.parent
    while d != out:
        try:
            d.rmdir()
        except OSError:  # not empty (or already gone)
            break
        d = d.parent


def read_json(p: Path):
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None
