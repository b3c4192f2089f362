"""GPU tests for the torch backends (run on the H200 through the device tool)."""
import pytest
import torch
from utils import make

from pipelines import AugmentSpec, LoaderConfig

pytestmark = pytest.mark.cuda


def _cfg(root, **kw):
    base = dict(root=root, batch_size=64, device="cuda", num_workers=4, augment=AugmentSpec(size=224))
    base.update(kw)
    return LoaderConfig(**base)


@pytest.mark.parametrize("streams", [0, 1, 2])
def test_eval_pinned_equals_pageable_bit_for_bit(gpu_root, streams):
    """Same decoder, same pixels: pinning and the side streams change nothing.

    ``pinned`` decodes with torchvision by default and ``pageable`` with PIL (TorchOptions.
    decoder), so the bit-for-bit check names the PIL decoder; the default is compared with PIL
    in the next test."""
    spec = AugmentSpec(mode="eval", size=224)
    outs = {}
    for b in ("pageable", "pinned"):
        cfg = _cfg(gpu_root, augment=spec, shuffle=False)
        opts = {"streams": streams, "decoder": "pil"} if b == "pinned" else {}
        with make(b, cfg, **opts) as ld:
            outs[b] = [(x.cpu(), y.cpu()) for x, y in ld]
    assert len(outs["pageable"]) == len(outs["pinned"]) == 8
    for (xa, ya), (xb, yb) in zip(outs["pageable"], outs["pinned"]):
        assert torch.equal(ya, yb)
        assert torch.equal(xa, xb)


def test_eval_pinned_default_decoder_is_close_to_pil(gpu_root):
    """torchvision's decoder and v2 on a tensor against PIL's: the bound of the CPU test
    ``test_decoders_agree_and_the_scaled_one_reduces`` (about 3 uint8 levels)."""
    spec = AugmentSpec(mode="eval", size=224)
    outs = {}
    for b in ("pageable", "pinned"):
        with make(b, _cfg(gpu_root, augment=spec, shuffle=False)) as ld:
            outs[b] = [x.cpu() for x, _ in ld]
    worst = max((a - b).abs().max().item() for a, b in zip(outs["pageable"], outs["pinned"]))
    assert 0 < worst < 0.05, worst  # not 0: pinned's default decoder is not PIL


@pytest.mark.parametrize("streams, depth", [(1, 1), (1, 2), (2, 4)])
def test_async_equals_sync_with_a_slow_consumer(gpu_root, streams, depth):
    """A long kernel before every read: a stream race or early buffer reuse changes the sums."""
    cfg = _cfg(gpu_root, seed=5, dtype="bfloat16", channels_last=True)
    with make("pinned", cfg, streams=0) as ref_loader:
        ref = [x.double().sum().item() for x, _ in ref_loader]
    sums = []
    with make("pinned", cfg, streams=streams, queue_depth=depth) as loader:
        for x, y in loader:
            torch.cuda._sleep(20_000_000)      # ~10 ms of GPU time queued before we read x
            sums.append(x.double().sum())      # queued behind the sleep
            del x, y                           # memory freed while the read is still queued
    torch.cuda.synchronize()
    assert [s.item() for s in sums] == ref


def test_first_batch_is_not_lost_and_labels_follow_images(gpu_root):
    cfg = _cfg(gpu_root, shuffle=False, debug_indices=True)
    with make("pinned", cfg, streams=2, queue_depth=3) as loader:
        ys = [y.cpu() for _, y in loader]
        assert len(ys) == len(loader) == 8
        assert sorted(loader.last_indices.tolist()) == list(range(512))
        assert loader.loader.pin_memory is True  # DataLoader's pin thread pins the batches
