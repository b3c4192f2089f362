"""compare.cpuroles: a window's CPU split into the loop's thread, other threads and children."""
import multiprocessing as mp
import threading
import time

import pytest

from compare import cpuroles
from compare.cpuroles import RoleCpu, _ticks

pytestmark = pytest.mark.skipif(not cpuroles._PROC.joinpath("self/stat").exists(),
                                reason="needs Linux /proc")


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds  # CPU time, so a shared core cannot shorten the work
    while time.thread_time() < end:
        pass


def _spin_then_sleep(spin: float, sleep: float, done) -> None:
    _spin(spin)
    done.set()
    time.sleep(sleep)


def _crowded(seconds: float) -> None:
    """Busy on CPU 0 only, where the other crowded children are too."""
    import os

    os.sched_setaffinity(0, {0})
    _spin(seconds)


def _ctx():
    return mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")


def _cpu_s(split: dict, wall: float, role: str) -> float:
    return split[role] * wall


def test_a_child_that_starts_and_ends_inside_the_window_counts_once_reaped():
    r = RoleCpu()
    r.start()
    t0 = time.perf_counter()
    p = _ctx().Process(target=_spin, args=(0.4,))
    p.start()
    p.join()
    got = r.stop()
    wall = time.perf_counter() - t0
    assert 0.3 <= _cpu_s(got, wall, "workers") <= 0.7
    assert got["main"] < 0.5  # the loop only waited on the join


def test_a_child_counts_only_its_time_inside_the_window():
    """Busy before the window and ended inside it: the time it had at the start is taken off
    again when the kernel adds its whole life to this process's cutime."""
    ctx = _ctx()
    done = ctx.Event()
    p = ctx.Process(target=_spin_then_sleep, args=(0.6, 0.4, done))
    p.start()
    assert done.wait(30)  # its spin is over before the window starts
    r = RoleCpu()
    r.start()
    t0 = time.perf_counter()
    p.join()
    got = r.stop()
    wall = time.perf_counter() - t0
    assert _cpu_s(got, wall, "workers") < 0.3  # not the 0.6 s it spent before the window


def test_another_thread_is_counted_apart_from_the_loop():
    r = RoleCpu()
    r.start()
    t0 = time.perf_counter()
    th = threading.Thread(target=_spin, args=(0.3,))
    th.start()
    th.join()  # ended inside the window: the process's total keeps its time
    got = r.stop()
    wall = time.perf_counter() - t0
    assert 0.2 <= _cpu_s(got, wall, "threads") <= 0.6
    assert _cpu_s(got, wall, "main") < 0.15 and got["workers"] < 0.1


def test_the_loop_thread_is_main():
    r = RoleCpu()
    r.start()
    t0 = time.perf_counter()
    _spin(0.3)
    got = r.stop()
    wall = time.perf_counter() - t0
    assert 0.2 <= _cpu_s(got, wall, "main") <= 0.45 and got["threads"] < 0.3


def test_stat_fields_are_counted_after_the_command_name():
    line = "42 (a b) c) S 1 42 42 0 -1 4194560 10 0 0 0 7 3 11 5 20 0 1 0"
    assert _ticks(line) == (7, 3, 11, 5)


def test_no_proc_gives_none(monkeypatch, tmp_path):
    monkeypatch.setattr(cpuroles, "_PROC", tmp_path / "nothing")
    r = RoleCpu()
    r.start()
    assert r.stop() is None


def test_samples_per_worker_core_are_each_windows_rate_over_its_workers_cores():
    from compare.results import Repeat, VariantResult, per_worker_core

    def rep(train, lo, tw, lw):
        roles = {"training": {"main": 0.5, "workers": tw, "threads": 0.5},
                 "loader_only": {"main": 0.0, "workers": lw, "threads": 0.3}}
        return Repeat(train, lo, 1.0, 2.0, 0.0, cpu_roles=roles)

    v = VariantResult("pinned", "pinned", {}, None,
                      (rep(4000, 3000, 10, 10), rep(4400, 4400, 11, 11), rep(3600, 3900, 12, 13)))
    assert per_worker_core(v) == (400.0, 300.0)  # medians of 400/400/300 and 300/400/300
    dali = VariantResult("dali", "dali", {}, None, (rep(4000, 9000, 0.0, 0.0),))
    assert per_worker_core(dali) is None  # no workers
    none = VariantResult("pinned", "pinned", {}, None, (Repeat(1.0, 1.0, 1.0, 1.0, 0.0),))
    assert per_worker_core(none) is None


