"""One augmentation plan: every consumer reads the output size from ``TransformPlan``, also when the
user's Compose gives another size than ``AugmentSpec.size``."""
import warnings

import pytest
import torch
from torchvision.transforms import v2

from pipelines import AugmentSpec, LoaderConfig, create_loader
from pipelines.torch_backend import shm
from pipelines.transforms.plan import TransformPlan


def _compose(size=96):
    return v2.Compose([v2.RandomResizedCrop(size), v2.RandomHorizontalFlip(), v2.ToImage(),
                       v2.ToDtype(torch.float32, scale=True),
                       v2.Normalize([0.5] * 3, [0.25] * 3)])


def test_the_recipe_knows_the_output_of_the_spec_and_of_a_compose():
    spec = AugmentSpec(size=224)
    r = TransformPlan.of(spec)
    assert r.out_size == (224, 224) and r.tail is None
    assert (r.sample_bytes(in_workers="head"), r.sample_bytes(in_workers="full")) == (
        3 * 224 * 224, 3 * 224 * 224 * 4)
    u = TransformPlan.of(spec, LoaderConfig(root="x", transform=_compose(96)).transform)
    assert u.out_size == (96, 96) and [type(t).__name__ for t in u.tail.transforms] == [
        "ToImage", "ToDtype", "Normalize"]
    assert (u.sample_bytes(in_workers="head"), u.sample_bytes(in_workers="full")) == (
        3 * 96 * 96, 3 * 96 * 96 * 4)
    assert u.dali_plan().out_size == (96, 96)
    half = TransformPlan.of(spec, LoaderConfig(root="x", dtype="float16", transform=v2.Compose([
        v2.CenterCrop(64), v2.ToImage(), v2.ToDtype(torch.float16, scale=True)])).transform)
    assert half.sample_bytes(in_workers="full") == 3 * 64 * 64 * 2
    free = TransformPlan.of(spec, LoaderConfig(root="x", transform=v2.Resize(50)).transform)
    assert free.out_size is None and free.sample_bytes(in_workers="full") is None


@pytest.mark.parametrize("backend, per_px", [("pinned", 1), ("pageable", 4)])
def test_shm_fit_and_h2d_bytes_follow_the_transform_not_augment_size(
        tiny_root, monkeypatch, backend, per_px):
    want = 3 * 96 * 96 * per_px
    batch = 8
    # room for (2 workers x prefetch 2 + 2) batches of 96 px, far too little for 224 px ones
    monkeypatch.setattr(shm, "shm_free_bytes", lambda path=shm.SHM_PATH: 8 * batch * want)
    cfg = LoaderConfig(root=tiny_root, batch_size=batch, device="cpu", num_workers=2,
                       augment=AugmentSpec(size=224), transform=_compose(96))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a /dev/shm fallback would warn
        with create_loader(backend, cfg) as ld:
            assert ld.sample_bytes == want
            assert (ld.num_workers, ld.prefetch_factor) == (2, 2)
            ld.on_cuda = True  # the byte count a CUDA run reports (images + int64 labels)
            assert ld.h2d_bytes_per_sample() == want + 8
            ld.on_cuda = False
            x, _ = next(iter(ld))
            assert x.shape[1:] == (3, 96, 96)


def test_an_image_dependent_size_is_measured(tiny_root):
    cfg = LoaderConfig(root=tiny_root, batch_size=1, device="cpu", num_workers=0,
                       transform=v2.Resize(10))
    with create_loader("pageable", cfg) as ld:
        assert ld.transform_plan.out_size is None
        first = [ld.dataset[(0, i)][0] for i in range(3)]  # measured on the first files
        assert ld.sample_bytes == max(x.numel() for x in first) and first[0].shape[1] == 10
