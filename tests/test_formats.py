"""A folder of mixed formats (JPEG, PNG, WebP, BMP) reads the same on every backend."""
from __future__ import annotations

import pytest
import torch

from data_gen.generate import GenConfig, generate
from pipelines import AugmentSpec, LoaderConfig, create_loader
from pipelines.sources.validate import check_image_bytes

BACKENDS = ["dali", "pinned", "pageable"]


@pytest.fixture(scope="module")
def mixed_root(tmp_path_factory):
    out = tmp_path_factory.mktemp("mixed")
    generate(GenConfig(out=str(out), num_images=32, classes=4, seed=5, width_range=(48, 96),
                       mix_formats=True, workers=1), progress=False)
    return out


def _read(backend, root):
    spec = AugmentSpec(mode="eval", size=32, resize_size=40)
    cfg = LoaderConfig(root=root, batch_size=8, device="cpu", num_workers=1, shuffle=False,
                       augment=spec, debug_indices=True)
    with create_loader(backend, cfg) as ld:
        xs, ys = zip(*[(x.clone(), y.clone()) for x, y in ld])
        return torch.cat(xs), torch.cat(ys), ld.last_indices.copy(), ld.paths, spec


def test_mixed_formats_are_listed_and_give_the_same_labels_and_pixels(mixed_root):
    exts = {p.suffix for p in mixed_root.rglob("img_*")}
    assert exts == {".jpg", ".png", ".webp", ".bmp"}
    got = {b: _read(b, mixed_root) for b in BACKENDS if b != "dali" or _dali()}
    x0, y0, i0, paths, spec = got["pageable"]
    assert len(paths) == 32 and {p.rsplit(".", 1)[1] for p in paths} == {"jpg", "png", "webp",
                                                                          "bmp"}
    std = torch.tensor(spec.std).view(1, 3, 1, 1)
    for b, (x, y, i, _, _) in got.items():
        assert torch.equal(y, y0) and (i == i0).all(), b
        mae = ((x.float() - x0.float()) * std).abs().mean().item()
        assert mae < 2 / 255, f"{b}: mean abs diff {mae * 255:.3f}/255"


def _dali():
    try:
        import nvidia.dali  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.mark.parametrize("backend", BACKENDS)
def test_truncated_webp_and_bmp_are_bad_files_under_both_policies(backend, mixed_root, tmp_path):
    if backend == "dali" and not _dali():
        pytest.skip("needs DALI")
    import shutil

    root = tmp_path / "r"
    shutil.copytree(mixed_root, root)
    victims = [next(root.rglob("*.webp")), next(root.rglob("*.bmp"))]
    for v in victims:
        data = v.read_bytes()
        v.write_bytes(data[: len(data) // 2])
        assert "truncated" in check_image_bytes(v.read_bytes())
    cfg = LoaderConfig(root=root, batch_size=8, device="cpu", num_workers=1,
                       augment=AugmentSpec(size=32), on_bad_file="skip")
    with create_loader(backend, cfg) as ld:
        with pytest.warns(RuntimeWarning, match="skipped 2 bad files"):
            n = sum(len(y) for _, y in ld)
        assert ld.stats["bad_files"] == 2 and n == 32
    with create_loader(backend, cfg.replace(on_bad_file="error")) as ld:
        with pytest.raises(Exception, match="truncated (WebP|BMP)"):
            for _ in ld:
                pass
