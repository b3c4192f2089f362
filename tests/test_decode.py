"""The torch backends' decoders (``TorchOptions.decoder``): the scaled decode draws
torchvision's crops exactly and stays within a stated distance of the full decode."""
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
from pipelines.torch_backend.decode import _params, first_crop, reduction, scaled_crop
from pipelines.transforms.migrate.run import as_steps

# mean |scaled - full| per image, in normalised units (about 9 of 255 levels). 0.1 held while
# the decode fell short of its reduction (test_the_scaled_decode_reduces_...); at the full
# reduction the worst of these noisy photos passes it, their median stays far below
TOL = 0.15


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """24 JPEGs 600-1000 px wide: large enough for a 64 px crop to decode at 1/2 or less."""
    out = tmp_path_factory.mktemp("photos")
    generate(GenConfig(out=str(out), num_images=24, classes=2, seed=3, width_range=(600, 1000),
                       workers=1), progress=False)
    return out


def _images(root, decoder, seed=1, size=64, mode="train"):
    aug = AugmentSpec(size=size, mode=mode, resize_size=size + size // 7)
    cfg = LoaderConfig(root=root, batch_size=24, device="cpu", num_workers=0, shuffle=False,
                       seed=seed, augment=aug)
    with make("pageable", cfg, decoder=decoder) as ld:
        return torch.cat([x for x, _ in ld])


def test_the_crop_is_drawn_exactly_as_torchvision_draws_it():
    t = v2.RandomResizedCrop(64, antialias=True)
    real = torch.zeros(3, 480, 640, dtype=torch.uint8)
    make_params = getattr(t, "make_params", None) or t._get_params
    for seed in range(300):
        torch.manual_seed(seed)
        ours = _params(t, 480, 640)
        torch.manual_seed(seed)
        assert ours == make_params([real]), seed


@pytest.mark.parametrize("crop, out, k", [
    ((600, 800), (64, 64), 8), ((300, 300), (64, 64), 4), ((200, 500), (64, 64), 2),
    ((100, 900), (64, 64), 1), ((512, 512), (64, 64), 8), ((511, 511), (64, 64), 4),
])
def test_the_largest_reduction_that_still_covers_the_output(crop, out, k):
    assert reduction(*crop, *out) == k


@pytest.fixture(params=["pil", "simplejpeg"])
def library(request, monkeypatch):
    """The scaled decode's library (NOTE [the scaled decode's library]), each in turn."""
    from pipelines.torch_backend import decode

    if request.param == "simplejpeg":
        pytest.importorskip("simplejpeg")
    monkeypatch.setattr(decode, "jpeg_library", lambda: request.param)
    return request.param


def _reductions(monkeypatch, library):
    """Record each reduced decode as ``(k, (width, height), (reduced width, height))``."""
    from PIL import JpegImagePlugin

    from pipelines.torch_backend import decode

    seen, chosen = [], []
    real_reduction = decode.reduction

    def reduction(*a):
        chosen.append(real_reduction(*a))
        return chosen[-1]

    monkeypatch.setattr(decode, "reduction", reduction)
    if library == "pil":
        real_draft = JpegImagePlugin.JpegImageFile.draft

        def draft(im, *a, **k):
            size = im.size
            out = real_draft(im, *a, **k)
            seen.append((chosen[-1], size, im.size))
            return out

        monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", draft)
    else:
        real_rgb = decode._reduced_rgb

        def reduced_rgb(data, width, height, k):
            rgb = real_rgb(data, width, height, k)
            if k > 1:
                seen.append((k, (width, height), (rgb.shape[1], rgb.shape[0])))
            return rgb

        monkeypatch.setattr(decode, "_reduced_rgb", reduced_rgb)
    return seen


def test_scaled_is_close_to_the_full_decode_and_a_wrong_seed_is_not(photos, library):
    full, scaled = _images(photos, "pil"), _images(photos, "scaled")
    d = (scaled - full).abs().mean(dim=(1, 2, 3))
    assert d.max() < TOL, d
    other = (_images(photos, "pil", seed=2) - full).abs().mean(dim=(1, 2, 3))
    assert other.median() > 3 * TOL  # another seed's crops (and flips) are far away


def test_decoders_agree_and_the_scaled_one_reduces(photos, monkeypatch, library):
    from pipelines.torch_backend import decode

    seen = _reductions(monkeypatch, library)
    _images(photos, "scaled")
    assert len(seen) >= 12  # most 64 px crops of these photos decode at 1/2 or less
    tv, pil = _images(photos, "torchvision"), _images(photos, "pil")
    assert (tv - pil).abs().max() < 0.05  # the same libjpeg, v2 on a tensor vs on PIL
    assert decode.first_crop(as_steps(v2.Compose([v2.CenterCrop(8)]))) is None


def test_the_scaled_decode_reduces_by_the_chosen_factor_exactly(photos, monkeypatch, library):
    """Regression: PIL reduces by the largest of 8, 4, 2 within ``size // request``, so asking
    for the ceiling of ``size / k`` decoded most photos whose side ``k`` does not divide at
    half the reduction (at 1/2 for 1/4, and in full for 1/2): most crops of large photos
    (scaled-fix-ab, in the git history of docs/results/cpu). Every decode must now come out at
    ``ceil(size / k)`` for the ``k`` chosen."""
    seen = _reductions(monkeypatch, library)
    _images(photos, "scaled")
    _images(photos, "scaled", mode="eval")
    assert len(seen) >= 30
    assert any(w % k or h % k for k, (w, h), _ in seen)  # the old fault's case
    for k, (w, h), got in seen:
        assert got == (-(-w // k), -(-h // k)), (k, (w, h), got)


def test_the_two_libraries_give_the_same_pixels(photos, monkeypatch):
    """simplejpeg and PIL run the same scaled IDCT; only the resize of a crop of the decode
    (its region and the filter's margin) instead of the whole differs, by rounding."""
    pytest.importorskip("simplejpeg")
    from pipelines.torch_backend import decode

    out = {}
    for lib in decode.LIBRARIES:
        monkeypatch.setattr(decode, "jpeg_library", lambda lib=lib: lib)
        out[lib] = [_images(photos, "scaled", mode=m) for m in ("train", "eval")]
    for a, b in zip(out["pil"], out["simplejpeg"]):
        assert (a - b).abs().max() < 5 / 255 / 0.2  # within 5 of 255 levels
        assert (a - b).abs().mean() < 0.2 / 255 / 0.2
    t = v2.RandomResizedCrop(32, antialias=True)
    for mode in ("L", "RGB"):  # greyscale too: both turn it into RGB
        got = []
        for lib in decode.LIBRARIES:
            torch.manual_seed(0)
            got.append(np.asarray(scaled_crop(_jpeg(mode=mode), t, library=lib), dtype=int))
        assert got[0].shape == got[1].shape == (32, 32, 3)
        assert np.abs(got[0] - got[1]).max() <= 4
    with pytest.raises(ValueError, match="library='turbo'"):
        scaled_crop(_jpeg(), v2.RandomResizedCrop(32, antialias=True), library="turbo")


def test_the_eval_resize_is_scaled_too_and_close_to_the_full_decode(photos, monkeypatch, library):
    """Issue 20: Resize + CenterCrop (eval) through the scaled decode: the same output size as
    ``Resize`` computes, a reduced decode, pixels within the train path's tolerance; a wrong
    output size (the reduced image's own aspect) would shift the centre crop."""
    seen = _reductions(monkeypatch, library)
    scaled = _images(photos, "scaled", mode="eval")
    assert len(seen) == 24  # 600-1000 px photos, resized to 73: every one decodes reduced
    full = _images(photos, "pil", mode="eval")
    assert scaled.shape == full.shape == (24, 3, 64, 64)
    d = (scaled - full).abs().mean(dim=(1, 2, 3))
    assert d.max() < TOL, d
    shifted = (torch.roll(full, 3, dims=3) - full).abs().mean(dim=(1, 2, 3))
    assert shifted.median() > d.median()  # the bound tells a 3-pixel shift apart


def test_resized_size_is_torchvisions():
    from pipelines.torch_backend.decode import resized_size

    for h, w, s in [(480, 640, 256), (640, 480, 256), (333, 1000, 224), (257, 256, 256),
                    (7, 100, 64), (1201, 799, 224)]:
        want = tuple(v2.Resize(s, antialias=True)(torch.zeros(1, h, w)).shape[1:])
        assert resized_size(h, w, s) == want


def test_only_the_resizes_the_scaled_path_can_run_are_taken():
    ok = first_crop(as_steps(v2.Compose([v2.Resize(256, antialias=True), v2.CenterCrop(224)])))
    assert isinstance(ok, v2.Resize)
    for t in (v2.Resize((256, 300)), v2.Resize(256, max_size=300),
              v2.Resize(256, interpolation=v2.InterpolationMode.NEAREST)):
        assert first_crop(as_steps(v2.Compose([t, v2.CenterCrop(224)]))) is None
    photo = first_crop(as_steps(v2.Compose([v2.Resize(32)])))
    assert scaled_crop(_jpeg(), photo).size == (48, 32)  # 600 x 400 -> 48 x 32, as Resize
    assert scaled_crop(_jpeg(orientation=6), photo) is None


def test_pinned_picks_the_scaled_decoder_for_large_photos_only(photos, tiny_root, monkeypatch):
    """NOTE [the default decoder] in pipelines/torch_backend/decode.py: from the files, not a
    timing, so a resumed job decodes as the first run did; an explicit decoder wins."""
    from pipelines.config import Decoder
    from pipelines.torch_backend import decode

    def chosen(root, backend="pinned", **kw):
        cfg = LoaderConfig(root=root, batch_size=8, device="cpu", num_workers=0,
                           augment=AugmentSpec(size=64))
        with make(backend, cfg, **kw) as ld:
            return ld.decoder

    assert chosen(photos) is Decoder.TORCHVISION  # 600-1000 px: under the threshold
    monkeypatch.setattr(decode, "SCALED_FROM_MP", 0.3)
    assert chosen(photos) is Decoder.SCALED
    assert chosen(tiny_root) is Decoder.TORCHVISION  # 48-96 px
    assert chosen(photos, decoder="torchvision") is Decoder.TORCHVISION
    assert chosen(photos, "pageable") is Decoder.PIL  # the baseline is never tuned
    jitter = as_steps(v2.Compose([v2.ColorJitter(0.1), v2.RandomResizedCrop(64)]))
    assert decode.default_decoder(jitter, _source([_jpeg()] * 24)) == "torchvision"


def _source(blobs):
    """A shard-like ``Source`` (read by bytes) of ``blobs``."""
    from pipelines.sources.root import Source, SourceKind
    return Source(SourceKind.SHARDS, [f"s/{i}.jpg" for i in range(len(blobs))],
                  np.zeros(len(blobs), np.int64), ["c"], lambda i: blobs[i])


def test_median_megapixels_reads_the_headers_of_a_spread_sample(tmp_path):
    from pipelines.sources.root import SIZE_SAMPLE, Source, SourceKind, median_megapixels

    files = []
    for i, (w, h) in enumerate([(100, 100), (1000, 1000), (1000, 1000), (2000, 1000)] * 15):
        files.append(str(tmp_path / f"{i}.jpg"))
        Image.new("RGB", (w, h)).save(files[-1], "JPEG")

    class Seen(list):  # names that record which ones were read
        def __getitem__(self, i):
            seen.append(i)
            return list.__getitem__(self, i)

    seen = []
    src = Source(SourceKind.FOLDER, Seen(files), np.zeros(len(files), np.int64), ["c"], None)
    mp = median_megapixels(src)
    assert mp == 1.0 and len(seen) == SIZE_SAMPLE and seen[-1] > 50  # across the listing
    (tmp_path / "bad.jpg").write_bytes(b"not an image")
    assert median_megapixels(_source([b"not an image"])) is None
    big = io.BytesIO()
    Image.new("RGB", (640, 480)).save(big, "JPEG")
    assert median_megapixels(_source([big.getvalue()] * 3)) == 640 * 480 / 1e6  # by bytes


def _jpeg(orientation=None, mode="RGB"):
    im = Image.fromarray(np.random.default_rng(0).integers(0, 255, (400, 600, 3), np.uint8))
    im = im.convert(mode)
    buf = io.BytesIO()
    exif = Image.Exif()
    if orientation:
        exif[0x0112] = orientation
    im.save(buf, "JPEG", exif=exif)
    return buf.getvalue()


def test_files_the_scaled_path_cannot_take_are_decoded_in_full():
    t = first_crop(as_steps(v2.Compose([v2.RandomResizedCrop(32)])))
    assert t is not None and scaled_crop(_jpeg(), t).size == (32, 32)
    assert scaled_crop(_jpeg(orientation=6), t) is None  # rotated by EXIF
    assert scaled_crop(_jpeg(mode="CMYK"), t) is None
    buf = io.BytesIO()
    Image.new("RGB", (64, 64)).save(buf, "PNG")
    assert scaled_crop(buf.getvalue(), t) is None
    nearest = v2.RandomResizedCrop(32, interpolation=v2.InterpolationMode.NEAREST)
    assert first_crop(as_steps(v2.Compose([nearest]))) is None


def test_a_rotated_jpeg_gives_the_same_image_from_every_decoder(tmp_path):
    root = tmp_path / "r" / "a"
    root.mkdir(parents=True)
    for i in range(4):
        (root / f"{i}.jpg").write_bytes(_jpeg(orientation=6))
    outs = [_images(tmp_path / "r", d, size=32) for d in ("pil", "scaled", "torchvision")]
    assert (outs[0] - outs[1]).abs().max() == 0 and (outs[0] - outs[2]).abs().max() < 0.05


def test_the_pil_decoder_copies_an_upright_image_once_as_imagefolder_does(monkeypatch):
    """Regression (H200, docs/results/h200/seeds-reference): ``exif_transpose`` copied every
    upright image before ``convert`` copied it again, one full-size copy per sample more than
    ``ImageFolder``'s loader, and ``pageable`` fell behind the plain recipe."""
    from torchvision.datasets.folder import pil_loader

    from pipelines.torch_backend.decode import pil_image

    data, copies = _jpeg(), []
    real = Image.Image.copy
    monkeypatch.setattr(Image.Image, "copy", lambda im: copies.append(1) or real(im))
    pil_image(data)
    ours, copies[:] = len(copies), []
    monkeypatch.setattr("builtins.open", lambda *a, **k: io.BytesIO(data))
    pil_loader("x.jpg")
    monkeypatch.undo()
    assert ours == len(copies) == 1
    rotated = pil_image(_jpeg(orientation=6))
    upright = pil_image(_jpeg())
    assert rotated.size == upright.size[::-1]  # the orientation is still applied


def test_a_sample_seeds_the_cpu_generator_only(monkeypatch):
    """Regression: ``torch.manual_seed`` per sample also queued a seed, with a formatted stack
    trace, for each lazily initialised device module: a large share of the PIL recipe's time
    in the workers, and a list that grew by one entry per sample."""
    from pipelines.torch_backend.dataset import JpegDataset

    device_seeds = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda s: device_seeds.append(s))
    t = AugmentSpec(size=16).to_torchvision(normalize=True)
    ds = JpegDataset(["a.jpg"], np.array([0]), t, seed=5, read=lambda i: _jpeg())
    a, b = ds[(0, 0)][0], ds[(0, 0)][0]
    assert device_seeds == [] and torch.equal(a, b)  # still seeded per sample
    assert not torch.equal(a, ds[(1, 0)][0])  # another epoch, another crop


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_reduced_decode_is_the_scaled_decodes_decode_in_both_libraries(photos, k):
    """``pipelines.torch_backend.decode.reduced_decode`` (what ``tools.microbench decode``'s
    ``eighth`` row times): the whole file at ``ceil(size / k)``, and the same pixels from
    either library."""
    pytest.importorskip("simplejpeg")
    from PIL import Image

    from pipelines.torch_backend.decode import reduced_decode

    files = sorted(photos.rglob("*.jpg"))[:4]
    for f in files:
        data = f.read_bytes()
        w, h = Image.open(f).size
        a, b = reduced_decode(data, k, "simplejpeg"), reduced_decode(data, k, "pil")
        assert a.shape == b.shape == (-(-h // k), -(-w // k), 3) and a.dtype == np.uint8
        assert np.abs(a.astype(int) - b).max() <= 1, f
