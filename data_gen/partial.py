"""The partial folder where ``data_gen`` makes an output before moving it into place.

NOTE [atomic output]
A run writes into a partial sibling of ``out``, ``<parent>/.<name>.data_gen-partial/``, holding
``marker.json`` (generator tag, kind and recipe), ``journal.jsonl`` (one line per finished file,
appended after the file is closed), ``lock`` (two runs never share it) and ``data/``, the future
``out``. When every file is there it
deletes exactly the files the earlier manifest of ``out`` lists (the manifest last), then renames
``data/`` onto ``out`` (``os.replace``, same filesystem). So:

* An interrupted run leaves ``out`` as it was, or empty. The next run with the same recipe reuses
  the journalled files whose sha256 still matches and makes only the rest; a run with another
  recipe replaces the partial folder (its marker says it is ours). A folder at that name without
  our marker is refused.
* Nothing outside ``out`` is deleted: every manifest path must be relative, without ``..``, and
  resolve inside ``out``, or the run refuses before it writes or deletes anything.
* Files data_gen did not write are never deleted or overwritten, nor is a listed file whose
  bytes no longer match the manifest (it is the user's now), nor anything a linked folder in
  ``out`` leads to. A run refuses, naming the file, or with ``--force`` moves its files in
  beside them and says how many remain (a file at a name it writes is still refused).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager

from .outdir import GENERATOR_TAG, MANIFEST, Existing, Target, inside, read_json, unlink_and_prune

try:
    import fcntl
except ImportError:  # not POSIX: partial folders are not locked
    fcntl = None

MARKER = "marker.json"
JOURNAL = "journal.jsonl"
LOCK = "lock"


@contextmanager
def plain_os_errors(label: str) -> Iterator[None]:
    """Turn an OS error (permission denied, disk full) into one line that names the folder."""
    try:
        yield
    except OSError as e:
        if e.errno is None or not e.strerror:  # our own one-line refusals
            raise
        where = f" ({e.filename})" if e.filename else ""
        raise type(e)(f"{label} cannot be written: {e.strerror}{where}") from None


class Partial:
    """The partial sibling of ``target.path``: ``marker.json``, ``journal.jsonl`` and ``data/``.

    Opening it resumes an interrupted run with the same ``ident`` (``done`` maps each journalled
    path whose file is intact to its record), replaces a partial folder of another ident, and
    refuses a folder at that name without our marker. See NOTE [atomic output].
    """

    def __init__(self, target: Target, ident: dict):
        out = target.path
        self.target = target
        self.root = out.parent / f".{out.name}.data_gen-partial"
        self.data = self.root / "data"
        self.done: dict[str, dict] = {}
        self._ident = json.loads(json.dumps(ident))
        self._lock: int | None = None
        self._journal = None
        try:
            torn = self._open()
            self._journal = open(self.root / JOURNAL, "a")
        except BaseException:
            self.close()
            raise
        if torn:  # a killed run's torn last line: start ours on a fresh line
            self._journal.write("\n")

    def _open(self) -> bool:
        root = self.root
        if os.path.lexists(root):
            is_dir = root.is_dir() and not root.is_symlink()
            marker = read_json(root / MARKER) if is_dir else None
            ours = isinstance(marker, dict) and marker.get("generator") == GENERATOR_TAG
            if not ours and not (is_dir and all(p.name == LOCK for p in root.iterdir())):
                raise FileExistsError(
                    f"{root} is in the way: data_gen makes {self.target.label} there first, and "
                    "that folder was not made by data_gen; move it away")
            self._take_lock()
            if marker == self._ident:
                return self._replay()
            if ours:  # another recipe's partial folder: ours to replace
                self.close()
                shutil.rmtree(root)
        if not root.is_dir():
            root.parent.mkdir(parents=True, exist_ok=True)
            root.mkdir()
            self._take_lock()
        (root / MARKER).write_text(json.dumps(self._ident))
        self.data.mkdir(exist_ok=True)
        return False

    def _take_lock(self) -> None:
        # NOTE: a POSIX record lock (lockf), not flock: fork()ed pool workers do not inherit it,
        # so a killed run's orphaned workers do not hold the next run off.
        if fcntl is None or self._lock is not None:
            return
        fd = os.open(self.root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EACCES, errno.EAGAIN):
                raise FileExistsError(f"another data_gen run is writing {self.target.label} "
                                      f"(it holds {self.root}); wait for it to finish") from None
            return  # a filesystem without locks: go on unlocked
        self._lock = fd

    def _replay(self) -> bool:
        """Fill ``done`` from the journal; returns whether its last line is torn."""
        try:
            text = (self.root / JOURNAL).read_text(errors="replace")
        except FileNotFoundError:
            text = ""
        data = self.data.resolve()
        for line in text.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:  # the torn last line of a killed run: that file is made again
                continue
            rel = inside(data, rec.get("path")) if isinstance(rec, dict) else None
            if rel and (data / rel).is_file():
                if _sha256((data / rel).read_bytes()) == rec.get("sha256"):
                    self.done[rel] = rec
        self.data.mkdir(exist_ok=True)
        return bool(text) and not text.endswith("\n")

    def record(self, rec: dict) -> None:
        """Journal a finished file (call after it is written and closed)."""
        self._journal.write(json.dumps(rec) + "\n")
        self._journal.flush()

    def write(self, rel: str, data: bytes) -> dict:
        """Write one more file into ``data/`` (not journalled: it is rewritten on a resume)."""
        p = self.data / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        return {"path": rel, "bytes": len(data), "sha256": _sha256(data)}

    def commit(self, manifest: dict, existing: Existing) -> None:
        """Put ``data/`` (every file of ``manifest``) in place of the earlier output of ``out``.

        Args:
            manifest: written as ``out/manifest.json``; its ``files`` are all in ``data/``.
            existing: what ``out`` holds now (``survey``).
        """
        out, label = self.target.path, self.target.label
        new = [f["path"] for f in manifest["files"]]
        clash = sorted((set(new) | {MANIFEST}) & set(existing.foreign))
        if clash:
            raise FileExistsError(f"{label}: {clash[0]!r} was not written by data_gen and would be "
                                  "overwritten; move it away")
        through = [rel for rel in new if inside(out, rel) is None]  # a folder linked elsewhere
        if through:
            raise FileExistsError(f"{label}: {through[0]!r} would be written through a link "
                                  "data_gen did not make, outside the folder; move the link away")
        (self.data / MANIFEST).write_text(json.dumps(manifest, indent=1))
        for rel in existing.ours:  # the manifest last, so an interruption here can be resumed
            if rel != MANIFEST:
                unlink_and_prune(out, rel)
        if existing.foreign or (out.is_dir() and any(p.name != MANIFEST for p in out.iterdir())):
            # merge (files or folders we did not make stay): the new manifest first, so every
            # file moved in is listed at once
            os.replace(self.data / MANIFEST, out / MANIFEST)
            for rel in new:
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                os.replace(self.data / rel, out / rel)
        else:  # out is empty but for the old manifest: one atomic rename
            (out / MANIFEST).unlink(missing_ok=True)
            os.replace(self.data, out)
        self.close()
        shutil.rmtree(self.root)

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
