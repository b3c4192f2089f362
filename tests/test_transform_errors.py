"""An exception from the user's transform is a ``TransformError``, never a bad file (issue 13).

It names the step and its position in the Compose and carries the original error, under both
``on_bad_file`` policies, in both torch backends, from the main process and from DataLoader
workers, and from ``pinned``'s GPU tail; ``stats["bad_files"]`` stays 0.
"""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from pipelines import LoaderConfig, TransformError, create_loader

N, ODD, BATCH = 21, 15, 4       # image 15 is the odd one: batch 3 of 0..5
SHAPES = [(32, 33) if i == ODD else (32, 32) for i in range(N)]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    out = tmp_path_factory.mktemp("odd")
    (out / "c").mkdir()
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate(SHAPES):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
        (out / "c" / f"{i:02d}.jpg").write_bytes(buf.getvalue())
    return out


def refuse_odd_width(x):
    if x.shape[-1] % 2:
        raise ValueError(f"odd width {x.shape[-1]}")
    return x


def compose():
    return v2.Compose([v2.ToImage(), v2.Lambda(refuse_odd_width), v2.CenterCrop(16),
                       v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.2] * 3)])


def _cfg(root, **kw):
    kw = {"batch_size": BATCH, "device": "cpu", "num_workers": 0, "shuffle": False,
          "transform": compose(), **kw}
    return LoaderConfig(root=root, **kw)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("policy", ["error", "skip"])
@pytest.mark.parametrize("backend", ["pageable", "pinned"])
def test_a_raising_transform_is_a_transform_error_at_its_batch(root, backend, policy, workers):
    seen = 0
    with create_loader(backend, _cfg(root, on_bad_file=policy, num_workers=workers)) as ld:
        with pytest.raises(TransformError) as e:
            for _ in ld:
                seen += 1
        assert ld.stats["bad_files"] == 0 and ld.stats["bad"] == []
    msg = str(e.value)
    assert "#1 Lambda" in msg and "ValueError: odd width 33" in msg and "15.jpg" in msg, msg
    assert isinstance(e.value, RuntimeError)
    assert seen == ODD // BATCH  # the batches before the odd image's arrived, in order


@pytest.mark.parametrize("backend", ["pageable", "pinned"])
def test_a_transform_failing_on_the_first_files_fails_the_constructor(tmp_path, root, backend):
    """The loader measures its first outputs when it is built, so the error comes from there."""
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "0.jpg").write_bytes((root / "c" / f"{ODD:02d}.jpg").read_bytes())
    with pytest.raises(TransformError, match="#1 Lambda raised ValueError: odd width 33"):
        create_loader(backend, _cfg(tmp_path, on_bad_file="skip"))


class Normalize(v2.Normalize):
    """A user's Normalize subclass (same name, so ``pinned`` runs it in its batch tail) that
    fails on the last, short batch."""

    def forward(self, x):
        if x.ndim == 4 and x.shape[0] != BATCH:
            raise RuntimeError(f"short batch of {x.shape[0]}")
        return super().forward(x)


def _tail_cfg(root, device):
    t = v2.Compose([v2.CenterCrop(16), v2.ToDtype(torch.float32, scale=True),
                    Normalize([0.5] * 3, [0.2] * 3)])
    return _cfg(root, transform=t, device=device, on_bad_file="skip")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_an_error_in_pinneds_batch_tail_is_a_transform_error_at_its_batch(root, device):
    seen = 0
    with create_loader("pinned", _tail_cfg(root, device)) as ld:
        assert [type(t).__name__ for t in ld.transform_plan.tail.transforms] == ["ToDtype", "Normalize"]
        with pytest.raises(TransformError) as e:
            for _ in ld:
                seen += 1
        assert ld.stats["bad_files"] == 0
    assert "#2 Normalize raised RuntimeError: short batch of 1" in str(e.value), str(e.value)
    assert seen == N // BATCH  # held by the prefetcher until the consumer reaches that batch


def test_the_message_survives_a_dataloader_worker():
    """DataLoader rebuilds a worker's exception from its class and one message string."""
    from torch._utils import ExceptionWrapper

    try:
        raise TransformError("transform #1 Lambda raised ValueError: odd width 33 on x.jpg")
    except TransformError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(TransformError, match="#1 Lambda raised ValueError: odd width 33"):
        wrapped.reraise()
