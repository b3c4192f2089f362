"""Torch-backend specifics: worker errors, CPU fallback, reproducible augmentation, lifecycle."""
import shutil
import warnings

import pytest
import torch
from utils import make

from pipelines import AugmentSpec, LoaderConfig, create_loader


def _cfg(root, **kw):
    base = dict(root=root, batch_size=8, device="cpu", num_workers=0, augment=AugmentSpec(size=32))
    base.update(kw)
    return LoaderConfig(**base)


@pytest.mark.parametrize("backend", ["pageable", "pinned"])
def test_worker_error_reaches_caller_with_file_name(backend, tiny_root, tmp_path):
    root = tmp_path / "r"
    shutil.copytree(tiny_root, root)
    bad = sorted(root.glob("class_0000/*.jpg"))[0]
    bad.write_bytes(b"not a jpeg at all")
    with create_loader(backend, _cfg(root, num_workers=2, shuffle=False)) as loader:
        with pytest.raises(Exception, match=bad.name):
            for _ in loader:
                pass


def test_pinned_without_cuda_warns_once_and_runs(tiny_root, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        loader = create_loader("pinned", _cfg(tiny_root, device="cuda"))
        x, _ = next(iter(loader))
        loader.close()
    assert x.device.type == "cpu"
    assert sum("CUDA is not available" in str(m.message) for m in w) == 1


def test_augmentation_does_not_depend_on_worker_count(tiny_root):
    outs = []
    for nw in (0, 3):
        with create_loader("pinned", _cfg(tiny_root, num_workers=nw)) as loader:
            loader.set_epoch(4)
            outs.append(torch.cat([x for x, _ in loader]))
    assert torch.equal(outs[0], outs[1])


def test_train_augmentation_changes_between_epochs(tiny_root):
    with create_loader("pinned", _cfg(tiny_root, shuffle=False)) as loader:
        loader.set_epoch(0)
        a = torch.cat([x for x, _ in loader])
        loader.set_epoch(1)
        b = torch.cat([x for x, _ in loader])
    assert not torch.equal(a, b)


@pytest.mark.parametrize("decoder", ["pil", "torchvision"])
def test_eval_pinned_equals_pageable_bit_for_bit_on_cpu(tiny_root, decoder):
    """With the same decoder the two torch backends compute the same pixels."""
    spec = AugmentSpec(mode="eval", size=32, resize_size=40)
    outs = {}
    for b in ("pageable", "pinned"):
        with make(b, _cfg(tiny_root, augment=spec, shuffle=False), decoder=decoder) as loader:
            outs[b] = torch.cat([x for x, _ in loader])
    assert torch.equal(outs["pageable"], outs["pinned"])


def test_the_baseline_decodes_as_imagefolder_and_pinned_with_torchvision(tiny_root):
    from pipelines.config import Decoder

    with create_loader("pageable", _cfg(tiny_root)) as a, create_loader("pinned",
                                                                         _cfg(tiny_root)) as b:
        assert a.dataset.decoder is Decoder.PIL and b.dataset.decoder is Decoder.TORCHVISION


def test_close_shuts_persistent_workers_down(tiny_root):
    loader = make("pinned", _cfg(tiny_root, num_workers=2), persistent_workers=True)
    next(iter(loader))
    procs = list(loader.loader._iterator._workers)
    assert procs and all(p.is_alive() for p in procs)
    loader.close()
    for p in procs:
        p.join(timeout=10)
    assert not any(p.is_alive() for p in procs)
