"""``LoaderConfig(dtype="uint8")``: the crop's pixels, not normalised, on every backend (CPU)."""
import pytest
import torch
from torchvision.transforms import v2

from pipelines import AugmentSpec, LoaderConfig, create_loader
from pipelines.transforms.mix import MixSpec

BACKENDS = ["pageable", "pinned", pytest.param("dali", marks=pytest.mark.dali)]
SPEC = AugmentSpec(mode="train", size=24, mean=(0.4, 0.5, 0.6), std=(0.2, 0.25, 0.3))


def _batches(root, backend, **kw):
    cfg = LoaderConfig(root=root, batch_size=8, augment=SPEC, device="cpu", num_workers=0,
                       shuffle=False, **kw)
    with create_loader(backend, cfg) as ld:
        return [x for x, _ in ld]


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_uint8_is_the_float_output_unnormalised(tiny_root, backend, channels_last):
    """The same crops (same seed) as float32, un-normalised and rounded: equal up to the
    rounding of the normalisation (pixels are integers, so within half a level)."""
    ints = _batches(tiny_root, backend, dtype="uint8", channels_last=channels_last)
    floats = _batches(tiny_root, backend, dtype="float32", channels_last=channels_last)
    assert len(ints) == len(floats) == 5
    mean = torch.tensor(SPEC.mean).view(1, 3, 1, 1)
    std = torch.tensor(SPEC.std).view(1, 3, 1, 1)
    for x, f in zip(ints, floats):
        assert x.dtype == torch.uint8 and x.shape == f.shape and x.shape[1:] == (3, 24, 24)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        assert x.is_contiguous(memory_format=fmt)
        back = (f.float() * std + mean) * 255
        assert (back - x.float()).abs().max() < 0.51, backend
        assert x.float().std() > 20  # real pixels, not zeros or a constant


@pytest.mark.parametrize("backend", BACKENDS)
def test_uint8_with_a_uint8_transform_keeps_its_pixels(tiny_root, backend):
    """A transform with no float step: its uint8 output as it is (no cast to 0.0..255.0)."""
    t = v2.Compose([v2.Resize(24, antialias=True), v2.CenterCrop(24), v2.PILToTensor()])
    (x, *_) = _batches(tiny_root, backend, dtype="uint8", transform=t)
    (f, *_) = _batches(tiny_root, backend, dtype="float32", transform=t)
    assert x.dtype == torch.uint8 and torch.equal(x.float(), f)


def test_uint8_refuses_mix_and_a_float_transform(tiny_root):
    with pytest.raises(ValueError, match=r"mix.*dtype='uint8'"):
        LoaderConfig(root=tiny_root, dtype="uint8", mix=MixSpec(mixup_alpha=0.2))
    t = v2.Compose([v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True),
                    v2.Normalize([0.5] * 3, [0.5] * 3)])
    with pytest.raises(ValueError, match=r"ToDtype gives torch.float32.*dtype='uint8'") as e:
        LoaderConfig(root=tiny_root, dtype="uint8", transform=t)
    assert "\n" not in str(e.value)
    assert LoaderConfig(root=tiny_root, dtype="uint8").dtype.torch is torch.uint8
