"""``python -m compare.fuzz``: mutate valid JPEG/PNG files and check that every loader copes.

Example:
    python -m compare.fuzz --cases 300 --seed 0 --out runs/fuzz

NOTE [fuzz invariants]
Each backend runs under each ``BadFilePolicy`` in a child process of its own session
(``python -m compare.fuzz --worker SPEC``, killed as a whole after ``--timeout``), with
``shuffle=False``, ``batch_size=8``, CPU decoding, two workers (threads for DALI) and
``debug_indices=True``. The child runs every loader epoch in a forked process of its own group,
so a segfault or a hang ends that epoch only, and what it leaves behind is seen:

* ``skip``: one epoch. Every file is either yielded (``loader.last_indices``) or named once in
  ``loader.stats["bad"]``, never both, never neither.
* ``error``: every ``BadFileError`` names a file of the root (its ``path`` and its message). The
  search goes on until each bad file is found: the batches yielded before the error are decoded,
  the named file is bad, and a fresh loader reads the rest (a root of hard links to the files
  from the failing batch on, in the same order). The named file lies in the batch after the
  yielded ones (not yielded, not raised early), the named set equals the ``skip`` set, and no
  sample is replaced under ``error`` (``last_indices`` of a clean run is ``0..n-1``).
* Under neither policy may an epoch crash, hang, raise anything else, or leave a child process
  or a ``dali-read`` thread alive after ``close()`` (nor a process in its group after it exits).

A crash or hang is pinned to a file by bisection (``skip`` epochs over halves of the files that
can have been in flight), recorded as that file's ``crash`` verdict with the exception, and the
search goes on without it, up to ``--max-crashes`` files. Any breach is an invariant failure
(exit code 1), reported with the file's case and mutation: the reproducer. Backends that
disagree on a file (one decodes it, another calls it bad) are not failures: they are measured
(the agreement rate) and listed in ``fuzz.json``, grouped by which backends differ and why.
"""
from __future__ import annotations

import argparse
import faulthandler
import gc
import io
import json
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zlib
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

BATCH_SIZE = 8
POLICIES = ("skip", "error")
CLASSES = 4
GOOD_FILES = 8
_PNG_SIG = b"\x89PNG\r\n\x1a\n"
_JPEG_NAMES = {0xC0: "SOF0", 0xC1: "SOF1", 0xC2: "SOF2", 0xC4: "DHT", 0xDA: "SOS", 0xDB: "DQT",
               0xDD: "DRI", 0xFE: "COM", **{0xE0 + k: f"APP{k}" for k in range(16)}}
_SOFS = (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF)


# -- mutations -------------------------------------------------------------------------------------
def _jpeg_segments(data: bytes) -> List[Tuple[int, int, int]]:
    """``(offset, marker, length with the marker)`` of each segment of a valid JPEG up to and
    including the SOS header. A walker of its own: the fuzzer does not share the validator's."""
    out, i = [], 2
    while i + 4 <= len(data) and data[i] == 0xFF:
        m = data[i + 1]
        if m == 0xFF:
            i += 1
            continue
        (n,) = struct.unpack(">H", data[i + 2:i + 4])
        out.append((i, m, 2 + n))
        if m == 0xDA:
            break
        i += 2 + n
    return out


def _png_chunks(data: bytes) -> List[Tuple[int, bytes, int]]:
    """``(offset, type, length with header and CRC)`` of each chunk of a valid PNG."""
    out, i = [], 8
    while i + 8 <= len(data):
        (n,) = struct.unpack(">I", data[i:i + 4])
        typ = data[i + 4:i + 8]
        out.append((i, typ, 12 + n))
        i += 12 + n
        if typ == b"IEND":
            break
    return out


def _is_png(data: bytes) -> bool:
    return data.startswith(_PNG_SIG)


def _header_end(data: bytes) -> int:
    """Where the headers end: the end of the JPEG's SOS header, the start of the first IDAT data."""
    if _is_png(data):
        return next((o + 8 for o, t, _ in _png_chunks(data) if t == b"IDAT"), len(data))
    segs = _jpeg_segments(data)
    return segs[-1][0] + segs[-1][2] if segs else len(data)


