"""The region decoders (``pipelines.torch_backend.region``, ``Decoder.VIPS`` and ``REGION``) on
large photos: torchvision's draws, and the full decode's pixels within the NOTE's bounds."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2
from utils import make

from data_gen.generate import GenConfig, generate
from pipelines import AugmentSpec, LoaderConfig
from pipelines.config import Decoder
from pipelines.torch_backend import region
from pipelines.torch_backend.decode import pil_image, scaled_crop

# the scaled path's own distance from the full decode (tests/test_decode.py's TOL, 0.15 in
# normalised units), in levels of 255: vips decodes the scaled path's pixels
SCALED_TOL = 9


def _needs(decoder: Decoder):
    if not region.available(decoder):
        pytest.skip(f"{region.PACKAGES[decoder]} is not installed (the 'region' extra)")


@pytest.fixture(params=[Decoder.REGION, Decoder.VIPS], ids=lambda d: d.value)
def decoder(request):
    _needs(request.param)
    return request.param


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    """4 data_gen photos 1500-2200 px wide (mixed aspect ratios), as bytes."""
    out = tmp_path_factory.mktemp("large")
    generate(GenConfig(out=str(out), num_images=4, classes=1, seed=11, width_range=(1500, 2200),
                       workers=1), progress=False)
    return [p.read_bytes() for p in sorted(out.rglob("*.jpg"))]


def _smooth(w, h, mode="RGB", **save):
    """A smooth ``w`` x ``h`` JPEG (gradients and a few discs), encoded with ``save``."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    rgb = np.stack([x / w * 255, y / h * 255, 128 + 100 * np.sin(x / 37 + y / 53)], -1)
    for cx, cy, r in ((w / 3, h / 3, h / 5), (2 * w / 3, h / 2, h / 7)):
        rgb[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = (250, 30, 60)
    buf = io.BytesIO()
    Image.fromarray(rgb.clip(0, 255).astype(np.uint8)).convert(mode).save(buf, "JPEG", **save)
    return buf.getvalue()


STEPS = {
    "rrc-square": v2.RandomResizedCrop(224, antialias=True),
    "rrc-wide": v2.RandomResizedCrop((160, 256), antialias=True),
    "rrc-bicubic": v2.RandomResizedCrop(96, antialias=True,
                                        interpolation=v2.InterpolationMode.BICUBIC),
    "eval-resize": v2.Resize(256, antialias=True),
}


def _full(data, t, seed):
    """Torchvision's ``t`` on the full decode, and the generator's next draw after it."""
    torch.manual_seed(seed)
    out = np.asarray(t(pil_image(data))).astype(int)
    return out, torch.rand(1)


def _ours(fn, data, t, seed):
    torch.manual_seed(seed)
    img = fn(data, t)
    assert img is not None
    return np.asarray(img).astype(int), torch.rand(1)


def _check(decoder, data, t, seeds=range(6)):
    """The NOTE's bounds, and the same random numbers drawn as torchvision's ``t``."""
    for seed in seeds:
        ref, after = _full(data, t, seed)
        out, ours_after = _ours(region.CROPS[decoder], data, t, seed)
        assert out.shape == ref.shape
        assert ours_after == after, "a different number of random draws than torchvision's"
        if decoder is Decoder.REGION:  # the crop's pixels decoded, then PIL's resize
            assert np.abs(out - ref).max() <= 1, seed
        else:  # the scaled path's pixels, but the edge by the partial last column or row
            scaled, _ = _ours(scaled_crop, data, t, seed)
            assert np.abs(out - scaled)[:-2, :-2].max() <= 1, seed
            assert np.abs(out - ref).mean() < SCALED_TOL, seed


@pytest.mark.parametrize("steps", list(STEPS))
def test_large_photos_match_the_full_decode_then_the_crop(decoder, large, steps):
    for data in large:
        _check(decoder, data, STEPS[steps])


@pytest.mark.parametrize("kind", ["odd", "greyscale", "progressive", "subsampled-444"])
def test_odd_sizes_greyscale_and_progressive_files_too(decoder, kind):
    data = {
        "odd": lambda: _smooth(1999, 1501),
        "greyscale": lambda: _smooth(1603, 2011, mode="L"),
        "progressive": lambda: _smooth(2017, 1333, progressive=True),
        "subsampled-444": lambda: _smooth(1501, 1777, subsampling=0),
    }[kind]()
    for steps in ("rrc-square", "eval-resize"):
        _check(decoder, data, STEPS[steps], seeds=range(3))


def _exif_rotated():
    buf = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.open(io.BytesIO(_smooth(640, 480))).save(buf, "JPEG", exif=exif)
    return buf.getvalue()


def test_files_it_cannot_take_fall_back_to_the_full_decode(decoder):
    t = STEPS["rrc-square"]
    png = io.BytesIO()
    Image.new("RGB", (640, 480)).save(png, "PNG")
    torch.manual_seed(0)
    first = torch.rand(1)
    for data in (_exif_rotated(), _smooth(640, 480, mode="CMYK"), png.getvalue()):
        torch.manual_seed(0)
        assert region.CROPS[decoder](data, t) is None
        assert torch.rand(1) == first  # no random number drawn: the full path draws them all


def _loader_images(root, backend, decoder, seed=1):
    aug = AugmentSpec(size=64, resize_size=73)
    cfg = LoaderConfig(root=root, batch_size=8, device="cpu", num_workers=0, shuffle=False,
                       seed=seed, augment=aug)
    with make(backend, cfg, decoder=decoder) as ld:
        assert ld.decoder is Decoder(decoder)
        return torch.cat([x for x, _ in ld])


@pytest.fixture(scope="module")
def photo_root(tmp_path_factory):
    out = tmp_path_factory.mktemp("photo_root")
    generate(GenConfig(out=str(out), num_images=8, classes=2, seed=5, width_range=(600, 900),
                       workers=1), progress=False)
    return out


def test_pinned_and_pageable_draw_the_same_crops(decoder, photo_root):
    """Both backends, this decoder: the same crops and flips as the full decode (``pil``)."""
    full = _loader_images(photo_root, "pageable", "pil")
    for backend in ("pinned", "pageable"):
        ours = _loader_images(photo_root, backend, decoder.value)
        d = (ours - full).abs().amax(dim=(1, 2, 3)) if decoder is Decoder.REGION else \
            (ours - full).abs().mean(dim=(1, 2, 3))
        # region: the full decode's pixels (1 level of 255, normalised); vips: the scaled
        # path's distance (tests/test_decode.py's TOL)
        assert d.max() < (0.03 if decoder is Decoder.REGION else 0.15), (backend, d)


def test_a_missing_package_falls_back_to_the_scaled_decode(photo_root, monkeypatch):
    monkeypatch.setattr(region, "available", lambda d: False)
    cfg = LoaderConfig(root=photo_root, batch_size=8, device="cpu", num_workers=0,
                       augment=AugmentSpec(size=64))
    for d in ("vips", "region"):
        with pytest.warns(UserWarning, match=f"decoder='{d}' needs"):
            with make("pinned", cfg, decoder=d) as ld:
                assert ld.decoder is Decoder.SCALED


def test_the_large_photos_tool_prints_one_line_per_candidate(photo_root, capsys):
    from tools import large_photos

    _needs(Decoder.VIPS)
    large_photos.main(["--data", str(photo_root), "--per-image", "--images", "2", "--repeats", "1",
                       "--decoders", "scaled,vips"])
    large_photos.main(["--data", str(photo_root), "--workers", "0", "--batch-size", "4",
                       "--warmup", "1", "--batches", "1", "--repeats", "1", "--device", "cpu",
                       "--decoders", "scaled,vips"])
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == ["scaled", "vips"] * 2, lines
    assert "ms/image" in lines[0] and "img/s" in lines[2]
