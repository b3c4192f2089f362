"""``tools.gpu_decode``, the issue-45 probe: its batched matmul resize is ``interpolate``'s
antialiased bilinear resize of the crop window, its windows and flips are the other backends',
and the CPU run of the probe gives a line per variant."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision.transforms import v2

from pipelines.epoch_plan import sample_seed
from pipelines.transforms.normalize import normalize_uint8
from pipelines.transforms.spec import AugmentSpec
from tools import gpu_decode as gd


def _images(sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=g) for h, w in sizes]


def _reference(imgs, win, out):
    """Per image: crop, ``interpolate`` (bilinear, antialias), flip; ``N x out x out x 3``."""
    res = []
    for t, (top, left, h, w, flip) in zip(imgs, win.astype(int)):
        crop = t[top:top + h, left:left + w].permute(2, 0, 1)[None].float()
        r = F.interpolate(crop, size=(out, out), mode="bilinear", antialias=True,
                          align_corners=False)[0].permute(1, 2, 0)
        res.append(r.flip(1) if flip else r)
    return torch.stack(res)


# (image size, window top, left, h, w, flip): shrinking, enlarging, odd sizes, a window on
# each edge and corner, the whole image, one-pixel-wide windows
CASES = {
    "shrink": ([(300, 500), (480, 640)], [[10, 20, 200, 300, 0], [33, 100, 447, 501, 0]]),
    "enlarge": ([(61, 97), (50, 40)], [[3, 5, 41, 57, 0], [0, 0, 50, 40, 0]]),
    "odd-edges": ([(257, 333), (199, 211), (255, 129)],
                  [[0, 0, 257, 333, 0], [120, 90, 79, 121, 0], [0, 0, 1, 129, 0]]),
    "flip": ([(300, 500), (61, 97), (255, 129)],
             [[299, 0, 1, 500, 1], [0, 96, 61, 1, 1], [10, 3, 200, 120, 1]]),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("out", [224, 37])
def test_matmul_resize_is_interpolate_of_the_window(case, out):
    sizes, win = CASES[case]
    imgs, win = _images(sizes), np.array(win, np.float32)
    want = _reference(imgs, win, out)
    got32 = gd.crop_resize(gd.pack_copy(imgs), torch.from_numpy(win), out, torch.float32)
    assert got32.shape == want.shape
    # float32 weights and sums: float rounding only
    assert float((got32 - want).abs().max()) < 0.02
    # float16 inputs (the default on the GPU): within half a level before rounding and one
    # level after it, in uint8 levels (NOTE [matmul resize])
    got16 = gd.crop_resize(gd.pack_copy(imgs), torch.from_numpy(win), out, torch.float16).float()
    assert float((got16 - want).abs().max()) < 0.5
    assert float((got16.round() - want.round()).abs().max()) <= 1
    assert float((got16.round() == want.round()).float().mean()) > 0.8


def test_the_flip_mirrors_the_columns():
    imgs = _images([(120, 90)])
    win = torch.tensor([[7, 11, 80, 70, 0]], dtype=torch.float32)
    a = gd.crop_resize(gd.pack_copy(imgs), win, 40, torch.float32)
    win[0, 4] = 1
    b = gd.crop_resize(gd.pack_copy(imgs), win, 40, torch.float32)
    assert not torch.allclose(a, b)
    assert torch.allclose(a.flip(2), b, atol=1e-4)


def test_an_offset_window_equals_the_window_decoded_alone():
    """``full`` (offset in the weights, padding beside it) against ``roi`` (the window only)."""
    imgs = _images([(300, 500), (200, 150)])
    win = np.array([[40, 60, 150, 201, 1], [0, 149, 200, 1, 0]], np.float32)
    full = gd.crop_resize(gd.pack_copy(imgs), torch.from_numpy(win), 224, torch.float32)
    crops = [t[int(a):int(a + h), int(b):int(b + w)] for t, (a, b, h, w, _) in zip(imgs, win)]
    alone = win.copy()
    alone[:, :2] = 0
    roi = gd.crop_resize(gd.pack_copy(crops), torch.from_numpy(alone), 224, torch.float32)
    assert float((full - roi).abs().max()) < 1e-3


def test_the_cat_pack_gives_the_copy_packs_output():
    imgs = _images([(30, 50), (61, 17), (8, 70)])
    a, b = gd.pack_copy(imgs), gd.pack_cat(imgs)
    assert a.shape == b.shape == (3, 61, 70, 3)
    for k, t in enumerate(imgs):
        assert torch.equal(b[k, :t.shape[0], :t.shape[1]], t)
    win = torch.tensor([[1, 2, 25, 40, 0], [0, 0, 61, 17, 1], [2, 5, 6, 60, 0]], dtype=torch.float32)
    assert torch.equal(gd.crop_resize(a, win, 24, torch.float32),
                       gd.crop_resize(b, win, 24, torch.float32))


def test_finish_normalises_as_the_torch_backends():
    o = torch.rand(2, 24, 24, 3) * 300 - 20
    got = gd.finish(o)
    u = o.round().clamp(0, 255).to(torch.uint8).permute(0, 3, 1, 2)
    want = normalize_uint8(u, AugmentSpec(), torch.bfloat16, True)
    assert got.dtype == torch.bfloat16 and got.shape == (2, 3, 24, 24)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, want)


def test_the_windows_and_flips_are_the_other_backends_draws():
    """``sample_stream``'s rows are what torchvision's RandomResizedCrop and
    RandomHorizontalFlip draw after ``manual_seed(sample_seed(seed, epoch, index))``."""
    rng = np.random.default_rng(1)
    n = 50
    sizes = np.stack([rng.integers(300, 800, n), rng.integers(300, 800, n)], 1)
    sizes[0] = (40, 900)  # too wide for the ratio: the centre crop
    idx, rows = gd.sample_stream(sizes, 2 * n + 7, seed=5)
    assert sorted(idx[:n]) == list(range(n)) and sorted(idx[n:2 * n]) == list(range(n))
    t = v2.RandomResizedCrop(224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
    flips = 0
    for k in range(len(idx)):
        h, w = map(int, sizes[idx[k]])
        torch.random.default_generator.manual_seed(sample_seed(5, k // n, int(idx[k])))
        p = t.make_params([torch.zeros(1, dtype=torch.uint8).expand(3, h, w)])
        flip = float(torch.rand(1).item() < 0.5)
        flips += flip
        want = np.array([p["top"], p["left"], p["height"], p["width"], flip], np.float32)
        assert np.array_equal(rows[k], want), (k, rows[k], want)
    assert 0 < flips < len(idx)


def test_a_bad_variant_names_the_option():
    with pytest.raises(ValueError, match="--variants"):
        gd.parse("all.crop.bmm.serial")
    assert gd.parse("hw.roi.bmmcat.overlap") == ("hw", "roi", "bmmcat", "overlap")


def _jpeg(h, w, seed, orientation=1):
    a = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    a = np.asarray(Image.fromarray(a).resize((w // 4, h // 4)).resize((w, h)))  # smoother
    buf = io.BytesIO()
    exif = Image.Exif()
    exif[gd.EXIF_ORIENTATION] = orientation
    Image.fromarray(a).save(buf, "JPEG", quality=90, exif=exif.tobytes())
    return buf.getvalue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-decode")
    for k in range(12):
        d = root / f"c{k % 3}"
        d.mkdir(exist_ok=True)
        (d / f"{k:02d}.jpg").write_bytes(_jpeg(90 + 7 * k, 160 - 5 * k, k, 6 if k == 4 else 1))
    (root / "c0" / "notes.txt").write_text("not an image")
    return root


def test_headers_give_the_upright_size(folder):
    paths = gd.list_jpegs(str(folder))
    assert len(paths) == 12 and paths == sorted(paths)
    datas, sizes, orient = gd.load(paths, threads=2)
    k = [p.name for p in paths].index("04.jpg")
    assert orient[k] == 6 and (orient != 1).sum() == 1
    assert tuple(sizes[k]) == (160 - 20, 90 + 28)  # turned: width and height swapped
    j = [p.name for p in paths].index("05.jpg")
    assert tuple(sizes[j]) == (90 + 35, 160 - 25)


def test_the_cpu_decoder_decodes_windows_as_pil_does(folder):
    pytest.importorskip("nvidia.nvimgcodec")
    paths = gd.list_jpegs(str(folder))
    datas, sizes, _ = gd.load(paths, threads=2)
    dec, pil = gd.Decode("cpu", torch.device("cpu")), gd.Decode("pil", torch.device("cpu"))
    regions = [None, (3, 5, 50, 77), None]
    got, _ = dec(datas[:3], regions)
    want, _ = pil(datas[:3], regions)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert int((g.int() - w.int()).abs().max()) <= 2


def test_the_probe_runs_on_the_cpu(folder, capsys):
    pytest.importorskip("nvidia.nvimgcodec")
    variants = ["cpu.roi.bmm.overlap", "pil.full.bmmcat.serial", "cpu.full.interp.serial",
                "cached.roi.bmm.serial", "cpu.roi.none.serial", "hw.full.bmm.serial"]
    assert gd.main(["--data", str(folder), "--device", "cpu", "--batch-size", "4",
                    "--batches", "2", "--repeats", "2", "--warmup", "1", "--out-size", "32",
                    "--variants", ",".join(variants)]) == 0
    lines = [json.loads(s) for s in capsys.readouterr().out.splitlines()]
    assert lines[0]["env"] and lines[0]["images"] == 12 and lines[0]["exif_oriented"] == 1
    check = next(rec for rec in lines if "check" in rec)
    assert check["bmm_vs_interp_max_levels"] <= 1 and check["bmmcat_vs_bmm_max_levels"] == 0
    assert check["roi_vs_full_decode_max_levels"] <= 2
    runs = {rec["variant"]: rec for rec in lines if "variant" in rec}
    assert list(runs) == variants
    for v in variants[:-1]:
        assert "error" not in runs[v], runs[v]
        assert runs[v]["median_img_s"] > 0 and runs[v]["batches"] == 4
    assert "needs --device cuda" in runs["hw.full.bmm.serial"]["error"]


def test_a_folder_without_jpegs_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        gd.main(["--data", str(tmp_path), "--device", "cpu"])
    assert "--data" in capsys.readouterr().err


@pytest.mark.cuda
def test_the_gpu_resize_is_the_cpu_one():
    imgs = _images([(300, 500), (61, 97), (255, 129)])
    win = torch.tensor([[10, 20, 200, 300, 1], [0, 0, 61, 97, 0], [0, 0, 1, 129, 1]],
                       dtype=torch.float32)
    cpu = gd.crop_resize(gd.pack_copy(imgs), win, 224, torch.float32)
    gpu_imgs = [t.cuda() for t in imgs]
    for pack in (gd.pack_copy, gd.pack_cat):
        got = gd.crop_resize(pack(gpu_imgs), win.cuda(), 224, torch.float16).float().cpu()
        assert float((got - cpu).abs().max()) < 0.5
