import json

import pytest
from PIL import Image

from data_gen.__main__ import main
from data_gen.generate import GenConfig, generate, read_manifest


def _gen(out, **kw):
    base = dict(out=str(out), num_images=24, classes=3, seed=11, width_range=(64, 160), workers=2)
    base.update(kw)
    return generate(GenConfig(**base), progress=False)


def test_same_arguments_give_byte_identical_files(tmp_path):
    a = _gen(tmp_path / "a")
    b = _gen(tmp_path / "b", workers=1)
    assert [f["sha256"] for f in a["files"]] == [f["sha256"] for f in b["files"]]
    for f in a["files"]:
        assert (tmp_path / "a" / f["path"]).read_bytes() == (tmp_path / "b" / f["path"]).read_bytes()
    c = _gen(tmp_path / "c", seed=12)
    assert [f["sha256"] for f in a["files"]] != [f["sha256"] for f in c["files"]]


def test_manifest_describes_real_jpegs(tmp_path):
    m = _gen(tmp_path, num_images=60)
    assert read_manifest(tmp_path)["args"]["seed"] == 11
    assert len(m["files"]) == 60 and m["stats"]["num_images"] == 60
    for f in m["files"]:
        with Image.open(tmp_path / f["path"]) as im:
            assert im.format == "JPEG" and im.size == (f["width"], f["height"])
            assert im.mode == f["mode"]
            assert 64 <= im.width <= 160
    assert {f["label"] for f in m["files"]} == {0, 1, 2}


def test_default_sizes_look_like_imagenet(tmp_path):
    m = generate(GenConfig(out=str(tmp_path), num_images=80, seed=1, workers=2), progress=False)
    s = m["stats"]
    assert 40 <= s["mean_kib"] <= 120
    assert s["width_min_max"][0] >= 300 and s["width_min_max"][1] <= 800
    assert s["subsampling_420"] > s["subsampling_444"] > 0
    assert s["grayscale"] > 0 and s["progressive"] > 0
    assert len({(f["width"] / f["height"]).__round__(2) for f in m["files"]}) > 3  # mixed aspects


def test_refuses_a_foreign_non_empty_directory(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep me")
    assert main(["--out", str(tmp_path), "--num-images", "3", "--quiet"]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["--out", str(tmp_path), "--num-images", "3", "--quiet", "--force"]) == 0
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_regenerating_its_own_directory_replaces_old_files(tmp_path):
    _gen(tmp_path, num_images=20)
    m = _gen(tmp_path, num_images=5)
    jpgs = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.jpg"))
    assert jpgs == sorted(f["path"] for f in m["files"])
    assert json.loads((tmp_path / "manifest.json").read_text())["args"]["num_images"] == 5


@pytest.mark.parametrize("args, msg", [(["--num-images", "0"], "num_images"),
                                       (["--quality-range", "90,10"], "quality_range")])
def test_bad_arguments_give_one_line_errors(tmp_path, capsys, args, msg):
    assert main(["--out", str(tmp_path / "x"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "\n" not in err
