"""Every backend against torchvision itself, over a table of Compose variants (issue 13).

Each variant runs in ``pageable``, ``pinned`` and ``dali`` (DALI CPU operators) on six lossless
images (PNG content in ``.jpg`` files, so decoders agree to the bit) of different sizes, two of
them smaller than the largest crops. The reference is the Compose run by hand on the decoded
uint8 tensor, seeded as the torch backends seed each sample; a v1 Compose with ``ToTensor`` is
run on the PIL image, as v1 pipelines are.

An expectation is one of:

* ``MATCH``: every backend gives the reference's shape exactly and ``cfg.dtype`` (float32);
  the torch backends its values (atol 1e-5, or ``tol`` for a PIL reference), DALI its values
  within ``tol`` uint8 levels of mean absolute difference per image (scaled by the value of one
  level after the Compose's ToDtype / Normalize) and its value range within ``tol`` levels.
  ``check="crop"`` (random crops): DALI's image must equal one of the crop windows of the
  padded reference image. ``check="range"`` (random crops of random size): shape and range.
* ``DALI``: the torch backends match; ``create_loader("dali")`` raises
  ``UnsupportedTransformError`` naming the step.
* ``INVALID``: torchvision itself refuses it; ``LoaderConfig`` raises ``InvalidTransformError``
  (a ``ValueError``) for every backend.
* ``RAISES``: runs into torchvision's own run-time error on the small images; every backend
  raises a ``RuntimeError`` (``TransformError`` in the torch backends).

Tolerances in uint8 levels (see ``pipelines.transforms.migrate.translate``): 0.02 for crops, flips,
padding and value maps (float rounding only), 0.5 for colour (one-level flips where float
rounding meets torchvision's truncation), 1.0 for resampling (1.5 for LANCZOS); float16 /
bfloat16 intermediates add their rounding (0.3 / 2.0 levels).
"""
from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from pipelines import (
    InvalidTransformError,
    LoaderConfig,
    TransformError,
    UnsupportedTransformError,
    create_loader,
)
from pipelines.epoch_plan import sample_seed
from pipelines.sources.folder import list_samples
from pipelines.transforms.migrate.params import resize_refusal

I = v2.InterpolationMode
SIZES = [(40, 56), (56, 40), (48, 48), (20, 28), (33, 65), (64, 47)]  # (H, W)
SEED = 3
MATCH, DALI, INVALID, RAISES = "match", "dali", "invalid", "raises"
M, S = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def F32():
    return [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]


@dataclass
class V:
    id: str
    make: Callable[[], object]
    expect: str = MATCH
    tol: float = 0.02           # uint8 levels, DALI against the reference
    check: str = "pixels"       # "pixels", "crop" (one of the crop windows) or "range"
    pil: bool = False           # reference on the PIL image (v1 pipelines with ToTensor)
    why: str = ""               # a word the DALI refusal must contain


def _tv_resizes(mode):
    """MATCH where this torchvision resizes a tensor with ``mode`` (LANCZOS and modes given as
    strings depend on its version), else INVALID."""
    return MATCH if resize_refusal(False, mode, True, torch.uint8) is None else INVALID


