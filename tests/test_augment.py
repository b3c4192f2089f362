import numpy as np
import torch
from PIL import Image

from pipelines import AugmentSpec


def _img(w=120, h=90):
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8))


def test_train_transform_gives_uint8_chw_of_size():
    t = AugmentSpec(size=64).to_torchvision()
    out = t(_img())
    assert out.dtype == torch.uint8 and out.shape == (3, 64, 64)


def test_eval_transform_is_deterministic_resize_then_centre_crop():
    spec = AugmentSpec(mode="eval", size=32, resize_size=40)
    a, b = spec.to_torchvision()(_img()), spec.to_torchvision()(_img())
    assert torch.equal(a, b) and a.shape == (3, 32, 32)


def test_normalize_option_gives_float_normalised():
    spec = AugmentSpec(mode="eval", size=32)
    x = spec.to_torchvision(normalize=True)(Image.new("RGB", (50, 50), (124, 116, 104)))
    assert x.dtype == torch.float32
    expect = (torch.tensor([124, 116, 104]) / 255 - torch.tensor(spec.mean)) / torch.tensor(spec.std)
    assert torch.allclose(x[:, 5, 5], expect, atol=1e-6)


def test_flip_probability_is_used():
    img = Image.fromarray(np.tile(np.arange(64, dtype=np.uint8)[None, :, None], (64, 1, 3)))
    never = AugmentSpec(size=64, scale=(1, 1), ratio=(1, 1), flip_p=0.0).to_torchvision()
    always = AugmentSpec(size=64, scale=(1, 1), ratio=(1, 1), flip_p=1.0).to_torchvision()
    assert never(img)[0, 0, 0] < never(img)[0, 0, -1]
    assert always(img)[0, 0, 0] > always(img)[0, 0, -1]
