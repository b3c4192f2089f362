"""``data_gen --format wds``: WebDataset tar shards holding the folder layout's images."""
import importlib
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from data_gen.__main__ import main
from data_gen.generate import GenConfig, ensure_dataset, generate, read_manifest

gen = importlib.import_module("data_gen.generate")  # the package's ``generate`` is the function

KW = dict(num_images=40, classes=4, seed=3, width_range=(32, 48), mix_formats=True, workers=1)
ARGS = ["--num-images", "40", "--classes", "4", "--seed", "3", "--width-range", "32,48",
        "--mix-formats", "--workers", "1", "--quiet"]
SHARDS = ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]


def _wds(out, **kw):
    return generate(GenConfig(out=str(out), **{**KW, "layout": "wds", "shard_size": 16, **kw}),
                    progress=False)


def _members(shard):
    """``[(TarInfo, bytes)]`` of a shard, in archive order."""
    with tarfile.open(shard) as tar:
        return [(ti, tar.extractfile(ti).read()) for ti in tar.getmembers()]


def _samples(out):
    """``[(index, ext, image bytes, label)]`` over the shards of ``out``, in order."""
    rows = []
    for name in sorted(p.name for p in Path(out).glob("*.tar")):
        m = _members(Path(out) / name)
        assert len(m) % 2 == 0
        for (img, data), (cls, label) in zip(m[::2], m[1::2]):
            key, ext = img.name.split(".")
            assert cls.name == f"{key}.cls" and ext != "cls"  # the image, then its label
            rows.append((int(key), ext, data, int(label.decode("ascii"))))
    return rows


def _snapshot(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in Path(root).rglob("*")
            if p.is_file()}


