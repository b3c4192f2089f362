"""Shutdown leaves no orphans; a small /dev/shm never means a Bus error."""
import threading
import time
import warnings

import psutil
import pytest
from utils import make

from pipelines import AugmentSpec, LoaderConfig, create_loader
from pipelines.torch_backend import shm


def _cfg(root, **kw):
    base = dict(root=root, batch_size=4, device="cpu", num_workers=2, augment=AugmentSpec(size=32))
    base.update(kw)
    return LoaderConfig(**base)


def _children():
    return {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE}


def _settle(before, timeout=10.0):
    end = time.time() + timeout
    while time.time() < end:
        left = _children() - before
        if not left:
            return left
        time.sleep(0.1)
    return _children() - before


@pytest.mark.parametrize("backend", ["pageable", "pinned"])
@pytest.mark.parametrize("exc", [KeyboardInterrupt, ValueError])
@pytest.mark.parametrize("persistent", [True, False])
def test_interrupt_inside_with_leaves_no_orphan_workers(tiny_root, backend, exc, persistent):
    before = _children()
    with pytest.raises(exc):
        with make(backend, _cfg(tiny_root), persistent_workers=persistent) as ld:
            for i, _ in enumerate(ld):
                assert len(_children() - before) == 2  # the workers are really there
                if i == 1:
                    raise exc("simulated Ctrl-C / training error")
    assert _settle(before) == set()


@pytest.mark.dali
@pytest.mark.parametrize("exc", [KeyboardInterrupt, ValueError])
def test_dali_interrupt_leaves_no_reader_threads(tiny_root, exc):
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(exc):
        with create_loader("dali", _cfg(tiny_root)) as ld:
            next(iter(ld))
            raise exc("simulated")
    time.sleep(0.2)
    left = [t.name for t in threading.enumerate() if t.ident not in before and t.name.startswith("dali-read")]
    assert left == []


def test_fit_to_shm_lowers_prefetch_then_workers():
    mib = 2**20
    assert shm.fit_to_shm(8, 4, 10 * mib, 10_000 * mib) == (8, 4, None)
    w, p, msg = shm.fit_to_shm(8, 4, 10 * mib, 64 * mib)  # Docker's default 64 MB
    assert (w, p) == (3, 1) and "Bus error" in msg and "num_workers=8" in msg
    assert shm.shm_need(w, p, 10 * mib) <= 0.8 * 64 * mib
    w, p, msg = shm.fit_to_shm(8, 2, 100 * mib, 64 * mib)   # not even one batch fits
    assert (w, p) == (0, 1) and msg


@pytest.mark.parametrize("backend", ["pageable", "pinned"])
def test_small_shm_is_detected_and_the_loader_still_runs(tiny_root, backend, monkeypatch):
    batch = 4 * 3 * 32 * 32 * (4 if backend == "pageable" else 1)
    monkeypatch.setattr(shm, "shm_free_bytes", lambda path=shm.SHM_PATH: 5 * batch)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with make(backend, _cfg(tiny_root, num_workers=4), prefetch_factor=4) as ld:
            assert (ld.num_workers, ld.prefetch_factor) == (2, 1)  # (2 * 1 + 2) batches <= 80% of 5
            assert sum(len(y) for _, y in ld) == 37
    assert any("/dev/shm" in str(x.message) for x in w)
