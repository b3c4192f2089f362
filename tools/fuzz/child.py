"""One backend under one policy in a child process of its own session (``run_backend``).

The child is ``python -m tools.fuzz --worker SPEC`` (``worker``): it imports the backend once,
runs a ``Driver`` and writes the result JSON that ``SPEC`` names. The parent kills the child's
whole session when it runs past its timeout, and reports what the child could not: a hang, a
death, processes left behind (NOTE [fuzz invariants] in ``tools.fuzz``).
"""
from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from .driver import Driver
from .epoch import exc_text, live_in_group

POLICIES = ("skip", "error")



def worker(spec_path: str) -> int:
    """The child: run one backend under one policy, write the result JSON (``spec["result"]``)."""
    spec = json.loads(Path(spec_path).read_text())
    res: dict = {"files": [], "decoded": [], "bad": {}, "crash": {}, "failures": []}
    t0 = time.perf_counter()
    try:
        # import the backend before forking, so each epoch's process starts warm
        from pipelines.factory import preload

        preload(spec["backend"])
        gc.freeze()  # the forked epochs' collections (DALI's close() runs one) skip these objects
        with tempfile.TemporaryDirectory(prefix="fuzz-epochs-") as tmp:
            d = Driver(spec["backend"], spec["root"], Path(tmp), spec["epoch_timeout"],
                       spec["max_crashes"])
            res["files"] = [d.rel(k) for k in range(len(d.paths))]
            try:
                d.run_skip() if spec["policy"] == "skip" else d.run_error()
            finally:
                res.update(decoded=sorted(d.decoded), bad={str(k): v for k, v in d.bad.items()},
                           crash={str(k): v for k, v in d.crash.items()},
                           failures=d.failures, epochs=d.epochs, complete=d.complete)
    except BaseException as e:  # noqa: B902 - reported, not hidden
        res["failures"].append({"error": f"the driver failed: {exc_text(e)}\n"
                                         f"{traceback.format_exc(limit=-3)}", "file": None})
    res["driver_seconds"] = round(time.perf_counter() - t0, 3)
    Path(spec["result"]).write_text(json.dumps(res))
    return 0


_LIVE: set = set()  # the sessions of the children now running (killed on Ctrl-C)


def kill_live() -> None:
    """Kill the sessions of the children now running (their own sessions miss a Ctrl-C)."""
    for pid in list(_LIVE):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


def run_backend(backend: str, root: str | os.PathLike, policy: str, timeout: float = 600.0,
                epoch_timeout: float = 30.0, max_crashes: int = 100) -> dict:
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
        repo = str(Path(__file__).resolve().parents[2])  # tools/fuzz/child.py -> the repo
        env["PYTHONPATH"] = os.pathsep.join([repo] + [p for p in [env.get("PYTHONPATH")] if p])
        t0 = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "tools.fuzz", "--worker", str(spec)],
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
        left = [] if hung else live_in_group(child.pid)
        if left:
            os.killpg(child.pid, signal.SIGKILL)
        have = result.exists()
        res = json.loads(result.read_text()) if have else {
            "files": [], "decoded": [], "bad": {}, "crash": {}, "failures": []}
    text = err.decode(errors="replace")
    res.update(backend=backend, policy=policy, seconds=round(seconds, 2),
               exit_code=child.returncode)
    fail = res["failures"]
    if hung:
        last = [ln for ln in text.splitlines() if ln.startswith("[fuzz]")][-1:]
        fail.append({"error": f"timeout after {timeout:g}s (hang); last progress: "
                              f"{last[0] if last else 'none'}", "file": None})
    elif child.returncode != 0 or not have:
        fail.append({"error": f"the child exited with code {child.returncode} and "
                              f"{'a' if have else 'no'} result; stderr tail:\n{text[-1500:]}",
                     "file": None})
    if left:
        fail.append({"error": f"processes left after the child exited: "
                              f"{', '.join(left)}", "file": None})
    return res