VARIANTS = [
    # -- resampling: every interpolation mode, antialias on / off ------------------------------
    V("resize-bilinear-aa", lambda: v2.Compose([v2.Resize((16, 16)), *F32()]), tol=1.0),
    V("resize-bilinear-no-aa", lambda: v2.Compose([v2.Resize((16, 16), antialias=False), *F32()]),
      tol=1.0),
    V("resize-nearest-exact", lambda: v2.Compose([v2.Resize((16, 16), interpolation=I.NEAREST_EXACT),
                                                  *F32()]), tol=1.0),
    V("resize-nearest", lambda: v2.Compose([v2.Resize((16, 16), interpolation=I.NEAREST), *F32()]),
      DALI, why="NEAREST"),
    V("resize-bicubic-aa", lambda: v2.Compose([v2.Resize((16, 16), interpolation=I.BICUBIC),
                                               *F32()]), tol=1.0),
    V("resize-bicubic-no-aa", lambda: v2.Compose([v2.Resize((16, 16), interpolation=I.BICUBIC,
                                                            antialias=False), *F32()]),
      DALI, why="antialias=False"),
    V("resize-bicubic-as-string", lambda: v2.Compose([v2.Resize((16, 16), interpolation="bicubic"),
                                                      *F32()]), _tv_resizes("bicubic"), tol=1.0),
    V("resize-lanczos", lambda: v2.Compose([v2.Resize((16, 16), interpolation=I.LANCZOS), *F32()]),
      _tv_resizes(I.LANCZOS), tol=1.5),
    V("resize-box", lambda: v2.Compose([v2.Resize((16, 16), interpolation=I.BOX), *F32()]), INVALID),
    V("resize-hamming", lambda: v2.Compose([v2.Resize((16, 16), interpolation=I.HAMMING), *F32()]),
      INVALID),
    V("resize-upscale", lambda: v2.Compose([v2.Resize((80, 90)), *F32()]), tol=1.0),
    V("resize-short-side-then-crop", lambda: v2.Compose([v2.Resize(20), v2.CenterCrop(16), *F32()]),
      tol=1.0),
    V("resize-max-size", lambda: v2.Compose([v2.Resize(16, max_size=24), v2.CenterCrop(16), *F32()]),
      tol=1.0),
    V("resize-size-none-max-size", lambda: v2.Compose([v2.Resize(None, max_size=20),
                                                       v2.CenterCrop(16), *F32()]), tol=1.0),
    V("resize-int-of-fixed-size", lambda: v2.Compose([v2.CenterCrop((30, 20)), v2.Resize(10),
                                                      *F32()]), tol=1.0),
    V("resize-max-size-too-small", lambda: v2.Compose([v2.Resize(16, max_size=16), *F32()]), INVALID),
    V("resize-no-fixed-size", lambda: v2.Compose([v2.Resize(16), *F32()]), DALI,
      why="no fixed output size"),
    # -- crops, padding, crops larger than the image -------------------------------------------
    V("center-crop-larger-than-image", lambda: v2.Compose([v2.CenterCrop(48), *F32()])),
    V("center-crop-odd", lambda: v2.Compose([v2.CenterCrop((15, 17)), *F32()])),
    V("random-crop-pad-if-needed", lambda: v2.Compose([v2.RandomCrop(48, pad_if_needed=True),
                                                       *F32()]), check="crop"),
    V("random-crop-padding-fill", lambda: v2.Compose([v2.RandomCrop(24, padding=4,
                                                                    fill=(10, 20, 30)), *F32()]),
      check="crop"),
    V("random-crop-reflect", lambda: v2.Compose([v2.RandomCrop(24, padding=3,
                                                               padding_mode="reflect"), *F32()]),
      check="crop"),
    V("random-crop-symmetric-pad-if-needed", lambda: v2.Compose([
        v2.RandomCrop(32, pad_if_needed=True, padding_mode="symmetric"), *F32()]), check="crop"),
    V("random-crop-edge-pad-if-needed", lambda: v2.Compose([
        v2.RandomCrop(32, padding=2, pad_if_needed=True, padding_mode="edge"), *F32()]),
      check="crop"),
    V("random-crop-larger-than-image", lambda: v2.Compose([v2.RandomCrop(48), *F32()]), RAISES),
    V("random-crop-fill-dict", lambda: v2.Compose([
        v2.RandomCrop(48, pad_if_needed=True, fill={tv_tensors.Image: 7, "others": 0}), *F32()]),
      DALI, why="fill"),
    V("random-crop-after-normalize", lambda: v2.Compose([
        *F32(), v2.Normalize(M, S), v2.RandomCrop(32, pad_if_needed=True)]), check="crop"),
    # -- RandomResizedCrop: degenerate and edge parameters --------------------------------------
    V("rrc-square-scale-1", lambda: v2.Compose([v2.RandomResizedCrop(16, scale=(1.0, 1.0),
                                                                     ratio=(1.0, 1.0)), *F32()]),
      tol=1.0),
    V("rrc-scale-0-fallback", lambda: v2.Compose([v2.RandomResizedCrop((16, 20), scale=(0.0, 0.0),
                                                                       ratio=(0.75, 4 / 3)),
                                                  *F32()]), tol=1.0),
    V("rrc-scale-above-1", lambda: v2.Compose([v2.RandomResizedCrop(16, scale=(1.5, 2.0),
                                                                    ratio=(1.0, 1.0)), *F32()]),
      tol=1.0),
    V("rrc-nearest-exact", lambda: v2.Compose([v2.RandomResizedCrop(
        16, scale=(0.0, 0.0), ratio=(1.0, 1.0), interpolation=I.NEAREST_EXACT), *F32()]), tol=1.0),
    V("rrc-bicubic-aa", lambda: v2.Compose([v2.RandomResizedCrop(
        16, scale=(1.0, 1.0), ratio=(1.0, 1.0), interpolation=I.BICUBIC), *F32()]), tol=1.0),
    V("rrc-random", lambda: v2.Compose([v2.RandomResizedCrop(16), *F32()]), check="range"),
    V("rrc-random-fallback-prone", lambda: v2.Compose([v2.RandomResizedCrop(16, scale=(0.9, 1.0)),
                                                       *F32()]), check="range"),
    V("rrc-random-not-first", lambda: v2.Compose([v2.RandomHorizontalFlip(1.0),
                                                  v2.RandomResizedCrop(16), *F32()]),
      check="range"),
    V("rrc-nearest", lambda: v2.Compose([v2.RandomResizedCrop(16, interpolation=I.NEAREST),
                                         *F32()]), DALI, why="NEAREST"),
    V("rrc-scale-reversed", lambda: v2.Compose([v2.RandomResizedCrop(16, scale=(0.9, 0.1)),
                                                *F32()]), INVALID),
    V("rrc-ratio-reversed", lambda: v2.Compose([v2.RandomResizedCrop(16, ratio=(2.0, 1.0)),
                                                *F32()]), INVALID),
    # -- flips ---------------------------------------------------------------------------------
    V("hflip-p1", lambda: v2.Compose([v2.CenterCrop(16), v2.RandomHorizontalFlip(1.0), *F32()])),
    V("hflip-p0", lambda: v2.Compose([v2.CenterCrop(16), v2.RandomHorizontalFlip(0.0), *F32()])),
    V("vflip-p1-then-crop", lambda: v2.Compose([v2.RandomVerticalFlip(1.0), v2.CenterCrop((15, 17)),
                                                *F32()])),
    # -- colour, fixed jitter ranges -------------------------------------------------------------
    V("jitter-brightness-fixed", lambda: v2.Compose([v2.CenterCrop(16),
                                                     v2.ColorJitter(brightness=(0.6, 0.6)), *F32()]),
      tol=0.5),
    V("jitter-contrast-fixed", lambda: v2.Compose([v2.CenterCrop(16),
                                                   v2.ColorJitter(contrast=(0.5, 0.5)), *F32()]),
      tol=0.5),
    V("jitter-saturation-zero", lambda: v2.Compose([v2.CenterCrop(16),
                                                    v2.ColorJitter(saturation=(0.0, 0.0)), *F32()]),
      tol=0.5),
    V("jitter-hue-fixed", lambda: v2.Compose([v2.CenterCrop(16), v2.ColorJitter(hue=(0.1, 0.1)),
                                              *F32()]), tol=0.5),
    V("grayscale-p1", lambda: v2.Compose([v2.CenterCrop(16), v2.RandomGrayscale(1.0), *F32()]),
      tol=0.5),
    V("grayscale-p0", lambda: v2.Compose([v2.CenterCrop(16), v2.RandomGrayscale(0.0), *F32()])),
    V("blur-fixed-sigma", lambda: v2.Compose([v2.CenterCrop(16), v2.GaussianBlur(5, sigma=1.0),
                                              *F32()]), tol=1.0),
    V("blur-non-square-kernel", lambda: v2.Compose([v2.CenterCrop(16),
                                                    v2.GaussianBlur((3, 7), sigma=(1.5, 1.5)),
                                                    *F32()]), tol=1.0),
    V("jitter-after-float", lambda: v2.Compose([*F32(), v2.CenterCrop(16), v2.ColorJitter(0.3)]),
      DALI, why="float conversion"),
    # -- dtype and normalisation orders ----------------------------------------------------------
    V("todtype-then-normalize", lambda: v2.Compose([v2.CenterCrop(16), *F32(), v2.Normalize(M, S)])),
    V("two-normalize", lambda: v2.Compose([v2.CenterCrop(16), *F32(), v2.Normalize(M, S),
                                           v2.Normalize([0.1, -0.2, 0.3], [2.0, 0.5, 1.5])])),
    V("normalize-one-value", lambda: v2.Compose([v2.CenterCrop(16), *F32(),
                                                 v2.Normalize([0.5], [0.25])])),
    V("todtype-no-scale-then-normalize", lambda: v2.Compose([v2.CenterCrop(16),
                                                             v2.ToDtype(torch.float32),
                                                             v2.Normalize([100.0] * 3, [50.0] * 3)])),
    V("todtype-no-scale", lambda: v2.Compose([v2.CenterCrop(16), v2.ToDtype(torch.float32)])),
    V("uint8-output", lambda: v2.Compose([v2.CenterCrop(16), v2.ToImage()])),
    V("float16-then-normalize", lambda: v2.Compose([v2.CenterCrop(16), v2.ToImage(),
                                                    v2.ToDtype(torch.float16, scale=True),
                                                    v2.Normalize(M, S), v2.ToDtype(torch.float32)]),
      tol=0.3),
    V("bfloat16-then-normalize", lambda: v2.Compose([v2.CenterCrop(16), v2.ToImage(),
                                                     v2.ToDtype(torch.bfloat16, scale=True),
                                                     v2.Normalize(M, S), v2.ToDtype(torch.float32)]),
      tol=2.0),
    V("float64-then-normalize", lambda: v2.Compose([v2.CenterCrop(16),
                                                    v2.ToDtype(torch.float64, scale=True),
                                                    v2.Normalize(M, S), v2.ToDtype(torch.float32)])),
    V("normalize-before-todtype", lambda: v2.Compose([v2.CenterCrop(16), v2.Normalize(M, S),
                                                      *F32()]), INVALID),
    V("normalize-zero-std", lambda: v2.Compose([v2.CenterCrop(16), *F32(),
                                                v2.Normalize(M, [0.2, 0.0, 0.2])]), INVALID),
    V("normalize-two-channels", lambda: v2.Compose([v2.CenterCrop(16), *F32(),
                                                    v2.Normalize([0.5] * 2, [0.2] * 2)]), INVALID),
    V("todtype-dict-after-toimage", lambda: v2.Compose([
        v2.CenterCrop(16), v2.ToImage(),
        v2.ToDtype({tv_tensors.Image: torch.float32, "others": None}, scale=True),
        v2.Normalize(M, S)])),
    V("todtype-dict-plain-tensor", lambda: v2.Compose([
        v2.CenterCrop(16), v2.ToDtype({tv_tensors.Image: torch.float32, "others": None},
                                      scale=True)])),
    V("todtype-dict-no-entry", lambda: v2.Compose([
        v2.CenterCrop(16), v2.ToImage(), v2.ToDtype({torch.Tensor: torch.float32})]), INVALID),
    V("float-then-geometry", lambda: v2.Compose([
        *F32(), v2.RandomResizedCrop(16, scale=(0.0, 0.0), ratio=(1.0, 1.0)),
        v2.Normalize(M, S)]), tol=1.0),
    V("normalize-then-center-crop-pads-zero", lambda: v2.Compose([*F32(), v2.Normalize(M, S),
                                                                  v2.CenterCrop(48)])),
    V("float-then-bicubic-unclamped", lambda: v2.Compose([
        v2.ToDtype(torch.float32, scale=True), v2.Resize((16, 16), interpolation=I.BICUBIC)]),
      tol=1.0),
    V("todtype-uint8-no-op-first", lambda: v2.Compose([v2.ToImage(), v2.ToDtype(torch.uint8,
                                                                                scale=True),
                                                       v2.CenterCrop(16), *F32()])),
    V("todtype-int16", lambda: v2.Compose([v2.CenterCrop(16), v2.ToDtype(torch.int16), *F32()]),
      DALI, why="int16"),
    V("float-back-to-uint8", lambda: v2.Compose([v2.CenterCrop(16), *F32(),
                                                 v2.ToDtype(torch.uint8, scale=True)]),
      DALI, why="uint8"),
    V("convert-image-dtype", lambda: v2.Compose([v2.CenterCrop(16),
                                                 v2.ConvertImageDtype(torch.float32)])),
    # -- the forms users pass ------------------------------------------------------------------
    V("v1-inside-v2", lambda: v2.Compose([T.Resize(20), T.CenterCrop(16), v2.ToImage(),
                                          v2.ToDtype(torch.float32, scale=True),
                                          T.Normalize(M, S)]), tol=1.0),
    V("v1-compose", lambda: T.Compose([T.Resize(20), T.CenterCrop(16), T.ToTensor(),
                                       T.Normalize(M, S)]), tol=1.0, pil=True),
    V("v1-random-crop-padding-ltrb", lambda: v2.Compose([T.RandomCrop(24, padding=(1, 2, 3, 4)),
                                                         *F32()]), check="crop"),
    V("v1-totensor-in-v2", lambda: v2.Compose([v2.CenterCrop(16), T.ToTensor()]), pil=True),
    V("single-transform", lambda: v2.CenterCrop(16)),
    V("nn-sequential", lambda: torch.nn.Sequential(v2.CenterCrop(16),
                                                   v2.ToDtype(torch.float32, scale=True))),
    V("nested-compose", lambda: v2.Compose([v2.Compose([v2.CenterCrop(16)]), *F32()])),
    V("unsupported-perspective", lambda: v2.Compose([v2.RandomPerspective(p=1.0), v2.CenterCrop(16), *F32()]),
      DALI, why="RandomPerspective"),
]


