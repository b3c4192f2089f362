"""Issue 55, class 6: one epoch range on every backend, refused at the call naming ``epoch``
(``pipelines.epoch_plan.MAX_EPOCH``): ``set_epoch``, ``load_state_dict`` and
``set_resolution(epoch=)`` take the same epochs, and the last one is served."""
from __future__ import annotations

import numpy as np
import pytest

from pipelines import AugmentSpec, LoaderConfig
from pipelines.epoch_plan import MAX_EPOCH
from tests.utils import make

BACKENDS = ["dali", "pinned", "pageable"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    from data_gen.generate import GenConfig, generate

    out = tmp_path_factory.mktemp("epochs")
    generate(GenConfig(out=str(out), num_images=6, classes=2, seed=1, width_range=(24, 32),
                       workers=1), progress=False)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_serves_the_same_epochs_and_refuses_the_rest_naming_epoch(backend, root):
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    cfg = LoaderConfig(root=root, batch_size=4, device="cpu", augment=AugmentSpec(size=8),
                       num_workers=1 if backend == "dali" else 0, debug_indices=True)
    with make(backend, cfg) as ld:
        for e in (0, 2**31, MAX_EPOCH - 1, np.int64(MAX_EPOCH - 1)):
            ld.set_epoch(e)
            assert sum(len(y) for _, y in ld) == 6, (backend, e)
        state = ld.state_dict()
        for bad in (MAX_EPOCH, 2**63 - 1, -1, 1.0, True):
            with pytest.raises(ValueError, match="epoch") as e:
                ld.set_epoch(bad)
            assert "\n" not in str(e.value)
            with pytest.raises(ValueError, match="epoch"):
                ld.load_state_dict({**state, "epoch": bad})
            with pytest.raises(ValueError, match="epoch"):
                ld.set_resolution(8, epoch=bad)
        assert ld.epoch == MAX_EPOCH - 1 and ld.state_dict() == state
        ld.load_state_dict({**state, "epoch": MAX_EPOCH - 1, "batches": 1})
        assert sum(len(y) for _, y in ld) == 2, backend