@pytest.mark.skipif(not cpuroles._PROC.joinpath("self/schedstat").exists()
                    or not hasattr(__import__("os"), "sched_setaffinity"),
                    reason="needs schedstat and sched_setaffinity")
def test_workers_that_wait_for_a_core_show_as_run_queue_time():
    """Three busy children on one core: each runs about a third of the time and waits for the
    core the rest, about two cores of run-queue time between them; one child alone on its
    core waits about none."""
    def window(n):
        kids = [_ctx().Process(target=_crowded, args=(5.0,)) for _ in range(n)]
        r = RoleCpu()
        r.start()
        for k in kids:
            k.start()
        time.sleep(0.8)
        got = r.stop()
        for k in kids:
            k.terminate()
            k.join()
        return got

    crowded = window(3)
    assert crowded[cpuroles.RUNQ] > 1.0 and crowded["workers"] < 1.3
    assert window(1)[cpuroles.RUNQ] < 0.5


def _touch(mib: int) -> None:
    """New memory, one write a page: a minor page fault each, served by the kernel (small
    pages asked for, where transparent huge pages would fault 2 MiB at a time)."""
    import mmap

    buf = mmap.mmap(-1, mib << 20)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    for i in range(0, len(buf), 4096):
        buf[i] = 1


def _compute(seconds: float) -> None:
    """User-space work only: ``_spin`` reads its thread's CPU clock, a system call each time."""
    end, x = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:  # the vDSO clock: no system call
        for i in range(10_000):
            x += i * i


def test_workers_kernel_time_and_page_faults_are_counted_once_reaped():
    """A child that faults in 256 MiB page by page, started and ended inside the window
    (counted through cminflt and cstime once reaped), against one that only computes."""
    def window(target, arg):
        r = RoleCpu()
        r.start()
        t0 = time.perf_counter()
        p = _ctx().Process(target=target, args=(arg,))
        p.start()
        p.join()
        got = r.stop()
        return got, time.perf_counter() - t0

    faulting, wall = window(_touch, 256)
    assert faulting[cpuroles.FAULTS] * wall > 256 * 256 * 0.9  # a fault for each 4 KiB page
    assert 0 < faulting[cpuroles.SYS] <= faulting["workers"]
    computing, wall = window(_compute, 0.5)
    assert computing[cpuroles.FAULTS] * wall < 256 * 256 * 0.2
    assert computing[cpuroles.SYS] < 0.2 * computing["workers"]
    assert computing[cpuroles.SYS] / computing["workers"] \
        < faulting[cpuroles.SYS] / faulting["workers"]


def test_worker_kernel_gives_each_windows_kernel_share_and_faults_per_sample():
    from compare.results import Repeat, VariantResult, worker_kernel

    def rep(rate, sys, faults, workers=10.0):
        roles = {w: {"main": 0.1, "workers": workers, "threads": 0.1, cpuroles.SYS: sys,
                     cpuroles.FAULTS: faults} for w in ("training", "loader_only")}
        return Repeat(rate, rate / 2, 1.0, 2.0, 0.0, cpu_roles=roles)

    v = VariantResult("pageable", "pageable", {}, None,
                      (rep(1000, 1.0, 300_000), rep(1000, 2.0, 500_000), rep(2000, 3.0, 200_000)))
    # kernel %: 10, 20, 30; faults per sample: 300, 500, 100 (training), twice that loader-only
    assert worker_kernel(v) == {"training": (20.0, 300.0), "loader_only": (20.0, 600.0)}
    old = VariantResult("pageable", "pageable", {}, None, (Repeat(1.0, 1.0, 1.0, 1.0, 0.0,
                        cpu_roles={w: {"main": 0.1, "workers": 9.0, "threads": 0.1}
                                   for w in ("training", "loader_only")}),))
    assert worker_kernel(old) is None  # a run before these fields
    assert worker_kernel(VariantResult("dali", "dali", {}, None, (rep(9000, 0.0, 0.0, 0.0),))) \
        is None  # no workers


def test_the_processs_memory_is_recorded_at_the_windows_end():
    r = RoleCpu()
    r.start()
    before = r.stop()
    r.start()
    grown = b"\x01" * (64 << 20)  # written, so resident
    after = r.stop()
    assert len(grown) == 64 << 20
    assert after["rss_mib"] - before["rss_mib"] >= 60
    assert after["page_tables_kib"] > 0
