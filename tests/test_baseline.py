"""``pageable`` is the plain ``ImageFolder`` + PIL recipe (``compare.reference``): no more work per
batch or per sample than that recipe, so the speed-ups measured against it are not inflated."""
import pytest
import torch

from compare.reference import ImageFolderReference
from pipelines import AugmentSpec, LoaderConfig, create_loader


def _cfg(root, **kw):
    base = dict(root=root, batch_size=8, device="cpu", num_workers=1, augment=AugmentSpec(size=32),
                dtype="float32")
    base.update(kw)
    return LoaderConfig(**base)


def _tensors(item) -> int:
    """Tensors in one item a DataLoader worker handed over: each is a shared-memory file."""
    if isinstance(item, torch.Tensor):
        return 1
    if isinstance(item, (list, tuple)):
        return sum(_tensors(x) for x in item)
    return 0


def _first(dataloader):
    it = iter(dataloader)
    try:
        return next(it)
    finally:
        it._shutdown_workers()


@pytest.mark.parametrize("target", ["class", "none"])
def test_a_worker_hands_over_as_many_tensors_as_the_plain_recipe(tiny_root, target):
    """Regression: the batch's dataset indices travelled as a third tensor, and each tensor a
    worker returns is one more shared-memory file, descriptor and socket round trip per batch
    than ``ImageFolder``'s recipe makes (images, labels)."""
    with ImageFolderReference(_cfg(tiny_root)) as ref:
        plain = _tensors(_first(ref.loader))
    with create_loader("pageable", _cfg(tiny_root, target=target, debug_indices=True)) as ld:
        ours = _tensors(_first(ld.loader))
        assert sum(len(b.images) for b in ld) == 37
        assert sorted(ld.last_indices.tolist()) == list(range(37))  # the indices still come
    assert plain == ours == 2


def test_the_indices_of_a_batch_with_a_bad_file_name_the_sample_that_replaced_it(tmp_path):
    """The indices, collated without a tensor, still follow ``Bad`` replacement."""
    import numpy as np

    from pipelines.torch_backend.dataset import Bad, collate_skipping

    img = torch.zeros(3, 2, 2)
    images, labels, idx, bad = collate_skipping([(img, 0, 4), Bad("x.jpg", "empty"), (img, 1, 9)])
    assert isinstance(idx, np.ndarray) and idx.dtype == np.int64
    assert idx.tolist() == [4, 9, 9] and labels.tolist() == [0, 1, 1] and bad == [("x.jpg", "empty")]
    assert not isinstance(idx, torch.Tensor) and images.shape == (3, 3, 2, 2)
