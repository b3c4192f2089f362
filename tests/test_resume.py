"""``state_dict`` / ``load_state_dict`` on every backend (``pipelines.loader`` NOTE [resume])."""
from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
import torch

from pipelines import AugmentSpec, LoaderConfig, create_loader
from tests.utils import broken_huffman, make

BACKENDS = ["dali", "pinned", "pageable"]
EXACT_PIXELS = {"pinned", "pageable", "dali"}  # every draw keyed by (seed, epoch, index)


def _cfg(root, **kw):
    base = dict(root=root, batch_size=4, device="cpu", num_workers=2, debug_indices=True,
                augment=AugmentSpec(size=32), seed=9)
    base.update(kw)
    return LoaderConfig(**base)


def _batches(loader):
    out = []
    for x, y in loader:
        out.append((x.clone(), y.clone(), loader.position[1]))
    return out


def _state_after(backend, cfg, k, epoch=0, **options):
    """The state of a loader that handed out ``k`` batches of ``epoch`` and was left there."""
    with make(backend, cfg, **options) as a:
        a.set_epoch(epoch)
        it = iter(a)
        for _ in range(k):
            next(it)
        state = a.state_dict()
        it.close()
    return state


def _same(backend, a, b):
    assert len(a) == len(b)
    for (xa, ya, _), (xb, yb, _) in zip(a, b):
        assert torch.equal(ya, yb)
        if backend in EXACT_PIXELS:
            assert torch.equal(xa, xb)
        else:
            assert xa.shape == xb.shape


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_after_k_batches_yields_the_rest_of_an_uninterrupted_run(backend, tiny_root):
    cfg = _cfg(tiny_root)
    with create_loader(backend, cfg) as ref:
        n = len(ref)
        ref.set_epoch(1)
        full = _batches(ref)
        full_idx = ref.last_indices.copy()
    for k in (0, 1, n // 2, n):
        state = _state_after(backend, cfg, k, epoch=1)
        assert state["epoch"] == 1 and state["batches"] == k
        state = json.loads(json.dumps(state))  # plain: JSON holds it
        with create_loader(backend, cfg) as b:
            b.load_state_dict(state)
            assert b.epoch == 1
            rest = _batches(b)
            assert np.array_equal(b.last_indices, full_idx[k * 4:]), (backend, k)
        _same(backend, full[k:], rest)


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_across_an_epoch_boundary_and_torch_save(backend, tiny_root):
    cfg = _cfg(tiny_root)
    with create_loader(backend, cfg) as ref:  # uninterrupted: epoch 1, then epoch 2
        ref.set_epoch(1)
        _batches(ref)
        ref.set_epoch(2)
        want = _batches(ref)
    with create_loader(backend, cfg) as a:
        a.set_epoch(1)
        _batches(a)  # epoch 1 read whole
        done = a.state_dict()
        a.set_epoch(2)  # the loop moved on, nothing read yet
        moved = a.state_dict()
    assert (done["epoch"], done["batches"]) == (1, len(a))
    assert (moved["epoch"], moved["batches"]) == (2, 0)
    buf = io.BytesIO()
    torch.save(done, buf)
    with create_loader(backend, cfg) as b:
        b.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
        assert _batches(b) == []  # epoch 1 had nothing left
        b.set_epoch(2)
        _same(backend, want, _batches(b))


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_on_rank_1_of_2_and_with_skipped_bad_files(backend, tiny_root, tmp_path):
    root = tmp_path / "bad"
    shutil.copytree(tiny_root, root)
    victim = sorted(root.glob("class_0001/*.jpg"))[2]
    victim.write_bytes(broken_huffman(victim.read_bytes()))
    cfg = _cfg(root, rank=1, world_size=2, on_bad_file="skip", shuffle=False)
    with create_loader(backend, cfg) as ref:
        full = _batches(ref)
        full_idx, bad_total = ref.last_indices.copy(), ref.stats["bad_files"]
    assert bad_total == 1
    k = 2
    state = _state_after(backend, cfg, k)
    with create_loader(backend, cfg) as b:
        b.load_state_dict(state)
        rest = _batches(b)
        assert np.array_equal(b.last_indices, full_idx[k * 4:])
    _same(backend, full[k:], rest)


def test_the_same_dataset_mounted_elsewhere_resumes(tiny_root, tmp_path):
    moved = tmp_path / "elsewhere"
    shutil.copytree(tiny_root, moved)
    state = _state_after("pageable", _cfg(tiny_root), 3)
    with create_loader("pageable", _cfg(moved)) as b:
        b.load_state_dict(state)
        assert b.position == (0, 0) and b.state_dict()["batches"] == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_state_of_another_plan_is_refused_naming_what_differs(backend, tiny_root, tmp_path):
    with create_loader(backend, _cfg(tiny_root)) as a:
        state = a.state_dict()
    other = tmp_path / "other"
    shutil.copytree(tiny_root, other)
    next(other.glob("class_0000/*.jpg")).unlink()
    cases = [(_cfg(other), "dataset differs"),
             (_cfg(tiny_root, rank=0, world_size=2), "world_size differs"),
             (_cfg(tiny_root, batch_size=5), "batch_size differs"),
             (_cfg(tiny_root, seed=10), "seed differs")]
    for cfg, match in cases:
        with create_loader(backend, cfg) as b, pytest.raises(ValueError, match=match):
            b.load_state_dict(state)
    with create_loader(backend, _cfg(tiny_root)) as b:
        with pytest.raises(ValueError, match="the state has no .version. field"):
            b.load_state_dict({"epoch": 0})
        with pytest.raises(ValueError, match=r"batches=99 must be an int in \[0, len\(\)="):
            b.load_state_dict({**state, "batches": 99})


@pytest.mark.parametrize("backend", ["pinned", "pageable"])
def test_a_resumed_epoch_does_not_decode_the_batches_it_skips(backend, tiny_root, monkeypatch):
    from pipelines.torch_backend import dataset

    calls = []
    orig = dataset.JpegDataset.__getitem__
    monkeypatch.setattr(dataset.JpegDataset, "__getitem__",
                        lambda self, key: calls.append(key) or orig(self, key))
    cfg = _cfg(tiny_root, num_workers=0)
    with create_loader(backend, cfg) as a:
        state = {**a.state_dict(), "batches": len(a) - 2}
        calls.clear()
        a.load_state_dict(state)
        assert len(_batches(a)) == 2
    assert len(calls) <= 2 * 4 and all(e == 0 for e, _ in calls)


def test_a_resumed_dali_epoch_feeds_only_the_batches_it_yields(tiny_root):
    pytest.importorskip("nvidia.dali")
    from pipelines import DaliOptions

    cfg = _cfg(tiny_root)
    with create_loader("dali", cfg, options=DaliOptions(run_on=False)) as a:
        state = {**a.state_dict(), "batches": len(a) - 2}
        a.load_state_dict(state)
        assert len(_batches(a)) == 2
        assert a.source.samples_read <= 2 * 4
    with create_loader("dali", cfg) as a:  # and what it runs on into the next epoch (NOTE
        a.load_state_dict(state)            # [running on]): at most the queue and the feed's one
        assert len(_batches(a)) == 2
        assert a.source.samples_read <= 2 * 4 + (a.options.queue_depth + 1) * 4


def test_dali_with_two_pipelines_resumes_exactly_at_every_position(tiny_root):
    pytest.importorskip("nvidia.dali")
    from pipelines import DaliOptions

    cfg = _cfg(tiny_root)
    opt = DaliOptions(pipelines=2)
    with create_loader("dali", cfg, options=opt) as ref:
        n = len(ref)
        full = _batches(ref)
        full_idx = ref.last_indices.copy()
    for k in (1, 2, n - 1, n):
        state = _state_after("dali", cfg, k, pipelines=2)
        assert "dali" not in state  # the position only (pipelines.transforms.draws NOTE [one plan])
        with create_loader("dali", cfg, options=opt) as b:
            b.load_state_dict(state)
            rest = _batches(b)
            assert np.array_equal(b.last_indices, full_idx[k * 4:]), k
        _same("dali", full[k:], rest)
    with create_loader("dali", cfg) as one:  # another pipeline count: the same batches
        one.load_state_dict(state)
        _same("dali", full[n:], _batches(one))


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["dali", "pinned"])
def test_resume_on_the_gpu_is_exact(backend, gpu_root):
    """On CUDA: pinned (CPU decode, GPU normalise) and DALI (nvJPEG decode, GPU augmentation,
    its draws fed per sample) resume with identical pixels."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    cfg = _cfg(gpu_root, device="cuda", batch_size=32, augment=AugmentSpec(size=224),
               num_workers=4)
    with create_loader(backend, cfg) as ref:
        ref.set_epoch(1)
        full = _batches(ref)
    k = len(full) // 2
    state = _state_after(backend, cfg, k, epoch=1)
    with create_loader(backend, cfg) as b:
        b.load_state_dict(state)
        rest = _batches(b)
    assert len(rest) == len(full) - k
    for (xa, ya, _), (xb, yb, _) in zip(full[k:], rest):
        assert torch.equal(ya, yb)
        assert torch.equal(xa, xb), float((xa - xb).abs().max())
