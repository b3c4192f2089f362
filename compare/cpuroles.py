"""Where a window's CPU time went: this thread, this process's other threads, and its child
processes (a DataLoader's workers).

NOTE [cpu roles]
The suite's CPU % is the whole machine's (``metrics.CpuUtil``). It cannot tell a loader whose
workers were starved of cores from one whose workers sat idle waiting for work, nor see a thread
beside them that took a core (a spinning wait, a pin-memory thread). ``RoleCpu`` splits one
window's CPU time, read from ``/proc``, into three roles, each in cores (CPU seconds over the
window's wall seconds):

* ``main``: the thread that started the window (the training or loader-only loop);
* ``threads``: every other thread of this process (torch's pin-memory thread, DALI's threads,
  CUDA's), the process's total less ``main``; threads that ended inside the window count, since
  the process's total keeps their time;
* ``workers``: the child processes, the DataLoader's workers. A worker alive at both ends counts
  its difference; one started inside the window all of its time; one that ended inside it (a
  non-persistent loader's workers at an epoch's end) its time up to the end less what it had at
  the start, which the kernel adds to this process's ``cutime``/``cstime`` once it is reaped.
  A child that ended and was not reaped by the end of the window is still in ``/proc`` (a
  zombie keeps its times) and counts there. Only direct children count: a worker's own
  children (none in a DataLoader) would be missed.

One more figure, ``workers_runq``: the time the workers were ready to run and waited for a
core (``/proc/PID/schedstat``'s run delay), in cores too. Workers that used fewer cores in one
window than in another either had less to do (they waited for work, not in the run queue) or
got less of the CPU: that shows here as run-queue time. It counts the workers alive at both
ends of the window and those started inside it (a worker that ended inside the window takes its
run delay with it), and it is ``None`` where the kernel does not keep schedstat. The time the
hypervisor gives other guests is not in it (``metrics.CpuUtil``'s steal is).

Two more of the workers, counted like their CPU time (the reaped ones through this process's
``cstime`` and ``cminflt``): ``workers_sys``, the part of their cores spent in the kernel, and
``workers_faults``, their minor page faults per second. A worker that does more per sample in
one window than in another either ran on a slower host (its user time per sample grows) or
made the kernel work more: page faults on memory it shares copy-on-write with the process that
forked it, or on new memory (its system time and faults per sample grow). On the H200 a
non-persistent ``pageable`` loader's workers, forked again each epoch, made fewer samples per
CPU second later in a process (docs/results/h200/README.md, paired-long); this tells the two
apart. With them, at the window's end, the process's own memory: ``rss_mib`` (``VmRSS``) and
``page_tables_kib`` (``VmPTE``, what a fork copies), which show whether the process that forks
the workers grew between windows.

On a machine without ``/proc`` (not Linux) ``start`` and ``stop`` give ``None``. The suite
records the split of both windows of each repeat (``Repeat.cpu_roles``) and the summary gives
the medians; ``pinned``'s loader-only window below its training window (the H200 index,
``loader-only-last/``) is the question it was built for.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

ROLES = ("main", "workers", "threads")
RUNQ = "workers_runq"  # the workers' run-queue wait, in cores (NOTE [cpu roles])
SYS = "workers_sys"  # the workers' kernel time, in cores, a part of "workers"
FAULTS = "workers_faults"  # the workers' minor page faults per second
MEMORY = {"VmRSS": "rss_mib", "VmPTE": "page_tables_kib"}  # /proc/self/status, at the end
_PROC = Path("/proc")


def _fields(stat: str) -> list[str]:
    """A ``/proc/.../stat`` line's fields from field 3 on: the command name (field 2) is in
    parentheses and may hold spaces, so they are counted from its closing parenthesis."""
    return stat[stat.rindex(")") + 2:].split()


def _ticks(stat: str) -> tuple[int, int, int, int]:
    """``(utime, stime, cutime, cstime)`` of a ``/proc/.../stat`` line (fields 14-17)."""
    f = _fields(stat)
    return int(f[11]), int(f[12]), int(f[13]), int(f[14])


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:  # the process or thread ended between listing and reading
        return None


def _runq_ns(pid: int) -> int | None:
    """Nanoseconds ``pid`` has waited on a run queue (``/proc/PID/schedstat``'s second field),
    ``None`` without it."""
    s = _read(_PROC / str(pid) / "schedstat")
    try:
        return int(s.split()[1]) if s else None
    except (IndexError, ValueError):
        return None


def _faults(stat: str) -> tuple[int, int]:
    """``(minflt, cminflt)`` of a ``/proc/.../stat`` line (fields 10 and 11)."""
    f = _fields(stat)
    return int(f[7]), int(f[8])


def _children(pid: int) -> dict[int, tuple[int, int, int]]:
    """``{child pid: (utime + stime, stime, minflt)}`` of ``pid``'s direct children."""
    out: dict[int, tuple[int, int, int]] = {}
    for d in _PROC.iterdir():
        if not d.name.isdigit():
            continue
        s = _read(d / "stat")
        if s is None:
            continue
        f = _fields(s)
        if int(f[1]) == pid:  # field 4: the parent's pid
            out[int(d.name)] = (int(f[11]) + int(f[12]), int(f[12]), int(f[7]))
    return out


def _memory() -> dict[str, float]:
    """This process's ``MEMORY`` fields (``rss_mib`` in MiB, ``page_tables_kib`` in KiB);
    those the kernel does not give are left out."""
    out: dict[str, float] = {}
    for line in (_read(_PROC / "self" / "status") or "").splitlines():
        key, _, rest = line.partition(":")
        if key in MEMORY and rest.split():
            kib = int(rest.split()[0])
            out[MEMORY[key]] = round(kib / 1024, 1) if key == "VmRSS" else kib
    return out


class _Snapshot:
    def __init__(self, pid: int, tid: int):
        self.t = time.perf_counter()
        own = _read(_PROC / str(pid) / "stat")
        main = _read(_PROC / str(pid) / "task" / str(tid) / "stat")
        if own is None or main is None:
            raise OSError("no /proc stat for this process")
        u, s, cu, cs = _ticks(own)
        mu, ms, _, _ = _ticks(main)
        self.process = u + s
        self.reaped = (cu + cs, cs, _faults(own)[1])  # as the children's tuples
        self.main = mu + ms
        self.children = _children(pid)
        self.runq = {c: _runq_ns(c) for c in self.children}


class RoleCpu:
    """One window's CPU split (NOTE [cpu roles]): ``start()`` on the loop's thread before the
    window, ``stop()`` after it; ``stop()`` returns ``{role: cores}`` or ``None`` where
    ``/proc`` cannot be read."""

    def __init__(self) -> None:
        self._a: _Snapshot | None = None
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def _snap(self) -> _Snapshot | None:
        try:
            return _Snapshot(os.getpid(), threading.get_native_id())
        except (OSError, ValueError, IndexError):
            return None

    def start(self) -> None:
        self._a = self._snap()

    def stop(self) -> dict[str, float] | None:
        a, b = self._a, self._snap()
        if a is None or b is None or b.t <= a.t:
            return None

        def workers(i: int) -> int:  # NOTE [cpu roles]: alive at both ends, started, ended
            return (sum(c[i] for c in b.children.values()) + (b.reaped[i] - a.reaped[i])
                    - sum(c[i] for c in a.children.values()))

        seconds = b.t - a.t
        wall = seconds * self._tick
        main = b.main - a.main
        cores = {"main": main, "workers": workers(0), "threads": (b.process - a.process) - main,
                 SYS: workers(1)}
        out = {k: round(max(0, v) / wall, 3) for k, v in cores.items()}
        out[FAULTS] = round(max(0, workers(2)) / seconds, 1)
        out.update(_memory())
        if b.runq and all(v is not None for v in b.runq.values()):
            waited = sum(ns - (a.runq.get(c) or 0) for c, ns in b.runq.items())
            out[RUNQ] = round(max(0, waited) / 1e9 / (b.t - a.t), 3)
        return out


__all__ = ["FAULTS", "MEMORY", "ROLES", "RUNQ", "RoleCpu", "SYS"]
