"""A size that cannot be served is refused at the call that gives it, naming it (issue 55,
class 6): ``AugmentSpec(size=...)``, ``LoaderConfig(augment=...)`` and ``set_resolution``, on
every backend, before any batch, never blamed on a file at the first batch."""
from __future__ import annotations

import time
import warnings

import pytest

from pipelines import AugmentSpec, LoaderConfig, create_loader
from pipelines.transforms.spec import MAX_SIDE


def test_a_side_beyond_any_jpeg_is_refused_by_augmentspec():
    with pytest.raises(ValueError, match=r"^size=70000: a side over 65535"):
        AugmentSpec(size=70000)
    with pytest.raises(ValueError, match=r"^size=\(224, 70000\)"):
        AugmentSpec(size=(224, 70000))
    with pytest.raises(ValueError, match=r"^resize_size=70000"):
        AugmentSpec(size=224, resize_size=70000)
    assert AugmentSpec(size=MAX_SIDE // 2).hw == (MAX_SIDE // 2, MAX_SIDE // 2)


def test_an_output_larger_than_max_image_pixels_is_refused_by_the_config(tiny_root):
    with pytest.raises(ValueError, match=r"^augment: size=20000 gives 20000 x 20000 output "
                                         r"pixels, more than max_image_pixels"):
        LoaderConfig(root=str(tiny_root), augment=AugmentSpec(size=20000), device="cpu")
    cfg = LoaderConfig(root=str(tiny_root), augment=AugmentSpec(size=100), device="cpu",
                       max_image_pixels=100 * 100)
    assert cfg.augment.hw == (100, 100)


@pytest.mark.parametrize("backend", ["pinned", "pageable", "dali"])
def test_set_resolution_refuses_an_unservable_size_at_the_call(tiny_root, backend):
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    cfg = LoaderConfig(root=str(tiny_root), batch_size=4, augment=AugmentSpec(size=16),
                       device="cpu", num_workers=0 if backend != "dali" else 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no CUDA here: the loader says so once
        with create_loader(backend, cfg) as loader:
            t0 = time.monotonic()
            with pytest.raises(ValueError, match=r"^set_resolution: size=32768: 32768 x 32768 "
                                                 r"output pixels are more than max_image_pixels"):
                loader.set_resolution(2**15)
            with pytest.raises(ValueError, match=r"^set_resolution: size=70000: a side over"):
                loader.set_resolution(70000, epoch=1)
            assert time.monotonic() - t0 < 1.0  # refused at the call, nothing decoded
            assert loader.resolution == (16, 16)  # unchanged
            images, _ = next(iter(loader))
            assert tuple(images.shape[-2:]) == (16, 16)
