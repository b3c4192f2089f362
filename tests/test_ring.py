"""``PinnedRing`` slot logic on the CPU (fake events); the CUDA behaviour is in test_gpu_torch."""
import pytest
import torch

from pipelines import LoaderConfig, PinMode, TorchOptions
from pipelines.torch_backend.ring import PinnedRing


class FakeEvent:
    log = []

    def __init__(self):
        self.id = sum(op == "new" for op, _ in FakeEvent.log)
        FakeEvent.log.append(("new", self.id))

    def record(self, stream=None):
        FakeEvent.log.append(("record", self.id))

    def synchronize(self):
        FakeEvent.log.append(("sync", self.id))


def _batch(n, v):
    return torch.full((n, 3, 4, 4), v, dtype=torch.uint8), torch.arange(n) + v


def test_slots_are_reused_round_robin_only_after_their_event():
    FakeEvent.log = []
    ring = PinnedRing(3, pin_memory=False, new_event=FakeEvent)
    views = []
    for v in range(5):
        x, y = ring.stage(*_batch(8, v))
        views.append(x.data_ptr())
        assert torch.equal(x, _batch(8, v)[0]) and torch.equal(y, _batch(8, v)[1])
        ring.guard()
    assert views[3] == views[0] and views[4] == views[1]      # 3 slots, reused in order
    assert len({views[0], views[1], views[2]}) == 3
    assert ring.allocations == 6                                # images + labels per slot, once
    syncs = [i for op, i in FakeEvent.log if op == "sync"]
    assert syncs == [0, 1]      # batch 3 waited for batch 0's copy, batch 4 for batch 1's


def test_partial_batch_uses_a_view_and_a_new_shape_reallocates():
    ring = PinnedRing(2, pin_memory=False, new_event=FakeEvent)
    ring.stage(*_batch(8, 1))
    ring.guard()
    ring.stage(*_batch(8, 2))
    ring.guard()
    x, y = ring.stage(*_batch(3, 7))                            # short last batch: a view
    ring.guard()
    assert x.shape == (3, 3, 4, 4) and int(x.max()) == 7 and ring.allocations == 4
    x, _ = ring.stage(torch.zeros(2, 3, 5, 5, dtype=torch.uint8), torch.arange(2))
    assert x.shape == (2, 3, 5, 5) and ring.allocations == 5   # new image shape -> new buffer


def test_ring_needs_two_slots_and_pin_mode_is_validated():
    with pytest.raises(ValueError, match="slots"):
        PinnedRing(1, pin_memory=False)
    assert TorchOptions(pin_mode="ring").pin_mode is PinMode.RING
    with pytest.raises(ValueError, match="pin_mode='spin' is not valid"):
        TorchOptions(pin_mode="spin")


def test_ring_is_ignored_without_cuda(tiny_root):
    from pipelines import create_loader

    cfg = LoaderConfig(root=tiny_root, batch_size=8, device="cpu", num_workers=0, shuffle=False)
    with create_loader("pinned", cfg, options=TorchOptions(pin_mode="ring")) as ld:
        assert ld.ring is None
        assert sum(len(y) for _, y in ld) == 37
