"""RandomApply and RandomChoice on DALI (``pipelines.dali.choice``) against torchvision: how often
each branch runs, per image, and what is refused."""
from __future__ import annotations

import math

import pytest
import torch
from torchvision.transforms import v2

from pipelines import LoaderConfig, UnsupportedTransformError, create_loader, from_torchvision
from tests.utils import one_image_copies

pytestmark = pytest.mark.dali
EPOCHS = 8
N = 64 * EPOCHS


@pytest.fixture(scope="module")
def copies(tmp_path_factory, tiny_root):
    return one_image_copies(tiny_root, tmp_path_factory.mktemp("branches"))


def _outputs(backend, root, t):
    cfg = LoaderConfig(root=root, batch_size=64, device="cpu", num_workers=2, transform=t,
                       seed=7)
    out = []
    with create_loader(backend, cfg) as ld:
        for e in range(EPOCHS):
            ld.set_epoch(e)
            out += [x.clone() for x, _ in ld]
    return torch.cat(out)


def _rates(x, refs):
    """The share of images equal to each reference image."""
    return [float((x == r).flatten(1).all(1).float().mean()) for r in refs]


def _close(a, b, p):
    return abs(a - b) < 4 * math.sqrt(max(p * (1 - p), 1e-3) * 2 / N)


CROP = v2.CenterCrop((32, 40))
BRIGHT = v2.ColorJitter(brightness=(1.5, 1.5))


def _refs(root):
    """The plain crop every copy gives."""
    cfg = LoaderConfig(root=root, batch_size=1, device="cpu", num_workers=0, seed=7,
                       transform=v2.Compose([CROP]))
    with create_loader("pageable", cfg) as ld:
        return next(iter(ld))[0][0]


def test_random_apply_runs_its_steps_at_rate_p(copies):
    plain = _refs(copies)
    steps = [BRIGHT, v2.RandomHorizontalFlip(1.0)]
    done = v2.Compose(steps)(plain.to(torch.uint8)).float()
    t = v2.Compose([CROP, v2.RandomApply(steps, p=0.3)])
    d, tv = _outputs("dali", copies, t), _outputs("pageable", copies, t)
    (d_plain, d_done), (t_plain, t_done) = _rates(d, [plain, done]), _rates(tv, [plain, done])
    assert d_plain + d_done > 0.99 and t_plain + t_done > 0.99  # nothing else comes out
    assert _close(d_done, t_done, 0.3) and _close(d_done, 0.3, 0.3)
    wrong = _rates(_outputs("pageable", copies, v2.Compose([CROP, v2.RandomApply(steps, p=0.6)])),
                   [plain, done])
    assert not _close(d_done, wrong[1], 0.45)


def test_random_choice_draws_each_branch_with_its_p(copies):
    plain = _refs(copies)
    branches = [v2.RandomHorizontalFlip(1.0), v2.RandomVerticalFlip(1.0), BRIGHT]
    refs = [b(plain.to(torch.uint8)).float() for b in branches]
    p = [0.2, 0.3, 0.5]
    t = v2.Compose([CROP, v2.RandomChoice(branches, p=p)])
    d, tv = _rates(_outputs("dali", copies, t), refs), _rates(_outputs("pageable", copies, t), refs)
    assert sum(d) > 0.99
    for k in range(3):
        assert _close(d[k], tv[k], p[k]) and _close(d[k], p[k], p[k]), k
    uniform = v2.Compose([CROP, v2.RandomChoice(branches)])
    u = _rates(_outputs("pageable", copies, uniform), refs)
    assert not all(_close(d[k], u[k], p[k]) for k in range(3))


def test_what_a_branch_may_not_hold_is_named():
    base = [v2.RandomResizedCrop(32)]
    with pytest.raises(UnsupportedTransformError, match="RandomApply.*RandomResizedCrop"):
        from_torchvision(v2.Compose([*base, v2.RandomApply([v2.RandomResizedCrop(16)]),
                                     v2.CenterCrop(16)]))
    with pytest.raises(UnsupportedTransformError, match="RandomChoice"):
        from_torchvision(v2.Compose([*base, v2.ToDtype(torch.float32, scale=True),
                                     v2.RandomChoice([v2.RandomHorizontalFlip()])]))
    ops = from_torchvision(v2.Compose([*base, v2.RandomApply([v2.TrivialAugmentWide()], p=0.5),
                                       v2.RandomChoice([v2.RandomGrayscale(1.0),
                                                        v2.GaussianBlur(3)])])).ops
    assert [o.kind for o in ops[-2:]] == ["random_apply", "random_choice"]
    assert ops[-1]["p"] == (0.5, 0.5) and ops[-2]["ops"][0].kind == "trivial_augment"