def _flip(data: bytes, rng, lo: int, hi: int) -> Tuple[bytes, List[int]]:
    b = bytearray(data)
    k = int(rng.integers(1, 9))
    bits = rng.choice((hi - lo) * 8, size=min(k, (hi - lo) * 8), replace=False)
    offs = sorted({lo + int(x) // 8 for x in bits})
    for x in bits:
        b[lo + int(x) // 8] ^= 1 << (int(x) % 8)
    return bytes(b), offs


def _offs(prefix: str, offs: List[int]) -> str:
    return f"{prefix}@{offs[0]}" if len(offs) == 1 else \
        f"{prefix} x{len(offs)}@{','.join(map(str, offs))}"


def _m_bitflip(data: bytes, rng) -> Tuple[bytes, str]:
    out, offs = _flip(data, rng, 0, len(data))
    return out, _offs("bitflip", offs)


def _segment_name(data: bytes, off: int) -> str:
    if _is_png(data):
        if off < 8:
            return "signature"
        return next((t.decode("latin-1") for o, t, n in _png_chunks(data) if o <= off < o + n), "?")
    if off < 2:
        return "SOI"
    return next((_JPEG_NAMES.get(m, f"FF{m:02X}") for o, m, n in _jpeg_segments(data)
                 if o <= off < o + n), "?")


def _m_header_bitflip(data: bytes, rng) -> Tuple[bytes, str]:
    out, offs = _flip(data, rng, 0, _header_end(data))
    names = ",".join(dict.fromkeys(_segment_name(data, o) for o in offs))
    return out, _offs("header bitflip", offs) + f" ({names})"


def _m_truncate(data: bytes, rng) -> Tuple[bytes, str]:
    cut = int(rng.integers(1, len(data)))
    return data[:cut], f"truncate@{cut / len(data):.2f} ({cut} of {len(data)} bytes)"


def _m_insert(data: bytes, rng) -> Tuple[bytes, str]:
    n = int(rng.choice([1, 2, 4, int(rng.integers(1, 65))]))
    pos = int(rng.integers(0, len(data) + 1))
    fill = str(rng.choice(["random", "FF", "00"]))
    new = (rng.integers(0, 256, n, dtype=np.uint8).tobytes() if fill == "random"
           else bytes.fromhex(fill) * n)
    return data[:pos] + new + data[pos:], f"insert {n} bytes@{pos} ({fill})"


def _m_delete(data: bytes, rng) -> Tuple[bytes, str]:
    n = int(rng.choice([1, 2, 4, int(rng.integers(1, 65))]))
    n = min(n, len(data) - 1)
    pos = int(rng.integers(0, len(data) - n + 1))
    return data[:pos] + data[pos + n:], f"delete {n} bytes@{pos}"


def _m_duplicate(data: bytes, rng) -> Tuple[bytes, str]:
    if _is_png(data):
        o, t, n = _png_chunks(data)[int(rng.integers(0, len(_png_chunks(data))))]
        return data[:o + n] + data[o:o + n] + data[o + n:], f"duplicate chunk {t.decode('latin-1')}"
    segs = _jpeg_segments(data)
    o, m, n = segs[int(rng.integers(0, len(segs)))]
    return data[:o + n] + data[o:o + n] + data[o + n:], f"duplicate marker FF{m:02X}@{o}"


def _new_dim(rng, old: int, big: Sequence[int]) -> int:
    choices = [v for v in dict.fromkeys([0, 1, old // 2, old - 1, old + 1, old * 2, *big])
               if v != old and v >= 0]
    return int(rng.choice(choices))


def _m_dimension(data: bytes, rng) -> Tuple[bytes, str]:
    axis = str(rng.choice(["width", "height"]))
    b = bytearray(data)
    if _is_png(data):  # IHDR: width at 16, height at 20, CRC at 29
        at = 16 if axis == "width" else 20
        (old,) = struct.unpack(">I", data[at:at + 4])
        new = _new_dim(rng, old, [9000, 65535, 100_000, 2**31 - 1])
        b[at:at + 4] = struct.pack(">I", new)
        fix = bool(rng.random() < 0.75)
        if fix:
            b[29:33] = struct.pack(">I", zlib.crc32(bytes(b[12:29])))
        return bytes(b), f"PNG {axis} {new} (IHDR{'' if fix else ', stale CRC'})"
    o, m, _ = next(s for s in _jpeg_segments(data) if s[1] in _SOFS)
    at = o + (7 if axis == "width" else 5)
    (old,) = struct.unpack(">H", data[at:at + 2])
    new = _new_dim(rng, old, [9000, 65535])
    b[at:at + 2] = struct.pack(">H", new)
    return bytes(b), f"{axis} {new} ({_JPEG_NAMES.get(m, 'SOF')})"


def _m_trailing(data: bytes, rng) -> Tuple[bytes, str]:
    what = str(rng.choice(["random", "zeros", "FF", "copy"]))
    if what == "copy":
        return data + data, f"trailing copy of the image ({len(data)} bytes)"
    n = int(rng.choice([1, 17, 1024, 4096, 65536]))
    tail = (rng.integers(0, 256, n, dtype=np.uint8).tobytes() if what == "random"
            else (b"\0" if what == "zeros" else b"\xff") * n)
    size = f"{n // 1024} KiB" if n >= 1024 else f"{n} bytes"
    return data + tail, f"trailing {size} {what}"


# kind -> (mutator, weight)
MUTATIONS: Dict[str, Tuple[Callable, float]] = {
    "bitflip": (_m_bitflip, 0.2),
    "header bitflip": (_m_header_bitflip, 0.2),
    "truncate": (_m_truncate, 0.12),
    "insert": (_m_insert, 0.1),
    "delete": (_m_delete, 0.1),
    "duplicate": (_m_duplicate, 0.1),
    "dimension": (_m_dimension, 0.1),
    "trailing": (_m_trailing, 0.08),
}


def mutate_kind(data: bytes, rng: np.random.Generator, kind: Optional[str] = None
                ) -> Tuple[bytes, str, str]:
    """:func:`mutate`, also returning the mutation kind (a key of ``MUTATIONS``).

    Args:
        data: a valid JPEG or PNG.
        rng: the generator every choice is drawn from.
        kind: force one kind (default: drawn with the ``MUTATIONS`` weights).
    """
    if not (data.startswith(b"\xff\xd8") or _is_png(data)) or len(data) < 64:
        raise ValueError(f"data ({len(data)} bytes, starts with {data[:8]!r}) must be a valid "
                         "JPEG or PNG")
    kinds = list(MUTATIONS)
    if kind is None:
        w = np.array([MUTATIONS[k][1] for k in kinds])
        kind = kinds[int(rng.choice(len(kinds), p=w / w.sum()))]
    elif kind not in MUTATIONS:
        raise ValueError(f"kind={kind!r} is unknown; choose one of {kinds}")
    out, desc = MUTATIONS[kind][0](data, rng)
    return out, desc, kind


def mutate(data: bytes, rng: np.random.Generator) -> Tuple[bytes, str]:
    """Apply one mutation to a valid JPEG or PNG.

    Kinds (``MUTATIONS``): 1-8 bit flips anywhere or only in the headers before the scan,
    truncation, byte insertion and deletion, marker-segment (PNG: chunk) duplication, header
    dimension edits (JPEG SOF, PNG IHDR with a fixed or stale CRC) and trailing data.

    Example:
        >>> mutate(jpeg_bytes, np.random.default_rng(3))[1]   # doctest: +SKIP
        'height 9000 (SOF0)'

    Returns:
        ``(new bytes, short description)``, e.g. ``"bitflip@1234"``, ``"truncate@0.63 (...)"``,
        ``"insert 5 bytes@300 (random)"``, ``"duplicate marker FFC4@178"``.
    """
    out, desc, _ = mutate_kind(data, rng)
    return out, desc


# -- corpus ----------------------------------------------------------------------------------------
_MARK = ".fuzz-corpus"


def _seed_files(tmp: Path, seed: int, n_jpeg: int = 24, n_png: int = 12
                ) -> List[Tuple[str, str, bytes]]:
    """``(name, kind, bytes)`` of the seeds: data_gen JPEGs and PIL PNG re-encodings of some."""
    from PIL import Image

    from data_gen.generate import GenConfig, generate

    generate(GenConfig(out=str(tmp / "gen"), num_images=n_jpeg, classes=2, seed=seed,
                       width_range=(48, 128), workers=1), progress=False)
    jpegs = sorted((tmp / "gen").glob("*/*.jpg"))
    if len(jpegs) != n_jpeg:
        raise RuntimeError(f"data_gen wrote {len(jpegs)} JPEGs into {tmp / 'gen'}, "
                           f"expected {n_jpeg}")
    seeds = [(p.stem, "jpeg", p.read_bytes()) for p in jpegs]
    for k, p in enumerate(jpegs[:n_png]):
        buf = io.BytesIO()
        with Image.open(p) as im:
            im.convert(("RGB", "L", "RGBA")[k % 3]).save(buf, "PNG")
        seeds.append((f"{p.stem}_{('rgb', 'gray', 'rgba')[k % 3]}", "png", buf.getvalue()))
    return seeds


def make_corpus(out_dir: str | os.PathLike, cases: int, seed: int) -> List[Dict]:
    """Write ``cases`` mutated files and a few untouched ones in ImageFolder layout.

    Seeds are small data_gen JPEGs (``width_range=(48, 128)``) and PNG re-encodings of some of
    them (RGB, gray, RGBA), every file named ``.jpg``. Case ``i`` draws its seed file and its
    mutation from ``numpy.random.default_rng((seed, i))``, so the corpus is byte-identical for
    a given ``seed`` and case ``i`` does not depend on ``cases``.

    Args:
        out_dir: the dataset root to write (``class_K/case_NNNNN.jpg``, ``class_K/good_NN.jpg``);
            it must be missing, empty or an earlier corpus (which is replaced).
        cases: mutated files.
        seed: the seed.

    Returns:
        One record per file, sorted by file: ``{"file", "case", "seed_kind", "seed_file",
        "kind", "mutation"}`` (``case`` is ``None`` and ``kind`` ``"none"`` for good files).
    """
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        if not (out / _MARK).exists():
            raise ValueError(f"out_dir={str(out)!r} holds files that are not a fuzz corpus; "
                             "use an empty or new folder")
        shutil.rmtree(out)
    for c in range(CLASSES):
        (out / f"class_{c}").mkdir(parents=True, exist_ok=True)
    (out / _MARK).write_text(json.dumps({"cases": cases, "seed": seed}))
    with tempfile.TemporaryDirectory(prefix="fuzz-seeds-") as tmp:
        seeds = _seed_files(Path(tmp), seed)
    records = []
    for j in range(GOOD_FILES):
        name, kind, data = seeds[(j * 5) % len(seeds)]
        rel = f"class_{j % CLASSES}/good_{j:02d}.jpg"
        (out / rel).write_bytes(data)
        records.append({"file": rel, "case": None, "seed_kind": kind, "seed_file": name,
                        "kind": "none", "mutation": "none (good file)"})
    for i in range(cases):
        new, rec = _case(seeds, seed, i)
        (out / rec["file"]).write_bytes(new)
        records.append(rec)
    return sorted(records, key=lambda r: r["file"])


def _case(seeds: List[Tuple[str, str, bytes]], seed: int, i: int) -> Tuple[bytes, Dict]:
    rng = np.random.default_rng((seed, i))
    name, kind, data = seeds[int(rng.integers(0, len(seeds)))]
    new, desc, mkind = mutate_kind(data, rng)
    return new, {"file": f"class_{i % CLASSES}/case_{i:05d}.jpg", "case": i, "seed_kind": kind,
                 "seed_file": name, "kind": mkind, "mutation": desc}


def case_bytes(seed: int, case: int) -> Tuple[bytes, Dict]:
    """The bytes and record of one case of ``make_corpus(..., seed)``: a reproducer.

    Example:
        >>> data, rec = case_bytes(0, 20)           # doctest: +SKIP
        >>> open("/tmp/case.jpg", "wb").write(data)  # doctest: +SKIP
    """
    with tempfile.TemporaryDirectory(prefix="fuzz-seeds-") as tmp:
        return _case(_seed_files(Path(tmp), seed), seed, case)


# -- one backend, one policy (in a child process) -----------------------------------------------
# Files that may be in flight past the last yielded batch when a loader dies: DataLoader keeps
# num_workers * prefetch = 4 batches ahead, DALI prefetch + 1; two batches of slack.
WINDOW = 6 * BATCH_SIZE


def _config(root, policy: str):
    from pipelines import AugmentSpec, LoaderConfig

    return LoaderConfig(root=root, batch_size=BATCH_SIZE, device="cpu", shuffle=False,
                        num_workers=2, augment=AugmentSpec(mode="eval", size=32, resize_size=32),
                        debug_indices=True, on_bad_file=policy)


def _exc(e: BaseException) -> str:
    """``Type: message`` of ``e``, and of its cause (DataLoader names a worker's signal there)."""
    text = " ".join("".join(traceback.format_exception_only(type(e), e)).split())
    cause = e.__cause__ or e.__context__
    if cause is not None and str(cause) != str(e):
        text += f" (from {type(cause).__name__}: {' '.join(str(cause).split())})"
    return text


def _leaks() -> List[str]:
    """Child processes and ``dali-read`` threads still alive (waits up to 5 s for them to go)."""
    try:
        import psutil

        def procs():
            return [f"pid {p.pid} ({' '.join(p.cmdline()[:3])})"
                    for p in psutil.Process().children(recursive=True)
                    if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    except ImportError:  # pragma: no cover - psutil is a dev dependency
        import multiprocessing as mp

        def procs():
            return [f"pid {p.pid}" for p in mp.active_children()]
    end = time.monotonic() + 5.0
    while True:
        left = procs() + [f"thread {t.name}" for t in threading.enumerate()
                          if t.name.startswith("dali-read") and t.is_alive()]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.05)


def _group(pgid: int) -> List[str]:
    """Live processes of process group ``pgid``."""
    try:
        os.killpg(pgid, 0)  # the common case, cheaply: the group is empty
    except ProcessLookupError:
        return []
    except OSError:
        pass
    try:
        import psutil
    except ImportError:  # pragma: no cover
        return [f"process group {pgid}"]
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(f"pid {p.pid} ({' '.join((p.info['cmdline'] or [])[:3])})")
        except (OSError, psutil.Error):
            pass
    return out


def _epoch_body(backend: str, root: str, policy: str, wfd: int) -> None:
    """In the forked process: one epoch, progress and the result as JSON lines on ``wfd``."""
    import warnings

    from pipelines import BadFileError, create_loader

    pipe = os.fdopen(wfd, "w")

    def send(obj):
        pipe.write(json.dumps(obj) + "\n")
        pipe.flush()

    out: Dict = {"yielded": 0, "batches": 0, "error": None}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with create_loader(backend, _config(root, policy)) as ld:
                for _, y in ld:
                    out["yielded"] += len(y)
                    out["batches"] += 1
                    send({"yielded": out["yielded"], "batches": out["batches"]})
                idx = ld.last_indices
                out["indices"] = None if idx is None else [int(i) for i in idx]
                out["bad"] = [list(b) for b in ld.stats["bad"]]
    except BadFileError as e:
        out["error"] = {"kind": "bad file", "path": e.path, "reason": e.reason, "text": str(e)}
    except BaseException as e:  # noqa: B902 - every other exception is what we look for
        out["error"] = {"kind": "exception", "text": _exc(e),
                        "traceback": traceback.format_exc(limit=-4)}
    out["leaks"] = _leaks()
    send({"done": out})


class _Driver:
    """Runs one backend under one policy; every loader epoch runs in a forked process of its own
    group, so a segfault, a hang or a leaked worker is seen and pinned to a file (NOTE [fuzz
    invariants])."""

    def __init__(self, backend: str, root: str, tmp: Path, epoch_timeout: float,
                 max_crashes: int):
        from pipelines import list_samples

        self.backend, self.root, self.tmp = backend, root, tmp
        self.paths = list_samples(root)[0]
        self.epoch_timeout, self.max_crashes = epoch_timeout, max_crashes
        self.decoded: List[int] = []
        self.bad: Dict[int, str] = {}
        self.crash: Dict[int, str] = {}
        self.failures: List[Dict] = []
        self.epochs = 0
        self.policy = ""
        self.complete = False  # the search covered every file

    def rel(self, k: int) -> str:
        return os.path.relpath(self.paths[k], self.root)

    def fail(self, text: str, k: Optional[int] = None) -> None:
        self.failures.append({"error": text,
                              "file": None if k is None else self.rel(k)})

    # -- one epoch ----------------------------------------------------------------------------
    def epoch(self, keep: List[int], policy: str) -> Dict:
        """One epoch over ``paths[keep]`` (a root of hard links unless ``keep`` is all)."""
        from pipelines import list_samples

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
            res = self._fork(root, policy, self.epoch_timeout + 0.5 * len(keep))
        finally:
            if sub is not None:
                shutil.rmtree(sub, ignore_errors=True)
        res["listing"] = listing
        if res.get("leaks"):
            self.fail(f"alive after close(): {', '.join(res['leaks'])} (epoch over "
                      f"{len(keep)} files from {self.rel(keep[0])})")
        return res

    def _fork(self, root: str, policy: str, timeout: float) -> Dict:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the forked process
            code = 0
            try:
                os.close(r)
                os.setpgid(0, 0)
                faulthandler.disable()  # a crash is pinned to its file; no stack dump to stderr
                _epoch_body(self.backend, root, policy, w)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        progress: Dict = {"yielded": 0, "batches": 0}
        done, buf, eof = None, b"", False
        deadline = time.monotonic() + timeout
        with os.fdopen(r, "rb", buffering=0) as f:
            while not eof and time.monotonic() < deadline:
                ready, _, _ = select.select([f], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:
                    continue
                chunk = f.read(1 << 16)
                eof = not chunk
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for ln in lines:
                    msg = json.loads(ln)
                    if "done" in msg:
                        done = msg["done"]
                    else:
                        progress = msg
        if not eof:
            os.killpg(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if not eof:
            return {**progress, "error": {"kind": "hang", "text": f"no progress for "
                    f"{timeout:.0f}s (killed) after {progress['yielded']} samples"}}
        left = _group(pid)  # the epoch process is gone: anything left in its group leaked
        if left:
            time.sleep(2.0)
            left = _group(pid)
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        if done is None:
            why = (f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
                   if os.WIFSIGNALED(status) else f"exit code {os.WEXITSTATUS(status)}")
            done = {**progress, "error": {"kind": "killed", "text": f"the loader's process "
                    f"died ({why}) after {progress['yielded']} samples"}}
        done["leaks"] = done.get("leaks", []) + [f"{p} after the epoch's process exited"
                                                 for p in left]
        return done

    # -- crashes ------------------------------------------------------------------------------
    def _crashes(self, keep: List[int]) -> bool:
        return bool(keep) and self.epoch(keep, "skip")["error"] is not None

    def isolate(self, cands: List[int]) -> Optional[int]:
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

    def _on_crash(self, err: Dict, cands: List[int]) -> Optional[int]:
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

    def _check_skip(self, r: Dict, keep: List[int]) -> None:
        if r.get("indices") is None:
            self.fail("loader.last_indices is None after an epoch with debug_indices=True")
            return
        yielded = {keep[i] for i in r["indices"]}
        where = {p: keep[j] for j, p in enumerate(r["listing"])}
        named: Dict[int, str] = {}
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


def _worker(spec_path: str) -> int:
    """The child: run one backend under one policy, write the result JSON (``spec["result"]``)."""
    spec = json.loads(Path(spec_path).read_text())
    res: Dict = {"files": [], "decoded": [], "bad": {}, "crash": {}, "failures": []}
    t0 = time.perf_counter()
    try:
        # import the backend before forking, so each epoch's process starts warm
        if spec["backend"] == "dali":
            import pipelines.dali.loader  # noqa: F401
        else:
            import torchvision.transforms.v2  # noqa: F401

            import pipelines.torch_backend.pageable  # noqa: F401
            import pipelines.torch_backend.pinned  # noqa: F401
        gc.freeze()  # the forked epochs' collections (DALI's close() runs one) skip these objects
        with tempfile.TemporaryDirectory(prefix="fuzz-epochs-") as tmp:
            d = _Driver(spec["backend"], spec["root"], Path(tmp), spec["epoch_timeout"],
                        spec["max_crashes"])
            res["files"] = [d.rel(k) for k in range(len(d.paths))]
            try:
                d.run_skip() if spec["policy"] == "skip" else d.run_error()
            finally:
                res.update(decoded=sorted(d.decoded), bad={str(k): v for k, v in d.bad.items()},
                           crash={str(k): v for k, v in d.crash.items()},
                           failures=d.failures, epochs=d.epochs, complete=d.complete)
    except BaseException as e:  # noqa: B902 - reported, not hidden
        res["failures"].append({"error": f"the driver failed: {_exc(e)}\n"
                                         f"{traceback.format_exc(limit=-3)}", "file": None})
    res["driver_seconds"] = round(time.perf_counter() - t0, 3)
    Path(spec["result"]).write_text(json.dumps(res))
    return 0


_LIVE: set = set()  # the sessions of the children now running (killed on Ctrl-C)


def _kill_live() -> None:
    for pid in list(_LIVE):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


def run_backend(backend: str, root: str | os.PathLike, policy: str, timeout: float = 600.0,
                epoch_timeout: float = 30.0, max_crashes: int = 100) -> Dict:
    """Run one backend under one policy in a child process (NOTE [fuzz invariants]).

    Args:
        backend: ``"pageable"``, ``"pinned"`` or ``"dali"``.
        root: the corpus root.
        policy: ``"skip"`` or ``"error"``.
        timeout: seconds before the child (and its session) is killed as hung.
        epoch_timeout: seconds (plus 0.5 s per file) one epoch may take before it counts as a
            hang and its file is searched for.
        max_crashes: crashing files pinned down before the search gives up.

    Returns:
        ``{"backend", "policy", "files": [relative paths, listing order], "decoded": [indices],
        "bad": {index: reason}, "crash": {index: text}, "failures": [{"error", "file"}],
        "epochs", "seconds", "exit_code"}``.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r} must be one of {POLICIES}")
    root = os.path.abspath(root)
    with tempfile.TemporaryDirectory(prefix="fuzz-run-") as tmp:
        spec, result = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec.write_text(json.dumps({"backend": backend, "root": root, "policy": policy,
                                    "result": str(result), "epoch_timeout": epoch_timeout,
                                    "max_crashes": max_crashes}))
        env = dict(os.environ)
        repo = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join([repo] + [p for p in [env.get("PYTHONPATH")] if p])
        t0 = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "compare.fuzz", "--worker", str(spec)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                                 start_new_session=True)
        _LIVE.add(child.pid)
        hung = False
        try:
            _, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            hung = True
            os.killpg(child.pid, signal.SIGKILL)
            _, err = child.communicate()
        finally:
            _LIVE.discard(child.pid)
        seconds = time.perf_counter() - t0
        left = [] if hung else _group(child.pid)
        if left:
            os.killpg(child.pid, signal.SIGKILL)
        have = result.exists()
        res = json.loads(result.read_text()) if have else {
            "files": [], "decoded": [], "bad": {}, "crash": {}, "failures": []}
    text = err.decode(errors="replace")
    tail = text[-3000:]
    res.update(backend=backend, policy=policy, seconds=round(seconds, 2),
               exit_code=child.returncode)
    fail = res["failures"]
    if hung:
        last = [ln for ln in text.splitlines() if ln.startswith("[fuzz]")][-1:]
        fail.append({"error": f"timeout after {timeout:g}s (hang); last progress: "
                              f"{last[0] if last else 'none'}", "file": None})
    elif child.returncode != 0 or not have:
        fail.append({"error": f"the child exited with code {child.returncode} and "
                              f"{'a' if have else 'no'} result; stderr tail:\n{tail[-1500:]}",
                     "file": None})
    if left:
        fail.append({"error": f"processes left after the child exited: "
                              f"{', '.join(left)}", "file": None})
    return res


# -- the suite ------------------------------------------------------------------------------------
def _clean(reason: str) -> str:
    """A reason's first line without a decoder's source location."""
    r = reason.splitlines()[0] if reason else ""
    return re.sub(r"\S*/(\S+\.(?:cpp|cc|c|h|py)):\d+,? ?", "", r)


def _norm(reason: str) -> str:
    """A reason without file names and numbers, to group by."""
    r = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", _clean(reason))
    r = re.sub(r"\d+", "N", re.sub(r"0x[0-9a-fA-F]+", "HEX", r))
    return re.sub(r"N(, N)+", "N", r.replace("pid(s)", "pid"))[:200]


def _verdicts(run: Dict) -> Dict[str, Tuple[str, str]]:
    """``file -> (verdict, reason)`` of one run: ``decoded``, ``bad`` or ``crash``."""
    files = run.get("files", [])
    v = {files[k]: ("decoded", "") for k in run["decoded"]}
    v.update({files[int(k)]: ("bad", r) for k, r in run["bad"].items()})
    v.update({files[int(k)]: ("crash", r) for k, r in run.get("crash", {}).items()})
    return v


def evaluate(records: List[Dict], runs: List[Dict]) -> Dict:
    """Per-file verdicts, the agreement rate, the disagreements and the invariant failures.

    A file's verdict for a backend is its ``skip`` verdict (its ``error`` verdict where the skip
    run did not reach it). Every invariant failure that names a file carries the file's case
    and mutation: the reproducer.
    """
    by_file = {r["file"]: r for r in records}
    failures = []
    for r in runs:
        for f in r["failures"]:
            rec = by_file.get(f.get("file"), {})
            failures.append({"backend": r["backend"], "policy": r["policy"], **f,
                             "case": rec.get("case"), "mutation": rec.get("mutation"),
                             "seed_file": rec.get("seed_file")})
    verdict = {(r["backend"], r["policy"]): _verdicts(r) for r in runs}
    backends = list(dict.fromkeys(r["backend"] for r in runs))
    for b in backends:  # error and skip must agree on every file
        both = [r for r in runs if r["backend"] == b and r.get("complete")]
        if len(both) < 2:
            continue  # a search that stopped early is already a failure
        s, e = verdict[(b, "skip")], verdict[(b, "error")]
        for f in sorted(set(s) | set(e)):
            vs, ve = s.get(f, ("unknown", "")), e.get(f, ("unknown", ""))
            if vs[0] != ve[0]:
                rec = by_file.get(f, {})
                failures.append({"backend": b, "policy": "skip/error", "file": f,
                                 "error": f"skip: {vs[0]} {vs[1]!r}, error: {ve[0]} {ve[1]!r}",
                                 "case": rec.get("case"), "mutation": rec.get("mutation"),
                                 "seed_file": rec.get("seed_file")})
    out_records, disagreements = [], []
    for rec in records:
        per = {}
        for b in backends:
            got = (verdict.get((b, "skip"), {}).get(rec["file"])
                   or verdict.get((b, "error"), {}).get(rec["file"]) or ("unknown", ""))
            per[b] = {"verdict": got[0], "reason": got[1], "error_policy":
                      verdict.get((b, "error"), {}).get(rec["file"], ("unknown",))[0]}
        rec = {**rec, "verdicts": per}
        out_records.append(rec)
        vs = {p["verdict"] for p in per.values()}
        if "unknown" not in vs and len(vs) > 1:
            disagreements.append(rec)
    known = [r for r in out_records
             if all(p["verdict"] != "unknown" for p in r["verdicts"].values())]
    agree = len(known) - len(disagreements)
    return {"records": out_records, "disagreements": disagreements,
            "agreement": {"agree": agree, "compared": len(known),
                          "rate": agree / len(known) if known else None},
            "good_rejected": [r["file"] for r in out_records if r["kind"] == "none" and
                              any(p["verdict"] in ("bad", "crash")
                                  for p in r["verdicts"].values())],
            "invariant_failures": failures}


def _classes(disagreements: List[Dict]) -> List[Tuple[str, List[Dict]]]:
    groups: Dict[str, List[Dict]] = {}
    for d in disagreements:
        by: Dict[str, List[str]] = {}
        for b, p in d["verdicts"].items():
            by.setdefault(p["verdict"], []).append(b)
        key = " vs ".join(f"{','.join(bs)}={v}" for v, bs in sorted(by.items()))
        groups.setdefault(key, []).append(d)
    return sorted(groups.items(), key=lambda kv: -len(kv[1]))


def summary(result: Dict, verbose: bool = False) -> str:
    """The short text report of a :func:`run_suite` result."""
    a, recs = result["agreement"], result["records"]
    lines = [f"fuzz: {result['cases']} cases + {len(recs) - result['cases']} good files, "
             f"seed {result['seed']}, backends {','.join(result['backends'])}, "
             f"{result['seconds']:.1f} s"]
    for r in result["runs"]:
        lines.append(f"  {r['backend']:>8}/{r['policy']:<5} {len(r['decoded']):4d} decoded "
                     f"{len(r['bad']):4d} bad {len(r.get('crash', {})):3d} crash  "
                     f"{r.get('epochs', 0):4d} epochs {r['seconds']:6.1f} s"
                     + ("" if r.get("complete") else "  INCOMPLETE"))
    rate = "n/a" if a["rate"] is None else f"{100 * a['rate']:.1f}%"
    unknown = len(recs) - a["compared"]
    lines.append(f"agreement: {a['agree']}/{a['compared']} files = {rate} "
                 f"({len(result['disagreements'])} disagreements"
                 + (f"; {unknown} files lack a verdict from some backend)" if unknown else ")"))
    if result["good_rejected"]:
        lines.append(f"untouched files not decoded: {', '.join(result['good_rejected'])}")
    for key, ds in _classes(result["disagreements"]):
        kinds = Counter(d["kind"] for d in ds).most_common(5)
        seeds = Counter(d["seed_kind"] for d in ds).most_common()
        lines.append(f"  {len(ds)} x {key}  [" + ", ".join(f"{k} {n}" for k, n in kinds)
                     + "; seeds " + ", ".join(f"{k} {n}" for k, n in seeds) + "]")
        reasons: Counter = Counter()
        for d in ds:
            by_reason: Dict[str, List[str]] = {}
            for b, p in d["verdicts"].items():
                if p["verdict"] != "decoded":
                    by_reason.setdefault(_norm(p["reason"]), []).append(b)
            reasons.update((",".join(bs), why) for why, bs in by_reason.items())
        for (bs, why), n in reasons.most_common(4):
            lines.append(f"      {bs}: {n} x {why}")
        for d in ds if verbose else ds[:1]:
            why = "; ".join(f"{b}: {_clean(p['reason'])[:100]}"
                            for b, p in d["verdicts"].items() if p["reason"])
            lines.append(f"      e.g. {d['file']}  {d['mutation']}  ({d['seed_file']}) -> {why}")
    fails = result["invariant_failures"]
    pinned = {f["file"] for f in fails if f.get("file")}
    lines.append(f"invariant failures: {len(fails) or 'none'}"
                 + (f" ({len(pinned)} files pinned down)" if pinned else ""))
    groups: Dict[str, List[Dict]] = {}
    for f in fails:
        groups.setdefault(_norm(f["error"].split(" (from ")[0]), []).append(f)
    for key, fs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        where = Counter(f"{f['backend']}/{f['policy']}" for f in fs)
        lines.append(f"  {len(fs)} x {key}  [" + ", ".join(f"{k} {n}" for k, n in where.items())
                     + "]")
        for ex in [f for f in fs if f.get("file")][:1] or fs[:1]:
            lines.append(f"      e.g. {ex['file']} = case {ex['case']} of --seed "
                         f"{result['seed']}: {ex['mutation']} of {ex['seed_file']}"
                         if ex.get("file") else f"      e.g. {ex['error'].splitlines()[0][:300]}")
    return "\n".join(lines)


def run_suite(out: str | os.PathLike, cases: int, seed: int, backends: Sequence[str],
              timeout: float = 600.0, jobs: int = 2, log: Callable[[str], None] = lambda s: None,
              epoch_timeout: float = 30.0, max_crashes: int = 100) -> Dict:
    """Build the corpus under ``out/corpus``, run every backend x policy, write ``out/fuzz.json``.

    Returns:
        The result: ``{"cases", "seed", "backends", "seconds", "environment", "runs", "records",
        "agreement", "disagreements", "good_rejected", "invariant_failures"}``.
    """
    from concurrent.futures import ThreadPoolExecutor

    from .env import environment

    out = Path(out)
    t0 = time.perf_counter()
    records = make_corpus(out / "corpus", cases, seed)
    log(f"corpus: {len(records)} files in {out / 'corpus'} ({time.perf_counter() - t0:.1f} s)")
    tasks = [(b, p) for p in ("error", "skip") for b in backends]  # the long searches first

    def one(t):
        r = run_backend(t[0], out / "corpus", t[1], timeout, epoch_timeout, max_crashes)
        log(f"{t[0]}/{t[1]}: {len(r['decoded'])} decoded, {len(r['bad'])} bad, "
            f"{len(r.get('crash', {}))} crash, {r.get('epochs', 0)} epochs, {r['seconds']:.1f} s"
            + (f", {len(r['failures'])} FAILURES" if r["failures"] else ""))
        return r

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        try:
            runs = list(pool.map(one, tasks))
        except BaseException:  # Ctrl-C: stop the children (their own sessions miss the signal)
            _kill_live()
            raise
    runs.sort(key=lambda r: (list(backends).index(r["backend"]), POLICIES.index(r["policy"])))
    result = {"cases": cases, "seed": seed, "backends": list(backends),
              "seconds": round(time.perf_counter() - t0, 2), "environment": environment(),
              "timeout": timeout, "runs": runs, **evaluate(records, runs)}
    (out / "fuzz.json").write_text(json.dumps(result, indent=1))
    return result


# -- CLI -------------------------------------------------------------------------------------------
class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        raise _UsageError(message)


def _parse(argv) -> argparse.Namespace:
    from pipelines import Backend, available_backends

    p = _Parser(prog="fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=300, help="mutated files (default 300)")
    p.add_argument("--seed", type=int, default=0, help="corpus seed (default 0)")
    p.add_argument("--out", required=True, help="output folder (corpus/ and fuzz.json)")
    p.add_argument("--backends", default=None, help="comma list of pageable,pinned,dali "
                   "(default: all available)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds per backend and policy before it counts as a hang (default 600)")
    p.add_argument("--jobs", type=int, default=2, help="backend runs at once (default 2)")
    p.add_argument("--max-crashes", type=int, default=100,
                   help="crashing files pinned down per run before the search stops (default 100)")
    p.add_argument("-v", "--verbose", action="store_true", help="print every disagreement")
    a = p.parse_args(argv)
    if not 1 <= a.cases <= 100_000:
        raise _UsageError(f"--cases {a.cases} must be in [1, 100000]")
    if not 0 <= a.seed < 2**32:
        raise _UsageError(f"--seed {a.seed} must be in [0, 2**32)")
    if not 0 < a.timeout < float("inf"):
        raise _UsageError(f"--timeout {a.timeout:g} must be > 0 seconds")
    if a.jobs < 1:
        raise _UsageError(f"--jobs {a.jobs} must be >= 1")
    if a.max_crashes < 0:
        raise _UsageError(f"--max-crashes {a.max_crashes} must be >= 0")
    order = ["pageable", "pinned", "dali"]
    avail = sorted((b.value for b in available_backends()), key=order.index)
    if a.backends is None:
        a.backends = avail
    else:
        names = [s.strip().lower() for s in a.backends.split(",") if s.strip()]
        try:
            names = [Backend.parse(s).value for s in names]
        except ValueError as e:
            raise _UsageError(f"--backends: {e}") from None
        if not names or len(set(names)) != len(names):
            raise _UsageError(f"--backends {a.backends!r} must list distinct backends")
        missing = [s for s in names if s not in avail]
        if missing:
            raise _UsageError(f"--backends {','.join(missing)} not installed here "
                              "(pip install '.[dali]')")
        a.backends = names
    out = Path(a.out)
    if out.exists() and not out.is_dir():
        raise _UsageError(f"--out {a.out!r} is a file, not a folder")
    corpus = out / "corpus"
    if corpus.is_dir() and any(corpus.iterdir()) and not (corpus / _MARK).exists():
        raise _UsageError(f"--out {a.out!r}: {corpus} holds files that are not a fuzz corpus")
    return a


def main(argv=None) -> int:
    """``python -m compare.fuzz``: 0 when every invariant holds, 1 on a failure, 2 on bad usage."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"] and len(argv) == 2:
        return _worker(argv[1])
    try:
        a = _parse(argv)
    except _UsageError as e:
        print(f"fuzz: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help
        return int(e.code or 0)
    log = lambda s: print(s, flush=True)  # noqa: E731
    try:
        result = run_suite(a.out, a.cases, a.seed, a.backends, a.timeout, a.jobs, log,
                           max_crashes=a.max_crashes)
    except KeyboardInterrupt:
        print("fuzz: interrupted", file=sys.stderr)
        return 130
    except (OSError, ValueError) as e:  # an unwritable --out, a corpus folder that is not ours
        print(f"fuzz: error: {e}", file=sys.stderr)
        return 2
    print(summary(result, verbose=a.verbose))
    print(f"wrote {Path(a.out) / 'fuzz.json'}")
    return 1 if result["invariant_failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