# -- data and references -----------------------------------------------------------------------
def _image(h: int, w: int, k: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    r = 128 + 100 * np.sin(x / (3.0 + k) + y / 7.0)
    g = 128 + 90 * np.cos(y / (4.0 + k) - x / 9.0)
    b = (x * 255 / max(w - 1, 1) * 0.6 + y * 255 / max(h - 1, 1) * 0.4)
    return np.clip(np.stack([r, g, b], -1), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    out = tmp_path_factory.mktemp("table")
    (out / "c").mkdir()
    for k, (h, w) in enumerate(SIZES):
        buf = io.BytesIO()
        Image.fromarray(_image(h, w, k)).save(buf, format="PNG")  # lossless, sniffed as PNG
        (out / "c" / f"img{k}.jpg").write_bytes(buf.getvalue())
    return out


def _decoded(root):
    return [np.array(Image.open(p).convert("RGB")) for p in list_samples(root)[0]]


def _reference(v: V, arrays, epoch: int = 0):
    """The variant's Compose on each decoded image, seeded as the torch backends seed it."""
    out = []
    for i, a in enumerate(arrays):
        torch.manual_seed(sample_seed(SEED, epoch, i))
        x = Image.fromarray(a) if v.pil else torch.from_numpy(a).permute(2, 0, 1).contiguous()
        out.append(torch.as_tensor(v.make()(x)).as_subclass(torch.Tensor))
    return out


def _cfg(root, transform, device="cpu", **kw):
    return LoaderConfig(root=root, batch_size=len(SIZES), device=device, num_workers=0,
                        shuffle=False, seed=SEED, transform=transform, **kw)


def _first_batch(backend, cfg):
    """The first batch; the torch backends decode as the reference does (``torchvision.io``)."""
    from pipelines.factory import options_for

    opts = None if backend == "dali" else options_for(backend)(decoder="torchvision")
    with create_loader(backend, cfg, options=opts) as ld:
        x, _ = next(iter(ld))
    return x.cpu()


def _unit(compose) -> float:
    """The value of one uint8 level after the Compose's ToDtype / Normalize steps."""
    from pipelines.transforms.migrate.flow import walk

    end = walk(compose)[0][-1].after
    return float(max(abs(a) for a in end.scale)) if end.scale is not None else 1.0


def _value_range(compose, arrays):
    """The lowest and highest value any pixel of ``arrays`` takes through the value map."""
    from pipelines.transforms.migrate.flow import walk

    end = walk(compose)[0][-1].after
    px = torch.from_numpy(np.concatenate([a.reshape(-1, 3) for a in arrays])).float()
    v = px * torch.tensor(end.scale) + torch.tensor(end.shift)
    return v.amin(), v.amax()


def _crop_windows(img: torch.Tensor, t) -> torch.Tensor:
    """Every crop ``t`` (a RandomCrop) can take of ``img``: ``(n, C, h, w)``."""
    from pipelines.transforms.migrate.params import hw, padding_lrtb

    l, r, top, b = padding_lrtb(t)
    ch, cw = hw(t.size)
    H, W = img.shape[-2:]
    if t.pad_if_needed:
        dh, dw = max(ch - (H + top + b), 0), max(cw - (W + l + r), 0)
        top, b, l, r = top + dh, b + dh, l + dw, r + dw
    fill = t.fill if isinstance(t.fill, (int, float, tuple, list)) else 0
    padded = F.pad(img, [l, top, r, b], fill=fill, padding_mode=t.padding_mode) \
        if (l or r or top or b) else img
    win = padded.unfold(-2, ch, 1).unfold(-2, cw, 1)           # C, nh, nw, ch, cw
    return win.permute(1, 2, 0, 3, 4).reshape(-1, img.shape[0], ch, cw)


def _crop_candidates(compose, img: torch.Tensor) -> torch.Tensor:
    """Every output ``compose`` (with one RandomCrop) can give for ``img``: the steps before the
    crop, each crop window, then the (per-pixel) steps after it."""
    steps = list(compose.transforms)
    k = next(i for i, t in enumerate(steps) if type(t).__name__ == "RandomCrop")
    x = img
    for t in steps[:k]:
        x = t(x)
    wins = _crop_windows(torch.as_tensor(x).as_subclass(torch.Tensor), steps[k])
    for t in steps[k + 1:]:
        wins = t(wins)
    return torch.as_tensor(wins).as_subclass(torch.Tensor).float()


# -- the table ---------------------------------------------------------------------------------
BACKENDS = ["pageable", "pinned", pytest.param("dali", marks=pytest.mark.dali),
            pytest.param("pinned-cuda", marks=pytest.mark.cuda),
            pytest.param("dali-cuda", marks=[pytest.mark.dali, pytest.mark.cuda])]


def test_the_table_covers_what_the_issue_lists():
    ids = {v.id for v in VARIANTS}
    assert len(VARIANTS) >= 40 and len(ids) == len(VARIANTS)
    kinds = {v.expect for v in VARIANTS}
    assert {MATCH, DALI, INVALID, RAISES} <= kinds


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.id)
def test_variant(root, v: V, backend):
    backend, _, device = backend.partition("-")
    if v.expect == INVALID:
        with pytest.raises(InvalidTransformError) as e:
            _cfg(root, v.make())
        assert isinstance(e.value, ValueError) and e.value.problems
        assert f"#{e.value.problems[0].pos} " in str(e.value)
        return
    cfg = _cfg(root, v.make(), device=device or "cpu")
    if v.expect == RAISES:
        with pytest.raises(RuntimeError) as e:
            _first_batch(backend, cfg)
        if backend != "dali":
            assert isinstance(e.value, TransformError) and "RandomCrop" in str(e.value)
        return
    if v.expect == DALI and backend == "dali":
        with pytest.raises(UnsupportedTransformError) as e:
            create_loader("dali", cfg)
        assert v.why in str(e.value), str(e.value)
        return
    if v.id == "resize-no-fixed-size":  # the torch backends: one clear error at the batch
        with pytest.raises(RuntimeError, match="different shapes"):
            _first_batch(backend, cfg)
        return
    ref = _reference(v, _decoded(root))
    x = _first_batch(backend, cfg)
    assert x.dtype == torch.float32
    assert tuple(x.shape) == (len(ref), *ref[0].shape), (tuple(x.shape), tuple(ref[0].shape))
    ref = torch.stack([r.float() for r in ref])
    if backend != "dali" and not v.pil:  # the same torchvision code, the same seeds
        torch.testing.assert_close(x, ref, atol=1e-5, rtol=1e-5)
        return
    unit = _unit(cfg.transform)
    tol = v.tol * unit + (0 if backend != "dali" else 1e-5)
    if v.check == "crop":
        for i, a in enumerate(_decoded(root)):
            wins = _crop_candidates(cfg.transform, torch.from_numpy(a).permute(2, 0, 1))
            err = (wins - x[i]).abs().flatten(1).mean(1).min()
            assert err <= tol, f"image {i}: no crop window within {tol} (best {err})"
        return
    lo, hi = ref.amin(), ref.amax()
    if v.check == "range":  # a random crop: within what any crop of the images can hold
        lo, hi = _value_range(cfg.transform, _decoded(root))
    assert x.amin() >= lo - tol - 1e-6 and x.amax() <= hi + tol + 1e-6, (x.amin(), x.amax(), lo, hi)
    if v.check == "range":
        return
    err = (x - ref).abs().flatten(1).mean(1)
    assert err.max() <= tol, f"mean |dali - torchvision| per image {err.tolist()} > {tol}"


@pytest.mark.dali
def test_all_four_jitters_compose_in_dalis_order(root):
    """Fixed brightness, contrast, saturation and hue together equal torchvision's functional
    chain in that order (torchvision's ColorJitter draws the order per image)."""
    cj = v2.ColorJitter((0.7, 0.7), (1.4, 1.4), (1.6, 1.6), (-0.15, -0.15))
    x = _first_batch("dali", _cfg(root, v2.Compose([v2.CenterCrop(16), cj, v2.ToImage()])))
    ref = []
    for a in _decoded(root):
        y = F.center_crop(torch.from_numpy(a).permute(2, 0, 1), [16, 16])
        y = F.adjust_hue(F.adjust_saturation(F.adjust_contrast(F.adjust_brightness(
            y, 0.7), 1.4), 1.6), -0.15)
        ref.append(y.float())
    err = (x - torch.stack(ref)).abs().flatten(1).mean(1)
    assert err.max() <= 0.5, err.tolist()