def _partial(out):
    return Path(out).parent / f".{Path(out).name}.data_gen-partial"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The same config as a folder dataset and as shards of 16."""
    root = tmp_path_factory.mktemp("wds")
    generate(GenConfig(out=str(root / "folder"), **KW), progress=False)
    _wds(root / "wds")
    return root


def test_forty_images_in_shards_of_sixteen_make_three_shards(made):
    out = made / "wds"
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", *SHARDS]  # no images left
    assert [len(_members(out / s)) // 2 for s in SHARDS] == [16, 16, 8]
    m = read_manifest(out)
    assert [(f["path"], f["samples"]) for f in m["files"]] == list(zip(SHARDS, [16, 16, 8]))
    assert m["stats"]["shards"] == 3 and m["stats"]["num_images"] == 40
    assert m["args"]["layout"] == "wds" and m["args"]["shard_size"] == 16
    assert [s["key"] for s in m["samples"]] == [f"{i:08d}" for i, *_ in _samples(out)]
    assert not _partial(out).exists()


def test_every_sample_holds_the_folder_layouts_image_and_label(made):
    folder = {int(f["path"].rsplit("_", 1)[1].split(".")[0]): f
              for f in read_manifest(made / "folder")["files"]}
    rows = _samples(made / "wds")
    assert sorted(i for i, *_ in rows) == sorted(folder) == list(range(40))
    for i, ext, data, label in rows:
        f = folder[i]
        assert data == (made / "folder" / f["path"]).read_bytes()
        assert ext == f["path"].rsplit(".", 1)[1]
        assert label == f["label"] == int(f["path"].split("/")[0].split("_")[1])
    assert {ext for _, ext, *_ in rows} == {"jpg", "png", "webp", "bmp"}


def test_shards_mix_classes_and_hold_deterministic_members(made):
    rows = _samples(made / "wds")
    order = [i for i, *_ in rows]
    labels = [label for *_, label in rows]
    assert order != list(range(40))  # not the index order
    assert order != sorted(order, key=lambda i: (i % 4, i))  # nor the folder's class order
    assert labels != sorted(labels)
    for start in (0, 16):  # every full shard holds several classes
        assert len(set(labels[start:start + 16])) > 1
    for s in SHARDS:
        raw = (made / "wds" / s).read_bytes()
        assert raw[257:263] == b"ustar\x00" and raw[156:157] == b"0"  # USTAR, no PAX header
        for ti, _ in _members(made / "wds" / s):
            assert (ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname) == (
                0, 0o644, 0, 0, "", "")
            assert ti.type == tarfile.REGTYPE


def test_two_runs_give_byte_identical_shards(made, tmp_path):
    _wds(tmp_path / "again", workers=2)
    assert _snapshot(tmp_path / "again") == _snapshot(made / "wds")
    _wds(tmp_path / "other", seed=4)
    assert (tmp_path / "other" / SHARDS[0]).read_bytes() != (made / "wds" / SHARDS[0]).read_bytes()


def test_a_bad_shard_size_is_named_and_nothing_is_written(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "x"), *ARGS, "--format", "wds", "--shard-size", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--shard-size" in err and "\n" not in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match=r"shard_size=0 \(--shard-size\) must be >= 1"):
        GenConfig(out=str(tmp_path), layout="wds", shard_size=0)
    with pytest.raises(TypeError, match="--shard-size"):
        GenConfig(out=str(tmp_path), layout="wds", shard_size=True)


def test_the_shard_size_is_part_of_the_recipe_only_for_wds(tmp_path):
    cfg = lambda **kw: GenConfig(out=str(tmp_path), **{**KW, **kw})  # noqa: E731
    assert "shard_size" not in cfg(shard_size=7).recipe()
    assert cfg(shard_size=7).recipe() == cfg().recipe()
    assert cfg(layout="list", shard_size=7).recipe() == cfg(layout="list").recipe()
    assert cfg(layout="wds").recipe()["shard_size"] == 1000
    assert cfg(layout="wds", shard_size=8).recipe() != cfg(layout="wds", shard_size=16).recipe()


def _count_images(monkeypatch):
    real, calls = gen._one, []

    def one(args):
        calls.append(args[0])
        return real(args)

    monkeypatch.setattr(gen, "_one", one)
    return calls


def test_ensure_dataset_reuses_shards_and_remakes_them_for_another_recipe(tmp_path, monkeypatch):
    out = tmp_path / "c"
    cfg = lambda **kw: GenConfig(out=str(out), **{**KW, "layout": "wds", **kw})  # noqa: E731
    ensure_dataset(cfg(shard_size=16), progress=False)
    before = _snapshot(out)
    calls = _count_images(monkeypatch)
    assert ensure_dataset(cfg(shard_size=16), progress=False) == out
    assert calls == [] and _snapshot(out) == before
    ensure_dataset(cfg(shard_size=8), progress=False)
    assert len(calls) == 40
    assert sorted(_snapshot(out)) == ["manifest.json"] + [f"shard-{n:06d}.tar" for n in range(5)]
    assert read_manifest(out)["args"]["shard_size"] == 8
    ensure_dataset(cfg(layout="folder"), progress=False)
    assert not list(out.glob("*.tar")) and len(list(out.rglob("img_*"))) == 40


def test_a_run_interrupted_while_packing_leaves_out_as_it_was_then_resumes(
        made, tmp_path, monkeypatch):
    out = tmp_path / "d"
    _wds(out, shard_size=8)  # an earlier output, to be replaced
    before = _snapshot(out)
    real, packed = gen._member, []

    def member(name, size):
        if len(packed) == 40:  # two members a sample: in the second shard
            raise KeyboardInterrupt
        packed.append(name)
        return real(name, size)

    monkeypatch.setattr(gen, "_member", member)
    with pytest.raises(KeyboardInterrupt):
        _wds(out)
    assert _snapshot(out) == before  # no half shard in out
    assert (_partial(out) / "data" / SHARDS[1]).exists()
    monkeypatch.setattr(gen, "_member", real)
    calls = _count_images(monkeypatch)
    _wds(out)
    assert calls == []  # the journalled images were packed again
    assert _snapshot(out) == _snapshot(made / "wds") and not _partial(out).exists()


def test_the_command_line_writes_shards_and_says_how_many(tmp_path):
    out = tmp_path / "cli"
    r = subprocess.run([sys.executable, "-m", "data_gen", "--out", str(out), *ARGS,
                        "--format", "wds", "--shard-size", "16"],
                       cwd=Path(__file__).parents[1], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["shards"] == 3
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", *SHARDS]
    assert [len(_members(out / s)) // 2 for s in SHARDS] == [16, 16, 8]
