"""``Driver``: one backend under one policy over a root, until every file has its verdict.

Under ``skip`` one epoch names every file decoded or bad; under ``error`` a fresh loader resumes
after each ``BadFileError``; an epoch that crashes or hangs is pinned to a file by bisection and
the search goes on without it (NOTE [fuzz invariants] in ``tools.fuzz``). Each epoch runs in a
forked process group (``epoch.fork_epoch``).
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from .epoch import BATCH_SIZE, fork_epoch

# Files that may be in flight past the last yielded batch when a loader dies: DataLoader keeps
# num_workers * prefetch = 4 batches ahead, DALI prefetch + 1; two batches of slack.
WINDOW = 6 * BATCH_SIZE


class Driver:
    """Runs one backend under one policy (``run_skip`` or ``run_error``) over the files of a root.

    Every loader epoch runs in a forked process of its own group, so a segfault, a hang or a
    leaked worker is seen and pinned to a file (NOTE [fuzz invariants]).

    Args:
        backend: ``"pageable"``, ``"pinned"`` or ``"dali"``.
        root: the ImageFolder root; files are numbered in ``list_samples`` order.
        tmp: a folder for the roots of hard links that later epochs read.
        epoch_timeout: seconds (plus 0.5 s per file) before an epoch counts as a hang.
        max_crashes: crashing files pinned down before the search stops.

    After a run: ``decoded`` (indices), ``bad`` (index -> reason), ``crash`` (index -> error),
    ``failures`` (``{"error", "file"}``), ``epochs``, and ``complete`` (every file covered).
    """

    def __init__(self, backend: str, root: str, tmp: Path, epoch_timeout: float,
                 max_crashes: int):
        from pipelines.sources.folder import list_samples

        self.backend, self.root, self.tmp = backend, root, tmp
        self.paths = list_samples(root)[0]
        self.epoch_timeout, self.max_crashes = epoch_timeout, max_crashes
        self.decoded: list[int] = []
        self.bad: dict[int, str] = {}
        self.crash: dict[int, str] = {}
        self.failures: list[dict] = []
        self.epochs = 0
        self.policy = ""
        self.complete = False  # the search covered every file

    def rel(self, k: int) -> str:
        return os.path.relpath(self.paths[k], self.root)

    def fail(self, text: str, k: int | None = None) -> None:
        self.failures.append({"error": text,
                              "file": None if k is None else self.rel(k)})

    # -- one epoch ----------------------------------------------------------------------------
    def epoch(self, keep: list[int], policy: str) -> dict:
        """One epoch over ``paths[keep]`` (a root of hard links unless ``keep`` is all)."""
        from pipelines.sources.folder import list_samples

        self.epochs += 1
        print(f"[fuzz] {self.backend}/{self.policy} epoch {self.epochs} ({policy}): {len(keep)} "
              f"files from {self.rel(keep[0])}", file=sys.stderr, flush=True)
        sub = None
        if keep == list(range(len(self.paths))):
            root, listing = self.root, self.paths
        else:
            sub = self.tmp / f"e{self.epochs:06d}"
            (sub / "all").mkdir(parents=True)
            for k in keep:
                try:
                    os.link(self.paths[k], sub / "all" / f"{k:06d}.jpg")
                except OSError:
                    shutil.copyfile(self.paths[k], sub / "all" / f"{k:06d}.jpg")
            root, listing = str(sub), list_samples(sub)[0]
        try:
            res = fork_epoch(self.backend, root, policy, self.epoch_timeout + 0.5 * len(keep))
        finally:
            if sub is not None:
                shutil.rmtree(sub, ignore_errors=True)
        res["listing"] = listing
        if res.get("leaks"):
            self.fail(f"alive after close(): {', '.join(res['leaks'])} (epoch over "
                      f"{len(keep)} files from {self.rel(keep[0])})")
        return res

    # -- crashes ------------------------------------------------------------------------------
    def _crashes(self, keep: list[int]) -> bool:
        return bool(keep) and self.epoch(keep, "skip")["error"] is not None

    def isolate(self, cands: list[int]) -> int | None:
        """The file of ``cands`` that alone makes a ``skip`` epoch fail, by bisection: first in
        the window that can have been in flight, then in all of ``cands``."""
        for s in (cands[:WINDOW], cands) if len(cands) > WINDOW else (cands,):
            if not self._crashes(s):
                continue
            while len(s) > 1:
                h = len(s) // 2
                s = s[:h] if self._crashes(s[:h]) else s[h:]
            if self._crashes(s):
                return s[0]
        return None

    def _on_crash(self, err: dict, cands: list[int]) -> int | None:
        """Pin a crash to a file (recorded), or record why not and return ``None``."""
        text = err["text"] + (f"\n{err['traceback']}" if err.get("traceback") else "")
        if len(self.crash) >= self.max_crashes:
            self.fail(f"{text} (not isolated: {self.max_crashes} crashes already, "
                      "search stopped)")
            return None
        c = self.isolate(cands)
        if c is None:
            self.fail(f"{text} (not pinned to one file among {len(cands)} from "
                      f"{self.rel(cands[0]) if cands else '-'}; search stopped)")
            return None
        self.crash[c] = err["text"]
        self.fail(text, c)
        return c

    # -- the two policies ---------------------------------------------------------------------
    def run_skip(self) -> None:
        """One epoch; every file yielded or named bad, exactly once (crashing files set aside)."""
        self.policy = "skip"
        everything = list(range(len(self.paths)))
        cur = everything
        while True:
            r = self.epoch(cur, "skip")
            err = r["error"]
            if err is None:
                break
            start = min(len(cur), r["batches"] * BATCH_SIZE)
            named = [k for j, k in enumerate(cur) if err.get("path") == r["listing"][j]]
            if named:  # BadFileError under skip: a failure, pinned to the file it names
                self.fail(err["text"], named[0])
                self.crash[named[0]] = err["text"]
                c = named[0]
            else:
                c = self._on_crash(err, cur[start:])
                if c is None:
                    return
            cur = [k for k in cur[start:] if k != c]
            if not cur:
                break
        keep = [k for k in everything if k not in self.crash]
        if not keep:  # every file crashed: nothing left to check
            self.complete = True
            return
        if cur != keep:  # a crash happened: one clean epoch over every other file
            r = self.epoch(keep, "skip")
            if r["error"] is not None:
                self.fail(f"{r['error']['text']} (the epoch without the crashing files)")
                return
        self._check_skip(r, keep)
        self.complete = True

    def _check_skip(self, r: dict, keep: list[int]) -> None:
        if r.get("indices") is None:
            self.fail("loader.last_indices is None after an epoch with debug_indices=True")
            return
        yielded = {keep[i] for i in r["indices"]}
        where = {p: keep[j] for j, p in enumerate(r["listing"])}
        named: dict[int, str] = {}
        for p, reason in r["bad"]:
            k = where.get(p)
            if k is None:
                self.fail(f"stats['bad'] names {p!r}, not a file of the root ({reason})")
            elif k in named:
                self.fail(f"stats['bad'] names {self.rel(k)!r} twice", k)
            else:
                named[k] = reason
        for k in sorted(yielded & set(named)):
            self.fail(f"{self.rel(k)} both yielded and named bad ({named[k]})", k)
        for k in sorted(set(keep) - yielded - set(named)):
            self.fail(f"{self.rel(k)} neither yielded nor named bad", k)
        self.decoded = sorted(yielded - set(named))
        self.bad = named

    def run_error(self) -> None:
        """Find every bad file: after each ``BadFileError`` a fresh loader reads the files from
        the failing batch on, without the named one (NOTE [fuzz invariants])."""
        self.policy = "error"
        cur = list(range(len(self.paths)))
        while cur:
            r = self.epoch(cur, "error")
            n, err = r["yielded"], r["error"]
            if err is None:
                if r.get("indices") != list(range(len(cur))):
                    self.fail(f"an epoch with no bad file over {len(cur)} files from "
                              f"{self.rel(cur[0])} yielded indices {str(r.get('indices'))[:80]}"
                              " (expected 0..n-1: nothing is replaced under error)")
                self.decoded += cur
                break
            if err["kind"] == "bad file":
                j = next((j for j, p in enumerate(r["listing"]) if p == err["path"]), None)
                if j is None or err["path"] not in err["text"]:
                    self.fail(f"BadFileError does not name a file of the root: "
                              f"path={err['path']!r}: {err['text']}")
                    return
                if j < n:
                    self.fail(f"{self.rel(cur[j])} was yielded, then named bad: {err['text']}",
                              cur[j])
                    return
                if j // BATCH_SIZE != n // BATCH_SIZE:  # its batch is not the next one
                    self.fail(f"BadFileError raised early: {self.rel(cur[j])} is in batch "
                              f"{j // BATCH_SIZE} but only {n // BATCH_SIZE} batches were "
                              f"yielded: {err['text']}", cur[j])
                self.bad[cur[j]] = err["reason"]
                self.decoded += cur[:n]
                cur = cur[n:j] + cur[j + 1:]
            else:
                c = self._on_crash(err, cur[n:])
                if c is None:
                    return
                self.decoded += cur[:n]
                cur = [k for k in cur[n:] if k != c]
        self.complete = True
