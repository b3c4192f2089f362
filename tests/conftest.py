"""Shared fixtures: small generated datasets, and the cuda / dali markers."""
from __future__ import annotations

import pytest
import torch

from data_gen.generate import GenConfig, generate
from pipelines import dali_available


def pytest_collection_modifyitems(config, items):
    no_cuda = pytest.mark.skip(reason="needs CUDA")
    no_dali = pytest.mark.skip(reason="needs nvidia-dali (pip install '.[dali]')")
    for item in items:
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_cuda)
        if "dali" in item.keywords and not dali_available():
            item.add_marker(no_dali)


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory):
    """37 small JPEGs in 3 classes (an odd count, so last-batch policies differ)."""
    out = tmp_path_factory.mktemp("tiny")
    generate(GenConfig(out=str(out), num_images=37, classes=3, seed=7, width_range=(48, 96),
                       workers=1), progress=False)
    return out


@pytest.fixture(scope="session")
def wds(tmp_path_factory):
    """``tiny_root``'s images (the same GenConfig) as 5 tar shards of 8, 8, 8, 8 and 5."""
    out = tmp_path_factory.mktemp("wds")
    generate(GenConfig(out=str(out), num_images=37, classes=3, seed=7, width_range=(48, 96),
                       workers=1, layout="wds", shard_size=8), progress=False)
    return out


@pytest.fixture(scope="session")
def gpu_root(tmp_path_factory):
    """A larger set with ImageNet-like sizes for GPU tests."""
    out = tmp_path_factory.mktemp("gpu")
    generate(GenConfig(out=str(out), num_images=512, classes=8, seed=3), progress=False)
    return out


@pytest.fixture(scope="session", autouse=True)
def _listing_cache(tmp_path_factory):
    """Keep the tests' listing cache (``pipelines.sources.cache``) and DALI calibration cache
    (``pipelines.dali.calibrate``) out of the user's cache."""
    import os

    os.environ.setdefault("GPU_FEED_LISTING_CACHE", str(tmp_path_factory.mktemp("listings")))
    os.environ.setdefault("GPU_FEED_CALIBRATION_CACHE",
                          str(tmp_path_factory.mktemp("calibration") / "dali-calibration.json"))
