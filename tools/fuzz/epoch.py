"""One loader epoch in a forked process of its own process group (``fork_epoch``).

A segfault or a hang then ends that epoch only, and what it leaves behind is seen: the forked
process reports progress and its result as JSON lines on a pipe; a pipe closed without a result
is a death (the signal is named), a pipe silent past the timeout is a hang (the group is killed),
and a child process or ``dali-read`` thread alive after ``close()``, or a process left in the
group after the epoch exits, is a leak (NOTE [fuzz invariants] in ``tools.fuzz``).
"""
from __future__ import annotations

import faulthandler
import json
import os
import select
import signal
import threading
import time
import traceback

BATCH_SIZE = 8


def _config(root, policy: str):
    from pipelines import AugmentSpec, LoaderConfig

    return LoaderConfig(root=root, batch_size=BATCH_SIZE, device="cpu", shuffle=False,
                        num_workers=2, augment=AugmentSpec(mode="eval", size=32, resize_size=32),
                        debug_indices=True, on_bad_file=policy)


def exc_text(e: BaseException) -> str:
    """``Type: message`` of ``e``, and of its cause (DataLoader names a worker's signal there)."""
    text = " ".join("".join(traceback.format_exception_only(type(e), e)).split())
    cause = e.__cause__ or e.__context__
    if cause is not None and str(cause) != str(e):
        text += f" (from {type(cause).__name__}: {' '.join(str(cause).split())})"
    return text


def _leaks() -> list[str]:
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


def live_in_group(pgid: int) -> list[str]:
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

    out: dict = {"yielded": 0, "batches": 0, "error": None}
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
        out["error"] = {"kind": "exception", "text": exc_text(e),
                        "traceback": traceback.format_exc(limit=-4)}
    out["leaks"] = _leaks()
    send({"done": out})


def fork_epoch(backend: str, root: str, policy: str, timeout: float) -> dict:
    """One epoch of ``backend`` over ``root`` under ``policy``, in a forked process group.

    Returns:
        ``{"yielded", "batches", "error"}``, with ``"leaks"`` unless it hung and ``"indices"``,
        ``"bad"`` (``loader.last_indices``, ``loader.stats["bad"]``) when the loop ended.
        ``error`` is ``None`` or ``{"kind", "text"}`` with kind ``"bad file"`` (and ``path``,
        ``reason``), ``"exception"`` (and ``traceback``), ``"killed"`` or ``"hang"``.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked process
        code = 0
        try:
            os.close(r)
            os.setpgid(0, 0)
            faulthandler.disable()  # a crash is pinned to its file; no stack dump to stderr
            _epoch_body(backend, root, policy, w)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    progress: dict = {"yielded": 0, "batches": 0}
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
    left = live_in_group(pid)  # the epoch process is gone: anything left in its group leaked
    if left:
        time.sleep(2.0)
        left = live_in_group(pid)
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
