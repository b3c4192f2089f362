"""Batch MixUp / CutMix (``pipelines.transforms.mix``): the rule, the draws, the config, every backend."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torchvision.transforms import v2

from pipelines import AugmentSpec, LoaderConfig, MixSpec, create_loader
from pipelines.transforms.mix import as_mix_spec, mix_batch, mix_rng
from tests.utils import ks, one_image_copies

BACKENDS = ["dali", "pinned", "pageable"]
DRAWS = 3000
D_CRIT = 1.949 * math.sqrt(2 / DRAWS)  # two-sample KS at p = 0.001


def _batch(n=4, h=16, w=20, classes=5):
    """Image i is the constant i + 1, so every pixel says which image it came from."""
    x = torch.arange(1, n + 1, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 3, h, w).clone()
    return x, torch.arange(n) % classes


def _lams(spec, classes=5):
    """The lam of each of DRAWS batches, read back from the soft targets of image 0."""
    x, y = _batch(classes=classes)
    out = []
    for k in range(DRAWS):
        _, t = mix_batch(x, y, spec, classes, mix_rng(0, 0, 0, k))
        out.append(float(t[0, y[0]]))
    return np.array(out)


@pytest.mark.parametrize("alpha", [0.2, 1.0])
def test_mixup_lam_follows_beta_alpha_alpha(alpha):
    lam = _lams(MixSpec(mixup_alpha=alpha))
    ref = torch.distributions.Beta(alpha, alpha).sample((DRAWS,)).numpy()  # torchvision's draw
    assert ks(lam, ref) < D_CRIT
    wrong = torch.distributions.Beta(alpha * 3, alpha * 3).sample((DRAWS,)).numpy()
    assert ks(lam, wrong) > D_CRIT  # a wrong alpha is told apart


def test_mixup_images_and_labels_mix_with_the_same_lam():
    x, y = _batch()
    out, t = mix_batch(x, y, MixSpec(mixup_alpha=1.0), 5, mix_rng(1, 2, 0, 3))
    lam = float(t[0, 0])
    want = lam * x + (1 - lam) * x.roll(1, 0)
    assert torch.allclose(out, want) and torch.allclose(t.sum(1), torch.ones(4))
    assert math.isclose(float(t[0, y[-1]]), 1 - lam, rel_tol=1e-6)


def test_cutmix_pastes_a_box_whose_area_is_one_minus_lam():
    h, w = 16, 20
    x, y = _batch(h=h, w=w)
    areas, seen_partial = [], False
    for k in range(400):
        out, t = mix_batch(x, y, MixSpec(cutmix_alpha=1.0), 5, mix_rng(0, 0, 0, k))
        pasted = out[0, 0] == x[-1, 0, 0, 0]  # pixels of image 0 now from its partner
        kept = out[0, 0] == x[0, 0, 0, 0]
        assert bool((pasted | kept).all())
        rows, cols = pasted.any(1).nonzero(), pasted.any(0).nonzero()
        if len(rows):  # one rectangle
            assert int(pasted.sum()) == len(rows) * len(cols)
            seen_partial |= 0 < int(pasted.sum()) < h * w
        lam = float(t[0, y[0]])
        assert math.isclose(lam, 1 - float(pasted.float().mean()), abs_tol=1e-6)
        assert torch.allclose(t.sum(1), torch.ones(4))
        for i in range(1, 4):  # every image took the same box from its own partner
            assert torch.equal(out[i, 0] == x[i - 1, 0, 0, 0], pasted)
        areas.append(1 - lam)
    assert seen_partial
    # CutMix's rule: half-sides int(sqrt(1 - lam) / 2 * side) around a uniform centre, clipped;
    # its mean area for lam ~ U(0, 1) is well below the unclipped E[1 - lam] = 0.5
    assert 0.15 < float(np.mean(areas)) < 0.45


def test_switch_prob_label_smoothing_and_prob():
    x, y = _batch()
    spec = MixSpec(mixup_alpha=1.0, cutmix_alpha=1.0, switch_prob=0.3)
    cut = 0
    for k in range(1000):
        out, _ = mix_batch(x, y, spec, 5, mix_rng(0, 0, 0, k))
        cut += int(bool((out[0] == x[0]).any()))  # CutMix keeps some original pixels
    assert abs(cut / 1000 - 0.3) < 0.06
    out, t = mix_batch(x, y, MixSpec(mixup_alpha=1.0, prob=0.0, label_smoothing=0.1), 5,
                       mix_rng(0, 0, 0, 0))
    assert torch.equal(out, x)
    assert math.isclose(float(t[0, 0]), 0.9 + 0.1 / 5, rel_tol=1e-6)
    assert torch.allclose(t.sum(1), torch.ones(4))


def test_torchvision_mixes_become_specs_and_bad_ones_are_refused():
    assert as_mix_spec(v2.MixUp(alpha=0.2)) == MixSpec(mixup_alpha=0.2)
    s = as_mix_spec(v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=7),
                                     v2.CutMix(alpha=1.0, num_classes=7)], p=[1, 3]))
    assert s == MixSpec(mixup_alpha=0.2, cutmix_alpha=1.0, switch_prob=0.75, num_classes=7)
    with pytest.raises(ValueError, match="labels_getter"):
        as_mix_spec(v2.MixUp(alpha=0.2, labels_getter=lambda b: b[1]))
    with pytest.raises(TypeError, match="mix="):
        as_mix_spec(v2.RandomHorizontalFlip())
    with pytest.raises(ValueError, match="mixup_alpha=-1"):
        MixSpec(mixup_alpha=-1)
    with pytest.raises(ValueError, match="turn at least one on"):
        MixSpec()


def test_a_mix_inside_transform_is_refused(tiny_root):
    t = v2.Compose([v2.RandomResizedCrop(32), v2.MixUp(alpha=0.2)])
    with pytest.raises(ValueError, match=r"transform holds MixUp.*mix="):
        LoaderConfig(root=tiny_root, transform=t)


def _cfg(root, **kw):
    base = dict(root=root, batch_size=4, device="cpu", num_workers=1, seed=3,
                augment=AugmentSpec(size=32, mode="eval"), shuffle=True)
    base.update(kw)
    return LoaderConfig(**base)


def test_num_classes_must_match_the_dataset(tiny_root):
    with pytest.raises(ValueError, match="num_classes=7 but the dataset has 3"):
        create_loader("pageable", _cfg(tiny_root, mix=MixSpec(mixup_alpha=1.0, num_classes=7)))


@pytest.fixture(scope="module")
def copies(tmp_path_factory, tiny_root):
    """12 copies of one JPEG in 3 classes: the backends decode the same pixels."""
    return one_image_copies(tiny_root, tmp_path_factory.mktemp("copies"), n=12, classes=3)


def _epoch(backend, root, mix):
    with create_loader(backend, _cfg(root, mix=mix)) as ld:
        return [(x.clone(), y.clone()) for x, y in ld]


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_backend_mixes_its_batches_by_the_shared_rule(backend, tiny_root):
    spec = MixSpec(mixup_alpha=0.4, cutmix_alpha=1.0)
    plain, mixed = _epoch(backend, tiny_root, None), _epoch(backend, tiny_root, spec)
    assert len(plain) == len(mixed)
    for pos, ((x, y), (xm, ym)) in enumerate(zip(plain, mixed)):
        want_x, want_y = mix_batch(x, y, spec, 3, mix_rng(3, 0, 0, pos))
        assert torch.equal(ym, want_y) and ym.dtype == torch.float32 and ym.shape == (len(y), 3)
        assert torch.allclose(xm, want_x)


def test_the_three_backends_mix_identically(copies):
    spec = MixSpec(mixup_alpha=0.4, cutmix_alpha=1.0)
    runs = {b: _epoch(b, copies, spec) for b in BACKENDS}
    for (xa, ya), (xb, yb), (xc, yc) in zip(runs["pageable"], runs["pinned"], runs["dali"]):
        assert torch.equal(ya, yb) and torch.equal(ya, yc)  # the same soft targets
        # PIL's decode (pageable, as ImageFolder) and torchvision's (pinned): the same libjpeg
        assert float((xa - xb).abs().mean()) < 1e-3 and float((xa - xb).abs().max()) < 0.1
        assert float((xa - xc).abs().mean()) < 0.05  # DALI's decode: within the eval tolerance


def test_a_resumed_loader_mixes_the_rest_exactly(tiny_root):
    spec = MixSpec(mixup_alpha=1.0, cutmix_alpha=1.0)
    want = _epoch("pinned", tiny_root, spec)
    with create_loader("pinned", _cfg(tiny_root, mix=spec)) as ld:
        it = iter(ld)
        for _ in range(3):
            next(it)
        state = ld.state_dict()
        it.close()
    with create_loader("pinned", _cfg(tiny_root, mix=spec)) as ld:
        ld.load_state_dict(state)
        got = [(x.clone(), y.clone()) for x, y in ld]
    assert len(got) == len(want) - 3
    for (xa, ya), (xb, yb) in zip(want[3:], got):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_the_suite_takes_mix(tiny_root, tmp_path):
    import json

    from compare.__main__ import main
    from compare.cli import mix_spec

    assert mix_spec("mixup=0.2,cutmix=1,smoothing=0.1") == MixSpec(
        mixup_alpha=0.2, cutmix_alpha=1.0, label_smoothing=0.1)
    for bad, msg in (("mixup", "not KEY=VALUE"), ("alpha=1", "not KEY=VALUE"),
                     ("mixup=x", "not a number"), ("mixup=0", "turn at least one on")):
        with pytest.raises(ValueError, match=f"--mix '{bad}'.*{msg}"):
            mix_spec(bad)
    out = tmp_path / "o"
    assert main(["--data", str(tiny_root), "--mix", "mixup=0.2,cutmix=1.0", "--model", "tinycnn",
                 "--image-size", "32", "--batch-size", "4", "--steps", "2", "--warmup", "0",
                 "--repeats", "1", "--device", "cpu", "--workers", "1", "--backends", "pinned",
                 "--out", str(out)]) == 0
    setup = json.loads((out / "results.json").read_text())["setup"]
    assert "mixup_alpha=0.2" in setup["mix"] and "cutmix_alpha=1.0" in setup["mix"]
