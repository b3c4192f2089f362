"""torchvision v2 on the CPU vs its DALI translation: the same distributions.

Each statistical test compares N samples from torchvision with N from DALI (CPU operators here,
GPU operators under the cuda marker) using the two-sample Kolmogorov-Smirnov statistic at
alpha = 0.001 (D_crit = 1.949 * sqrt(2 / N), 0.172 for N = 256), or, for rates, a difference
below 4 standard errors. Every test also runs a deliberately mistranslated DALI plan and checks
that the same statistic rejects it, so each test is shown to be able to fail.
"""
import colorsys
import io
import math

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from pipelines import LoaderConfig, create_loader
from pipelines.transforms.migrate import UnsupportedTransformError, from_torchvision
from tests.utils import ks

pytestmark = pytest.mark.dali

K, EPOCHS = 64, 4          # 64 files x 4 epochs = 256 DALI samples
N = K * EPOCHS
D_CRIT = 1.949 * math.sqrt(2 / N)
TAIL = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]


def rate_close(p1, p2, n=N) -> bool:
    p = (p1 + p2) / 2
    return abs(p1 - p2) < 4 * math.sqrt(max(p * (1 - p), 1e-4) * 2 / n)


def marker(size=256):
    y, x = np.mgrid[0:size, 0:size]
    return np.stack([x * 255 // (size - 1), y * 255 // (size - 1), np.full_like(x, 128)], -1).astype(np.uint8)


def dataset(tmp_path, arr, name):
    root = tmp_path / name / "c"
    root.mkdir(parents=True)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")  # lossless content (PNG is sniffed, not named)
    for i in range(K):
        (root / f"{i:03d}.jpg").write_bytes(buf.getvalue())
    return root.parent


def run_dali(root, compose, device="cpu"):
    cfg = LoaderConfig(root=root, batch_size=K, device=device, num_workers=2, transform=compose,
                       shuffle=False, seed=1)
    out = []
    with create_loader("dali", cfg) as ld:
        for e in range(EPOCHS):
            ld.set_epoch(e)
            out += [x.float().cpu() for x, _ in ld]
    return torch.cat(out) * 255.0          # back to the 0..255 scale


def run_tv(arr, compose):
    img = torch.from_numpy(arr).permute(2, 0, 1).contiguous()
    out = []
    for i in range(N):
        torch.manual_seed(i)
        out.append(compose(img).as_subclass(torch.Tensor).float())
    return torch.stack(out) * 255.0


def _pair(tmp_path, arr, make, good, wrong, name, stat, device="cpu"):
    root = dataset(tmp_path, arr, name)
    ref = stat(run_tv(arr, make(*good)))
    ok = stat(run_dali(root, make(*good), device))
    bad = stat(run_dali(root, make(*wrong), device))
    return ref, ok, bad


# -- geometry ----------------------------------------------------------------------------------
def crop_fractions(x):
    """Width and height of the crop window, as fractions of the marker, from its gradients."""
    w = (x[:, 0, :, -1].mean(1) - x[:, 0, :, 0].mean(1)) / 255
    h = (x[:, 1, -1, :].mean(1) - x[:, 1, 0, :].mean(1)) / 255
    return w.clamp(min=1e-3).numpy(), h.clamp(min=1e-3).numpy()


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("what", ["area", "aspect"])
def test_random_resized_crop_area_and_aspect(tmp_path, what, device):
    def make(scale, ratio):
        return v2.Compose([v2.RandomResizedCrop(32, scale=scale, ratio=ratio), *TAIL])

    def stat(x):
        w, h = crop_fractions(x)
        return w * h if what == "area" else np.log(w / h)

    wrong = ((0.3, 1.0), (3 / 4, 4 / 3)) if what == "area" else ((0.08, 1.0), (0.5, 2.0))
    ref, ok, bad = _pair(tmp_path, marker(), make, ((0.08, 1.0), (3 / 4, 4 / 3)), wrong, what, stat,
                         device)
    assert ks(ref, ok) < D_CRIT, f"translation differs: D={ks(ref, ok):.3f}"
    assert ks(ref, bad) > D_CRIT, "the test cannot see a mistranslated scale/ratio"


def test_random_resized_crop_fallback_is_centred_as_in_torchvision(tmp_path):
    """scale=(0.9, 1) on a 2:1 image: every attempt fails, torchvision centres the fallback
    window, and so does DALI (the window is drawn on the host, ``pipelines.transforms.draws``); a
    RandomResizedCrop after another op (drawn in the graph) centres it too."""
    def make(scale, lead=True):
        head = [] if lead else [v2.Resize((128, 256))]
        return v2.Compose([*head, v2.RandomResizedCrop(32, scale=scale), *TAIL])

    def stat(x):
        return x[:, 0, :, 0].mean(1).numpy()  # left edge = x offset of the window

    arr = np.ascontiguousarray(marker(256)[:128])
    root = dataset(tmp_path, arr, "fallback")
    ref = stat(run_tv(arr, make((0.9, 1.0))))
    for lead in (True, False):
        ok = stat(run_dali(root, make((0.9, 1.0), lead)))
        # one window for all (the centre): the same offset, within the resampling tolerance
        assert np.ptp(ref) == 0 and np.ptp(ok) < 1.0 and abs(ref.mean() - ok.mean()) < 2.0
    spread = stat(run_dali(root, make((0.1, 0.2))))
    assert np.ptp(spread) > 20.0  # the test can see offsets spread over the image


def test_random_crop_offsets(tmp_path):
    def make(size):
        return v2.Compose([v2.RandomCrop(size), *TAIL])

    def stat(x):
        return x[:, 0, :, 0].mean(1).numpy()  # left edge = x offset

    ref, ok, bad = _pair(tmp_path, marker(), make, (128,), (224,), "rcrop", stat)
    assert ks(ref, ok) < D_CRIT and ks(ref, bad) > D_CRIT


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("flip", ["h", "v"])
def test_flip_rate(tmp_path, flip, device):
    T = v2.RandomHorizontalFlip if flip == "h" else v2.RandomVerticalFlip

    def make(p):
        return v2.Compose([v2.Resize((32, 32)), T(p), *TAIL])

    def stat(x):
        c = 0 if flip == "h" else 1
        edge = (x[:, c, :, 0] - x[:, c, :, -1]) if flip == "h" else (x[:, c, 0, :] - x[:, c, -1, :])
        return float((edge.mean(1) > 0).float().mean())

    ref, ok, bad = _pair(tmp_path, marker(), make, (0.5,), (0.2,), "flip" + flip, stat, device)
    assert rate_close(ref, ok), (ref, ok)
    assert not rate_close(ref, bad)


def test_resize_and_center_crop_match_pixels(tmp_path):
    rng = np.random.default_rng(0)
    noisy = marker(200)[:150].astype(float) + rng.normal(0, 20, (150, 200, 3))
    arr = np.clip(noisy, 0, 255).astype(np.uint8)
    compose = v2.Compose([v2.Resize(64), v2.CenterCrop(48), *TAIL])
    root = dataset(tmp_path, arr, "rcc")
    tv = run_tv(arr, compose)[:1]
    dali = run_dali(root, compose)[:1]
    assert (tv - dali).abs().mean() < 2.0            # < 2/255 mean abs difference
    wrong = run_dali(root, v2.Compose([v2.Resize(72), v2.CenterCrop(48), *TAIL]))[:1]
    assert (tv - wrong).abs().mean() > 2.0


# -- colour --------------------------------------------------------------------------------------
def _uniform(rgb, size=32):
    return np.tile(np.array(rgb, np.uint8), (size, size, 1))


def _halves(lo, hi, size=32):
    a = np.full((size, size, 3), lo, np.uint8)
    a[:, size // 2 :] = hi
    return a


def _hue(x):
    m = x.mean(dim=(2, 3)).clamp(0, 255).numpy() / 255
    return np.array([colorsys.rgb_to_hsv(*p)[0] for p in m])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("param, image, good, wrong, stat", [
    ("brightness", _uniform((100, 100, 100)), 0.4, 0.1, lambda x: (x.mean(dim=(1, 2, 3)) / 100).numpy()),
    ("contrast", _halves(64, 192), 0.5, 0.2,
     lambda x: ((x[..., 16:].mean(dim=(1, 2, 3)) - x[..., :16].mean(dim=(1, 2, 3))) / 128).numpy()),
    ("saturation", _uniform((200, 100, 50)), 0.5, 0.2,
     lambda x: ((x.mean(dim=(2, 3)).max(1).values - x.mean(dim=(2, 3)).min(1).values) / 150).numpy()),
])
def test_color_jitter_factor_distributions(tmp_path, param, image, good, wrong, stat, device):
    make = lambda v: v2.Compose([v2.CenterCrop(32), v2.ColorJitter(**{param: v}), *TAIL])  # noqa: E731
    ref, ok, bad = _pair(tmp_path, image, make, (good,), (wrong,), param, stat, device)
    assert ks(ref, ok) < D_CRIT, f"{param}: D={ks(ref, ok):.3f}"
    assert ks(ref, bad) > D_CRIT


def test_hue_shift_range(tmp_path):
    """DALI rotates hue in YIQ, torchvision in HSV, so the shifts are not identical: for
    ``hue=0.1`` on an orange patch DALI's extremes land up to 0.04 of the wheel (14 degrees) from
    torchvision's. Stated tolerance: 0.05 of the wheel on both ends of the range."""
    image = _uniform((200, 100, 50))
    base = _hue(torch.from_numpy(image).permute(2, 0, 1)[None].float())[0]
    make = lambda h: v2.Compose([v2.CenterCrop(32), v2.ColorJitter(hue=h), *TAIL])  # noqa: E731
    shift = lambda x: ((_hue(x) - base + 0.5) % 1.0) - 0.5  # noqa: E731
    ref, ok, bad = _pair(tmp_path, image, make, (0.1,), (0.03,), "hue", shift)
    assert abs(ref.min() - ok.min()) < 0.05 and abs(ref.max() - ok.max()) < 0.05
    assert abs(ref.max() - bad.max()) > 0.05 or abs(ref.min() - bad.min()) > 0.05


def test_grayscale_rate(tmp_path):
    make = lambda p: v2.Compose([v2.CenterCrop(32), v2.RandomGrayscale(p), *TAIL])  # noqa: E731
    stat = lambda x: float((x.mean(dim=(2, 3)).std(1) < 2).float().mean())  # noqa: E731
    ref, ok, bad = _pair(tmp_path, _uniform((200, 100, 50)), make, (0.3,), (0.6,), "gray", stat)
    assert rate_close(ref, ok) and not rate_close(ref, bad)


def test_gaussian_blur_sigma_distribution(tmp_path):
    img = np.zeros((33, 33, 3), np.uint8)
    img[16, 16] = 255
    make = lambda s: v2.Compose([v2.CenterCrop(33), v2.GaussianBlur(9, sigma=s), *TAIL])  # noqa: E731
    stat = lambda x: x[:, 0, 15:18, 15:18].sum(dim=(1, 2)).numpy()  # noqa: E731 - energy near the peak
    ref, ok, bad = _pair(tmp_path, img, make, ((0.5, 2.0),), ((1.0, 3.0),), "blur", stat)
    assert ks(ref, ok) < D_CRIT, f"D={ks(ref, ok):.3f}"
    assert ks(ref, bad) > D_CRIT


@pytest.mark.parametrize("device", DEVICES)
def test_normalize_matches(tmp_path, device):
    arr = _uniform((10, 120, 240))
    m, s = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    compose = v2.Compose([v2.Resize((16, 16)), *TAIL, v2.Normalize(m, s)])
    root = dataset(tmp_path, arr, "norm")
    tv, dali = run_tv(arr, compose)[:1] / 255, run_dali(root, compose, device)[:1] / 255
    assert (tv - dali).abs().max() < 1e-3
    wrong = run_dali(root, v2.Compose([v2.Resize((16, 16)), *TAIL, v2.Normalize(s, m)]), device)[:1] / 255
    assert (tv - wrong).abs().max() > 0.1


# -- errors and the torch side -------------------------------------------------------------------
def test_unsupported_transforms_are_listed_with_positions():
    with pytest.raises(UnsupportedTransformError) as e:
        from_torchvision(v2.Compose([v2.RandomPerspective(p=1.0), v2.CenterCrop(8),
                                     v2.RandomErasing(value="random"),
                                     v2.RandomCrop(4, padding=2, fill=0.5), *TAIL]))
    msg = str(e.value)
    assert "#0 RandomPerspective" in msg and "#2 RandomErasing" in msg and "#3 RandomCrop" in msg
    assert "#1" not in msg and "Supported:" in msg


@pytest.mark.parametrize("backend", ["pageable", "pinned"])
def test_torch_backends_run_the_users_compose_as_is(tiny_root, backend):
    compose = v2.Compose([v2.CenterCrop(40), v2.Resize((24, 24)), *TAIL, v2.Normalize([0.5] * 3, [0.25] * 3)])
    cfg = LoaderConfig(root=tiny_root, batch_size=37, device="cpu", num_workers=0, shuffle=False,
                       transform=compose)
    with create_loader(backend, cfg) as ld:
        x, _ = next(iter(ld))
    assert x.shape == (37, 3, 24, 24) and x.dtype == torch.float32
    from torchvision.io import ImageReadMode, decode_image

    first = sorted(tiny_root.glob("class_*/*.jpg"))[0]
    ref = compose(decode_image(str(first), mode=ImageReadMode.RGB))
    assert torch.allclose(x[0], ref, atol=1e-6)


def test_compare_cli_rejects_untranslatable_transform_for_dali(tiny_root, tmp_path, capsys, monkeypatch):
    import sys
    import types

    from compare.__main__ import main

    mod = types.ModuleType("user_recipes")
    mod.bad = v2.Compose([v2.RandomPerspective(p=1.0), v2.CenterCrop(32), *TAIL])
    monkeypatch.setitem(sys.modules, "user_recipes", mod)
    rc = main(["--data", str(tiny_root), "--device", "cpu", "--backends", "dali",
               "--transform", "user_recipes:bad", "--out", str(tmp_path)])
    assert rc == 2 and "#0 RandomPerspective" in capsys.readouterr().err


# -- the forms users pass, and v1 transforms ----------------------------------------------------
import torchvision.transforms as T  # noqa: E402

I = v2.InterpolationMode
V1_V2 = [  # the same step in both APIs: the translation must not tell them apart
    (lambda m: m.RandomResizedCrop(16, scale=(0.3, 0.9), ratio=(0.5, 2.0),
                                   interpolation=I.BICUBIC)),
    (lambda m: m.Resize(20, max_size=30, antialias=False)),
    (lambda m: m.Resize((16, 20), interpolation=I.NEAREST_EXACT)),
    (lambda m: m.CenterCrop((15, 17))),
    (lambda m: m.RandomCrop(16, padding=(1, 2, 3, 4), fill=(1, 2, 3), padding_mode="edge")),
    (lambda m: m.RandomCrop(16, padding=2, pad_if_needed=True)),
    (lambda m: m.RandomHorizontalFlip(0.3)),
    (lambda m: m.RandomVerticalFlip(0.7)),
    (lambda m: m.ColorJitter(0.4, (0.5, 0.5), 0.2, 0.1)),
    (lambda m: m.RandomGrayscale(0.2)),
    (lambda m: m.GaussianBlur((3, 5), sigma=(0.5, 1.5))),
]


@pytest.mark.parametrize("make", V1_V2, ids=lambda f: type(f(v2)).__name__)
def test_v1_and_v2_steps_translate_alike(make):
    def plan(m, tail):
        return from_torchvision(v2.Compose([make(m), v2.CenterCrop(12), *tail]))

    assert plan(T, [T.ConvertImageDtype(torch.float32), T.Normalize([0.5] * 3, [0.2] * 3)]) \
        == plan(v2, [v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.2] * 3)])


def test_a_v1_compose_with_totensor_is_stored_as_its_v2_meaning(tiny_root):
    cfg = LoaderConfig(root=tiny_root, transform=T.Compose([T.CenterCrop(8), T.PILToTensor(),
                                                            T.ToTensor()]))
    assert isinstance(cfg.transform, v2.Compose)
    assert [type(t).__name__ for t in cfg.transform.transforms] == ["CenterCrop", "Identity",
                                                                    "ToDtype"]
    assert cfg.transform.transforms[2].scale and cfg.transform.transforms[2].dtype == torch.float32


@pytest.mark.parametrize("form", [
    lambda: v2.CenterCrop(8),
    lambda: torch.nn.Sequential(v2.CenterCrop(8), v2.ToDtype(torch.float32, scale=True)),
    lambda: v2.Compose([v2.Compose([v2.CenterCrop(8)]), torch.nn.Sequential(v2.ToImage())]),
    lambda: T.CenterCrop(8),
], ids=["single", "sequential", "nested", "single-v1"])
def test_accepted_forms_are_stored_as_one_flat_v2_compose(tiny_root, form):
    cfg = LoaderConfig(root=tiny_root, transform=form())
    assert isinstance(cfg.transform, v2.Compose)
    assert not any(hasattr(t, "transforms") or isinstance(t, torch.nn.Sequential)
                   for t in cfg.transform.transforms)
    assert type(cfg.transform.transforms[0]).__name__ == "CenterCrop"
    assert cfg.replace(seed=1).transform is cfg.transform  # normalising is idempotent


def test_a_flat_v2_compose_is_kept_as_given(tiny_root):
    t = v2.Compose([v2.CenterCrop(8), v2.ToDtype(torch.float32, scale=True)])
    cfg = LoaderConfig(root=tiny_root, transform=t)
    assert cfg.transform is t and cfg == cfg.replace()


@pytest.mark.parametrize("bad", [[v2.CenterCrop(8)], "v2.CenterCrop(8)", lambda x: x, 3])
def test_anything_else_is_a_one_line_type_error_naming_transform(tiny_root, bad):
    with pytest.raises(TypeError) as e:
        LoaderConfig(root=tiny_root, transform=bad)
    assert str(e.value).startswith("transform=") and "\n" not in str(e.value)


def test_pinneds_tail_is_the_batchable_end_and_keeps_the_tensor_kind():
    from pipelines.transforms.migrate import split_compose

    head, tail = split_compose(v2.Compose([
        v2.ToImage(), v2.ToDtype(torch.uint8, scale=True), v2.RandomResizedCrop(8),
        v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.2] * 3)]))
    assert [type(t).__name__ for t in head.transforms] == ["ToImage", "ToDtype",
                                                            "RandomResizedCrop"]
    assert tail.offset == 3 and tail.kind == "image"
    head, tail = split_compose(v2.Compose([v2.CenterCrop(8), v2.Lambda(lambda x: x),
                                           v2.ToDtype(torch.float32, scale=True)]))
    assert len(tail) == 0  # after an unknown step the batch's kind is unknown: all in workers
