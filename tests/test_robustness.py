"""Every backend: one CPU fallback, numpy epochs, empty epochs refused, /dev/shm fit of any
transform, int64 indices. (Regression tests for the reliability issue, point 9 to 11.)"""
import warnings

import numpy as np
import pytest
import torch
from utils import broken_huffman

from pipelines import AugmentSpec, LoaderConfig, create_loader
from pipelines.epoch_plan import config_batches
from pipelines.torch_backend import shm

BACKENDS = ["pageable", "pinned", pytest.param("dali", marks=pytest.mark.dali)]


def _cfg(root, **kw):
    base = dict(root=root, batch_size=8, device="cpu", num_workers=0, shuffle=False,
                augment=AugmentSpec(mode="eval", size=32, resize_size=32), debug_indices=True)
    base.update(kw)
    return LoaderConfig(**base)


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_cuda_device_falls_back_to_cpu_with_one_warning(tiny_root, backend, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with create_loader(backend, _cfg(tiny_root, device="cuda")) as ld:
            x, y = next(iter(ld))
    msgs = [str(m.message) for m in w if "CUDA is not available" in str(m.message)]
    assert len(msgs) == 1 and backend in msgs[0]
    assert x.device.type == "cpu" and y.device.type == "cpu" and x.shape == (8, 3, 32, 32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_set_epoch_takes_numpy_ints_and_refuses_bools_and_floats(tiny_root, backend):
    with create_loader(backend, _cfg(tiny_root, shuffle=True)) as ld:
        ld.set_epoch(np.int64(1))
        list(ld)
        plan = np.concatenate(config_batches(37, ld.config, 1))
        assert ld.last_indices.tolist() == plan.tolist() != sorted(plan.tolist())
        for bad in (True, 1.0, -1, "1"):
            with pytest.raises(ValueError, match="epoch="):
                ld.set_epoch(bad)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kw, match", [
    ({"batch_size": 64, "last_batch": "drop"}, "batch_size=64 with last_batch='drop'"),
    ({"world_size": 40, "rank": 39, "last_batch": "partial"},
     "world_size=40 is larger than the dataset"),
])
def test_configs_with_empty_epochs_are_refused(tiny_root, backend, kw, match):
    with pytest.raises(ValueError, match=match):
        create_loader(backend, _cfg(tiny_root, **kw))


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_epoch_indices_are_int64(tmp_path, tiny_root, backend):
    root = tmp_path / "allbad"
    (root / "c").mkdir(parents=True)
    for k, p in enumerate(sorted(tiny_root.glob("class_0000/*.jpg"))[:3]):
        (root / "c" / f"{k}.jpg").write_bytes(broken_huffman(p.read_bytes()))
    with create_loader(backend, _cfg(root, on_bad_file="skip")) as ld:
        with pytest.warns(RuntimeWarning, match="skipped 3 bad files"):
            assert list(ld) == []
        assert ld.last_indices.dtype == np.int64 and ld.last_indices.size == 0
        assert ld.stats["bad_files"] == 3 and ld.stats["dropped_batches"] == 1


@pytest.mark.parametrize("backend", ["pageable", "pinned"])
def test_shm_fit_uses_the_transforms_output_size(tiny_root, backend, monkeypatch):
    """A 448 px transform with a 64 MB /dev/shm: the fit must see 448 px, not augment.size."""
    from torchvision.transforms import v2

    monkeypatch.setattr(shm, "shm_free_bytes", lambda path=shm.SHM_PATH: 64 * 2**20)
    t = v2.Compose([v2.Resize((448, 448)), v2.ToDtype(torch.float32, scale=True)])
    with pytest.warns(RuntimeWarning, match="/dev/shm has 64 MiB free") as w:
        ld = create_loader(backend, _cfg(tiny_root, transform=t, batch_size=16, num_workers=4,
                                         augment=AugmentSpec(size=32)))
    with ld:
        per_batch = 16 * 3 * 448 * 448 * (4 if backend == "pageable" else 1)
        msg = next(str(m.message) for m in w if "/dev/shm" in str(m.message))
        assert f"batches of {per_batch / 2**20:.1f} MiB" in msg
        assert shm.shm_need(ld.num_workers, ld.prefetch_factor, per_batch) <= 0.8 * 64 * 2**20
        assert next(iter(ld))[0].shape == (16, 3, 448, 448)
