"""``python -m data_gen convert`` (data_gen/convert/): every source kind converts with its targets
and names; resume joins byte for byte; bad files are counted and named; nothing outside
``--out`` is written; the loaders and the suite read the result; the 224 px crops match the
original's. Servers listen on 127.0.0.1 only."""
from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from data_gen.__main__ import main as data_gen_main
from data_gen.convert import ConvertConfig, convert
from data_gen.convert import manifest as mf
from data_gen.convert import run as convert_run
from data_gen.generate import GenConfig, generate
from pipelines.sources.root import open_source, root_base
from tests.remote_server import FaultyServer

N = 18


def _gen(out: Path, **kw) -> Path:
    base = dict(out=str(out), num_images=N, classes=3, seed=5, width_range=(320, 480),
                workers=1)
    generate(GenConfig(**{**base, **kw}), progress=False)
    return out


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """The same 18 photos as a folder, a file list and tar shards of 5."""
    t = tmp_path_factory.mktemp("convert-src")
    return {"folder": _gen(t / "folder"), "list": _gen(t / "list", layout="list"),
            "shards": _gen(t / "wds", layout="wds", shard_size=5)}


def _cfg(src, out, **kw) -> ConvertConfig:
    return ConvertConfig(src=src, out=str(out), **{"max_side": 200, "shard_size": 4,
                                                   "workers": 1, **kw})


def _by_name(root) -> dict[str, int]:
    """Each sample's relative name and label."""
    s = open_source(root)
    base = root_base(root)
    return {os.path.relpath(n, base): int(lab) for n, lab in zip(s.names, s.labels)}


def _converted(out: Path) -> dict[str, int]:
    """The relative names (``mf.name_of`` of each key) and labels a loader lists in ``out``."""
    s = open_source(out)
    got = {}
    for n, lab in zip(s.names, s.labels):
        key = n.split(".tar/", 1)[1].rsplit(".", 1)[0]
        got[mf.name_of(key)] = int(lab)
    return got


@pytest.mark.parametrize("kind", ["folder", "list", "shards", "http"])
def test_every_source_kind_converts_with_its_targets_and_names(kind, sets, tmp_path,
                                                               monkeypatch):
    monkeypatch.setenv("GPU_FEED_LISTING_CACHE", str(tmp_path / "listings"))
    src = str(sets["list"] / "labels.csv") if kind == "list" else str(sets[kind if kind !=
                                                                          "http" else "shards"])
    want = _by_name(src)
    if kind == "http":
        with FaultyServer(src) as srv:
            url = f"{srv.url}/shard-{{000000..000003}}.tar"
            m = convert(_cfg(url, tmp_path / "out"), progress=False)
            want = _by_name(url)
    else:
        m = convert(_cfg(src, tmp_path / "out"), progress=False)
    assert _converted(tmp_path / "out") == want and len(want) == N
    assert m["complete"] and m["summary"]["converted"] == N and m["summary"]["failed"] == 0
    assert m["classes"] == open_source(sets["folder"]).classes or kind in ("shards", "http")
    assert m["summary"]["resized"] == N  # every photo is wider than 200 px
    for p in sorted((tmp_path / "out").glob("shard-*.tar")):
        import tarfile

        with tarfile.open(p) as tf:
            for ti in tf:
                if ti.name.endswith(".jpg"):
                    with Image.open(tf.extractfile(ti)) as im:
                        assert max(im.size) == 200
    assert not (tmp_path / "out" / mf.FETCH).exists()


def test_keys_map_back_to_names_with_dots_and_other_characters():
    for rel in ["class_a/img.001.jpg", "a b/ü%.png", "../up/x.jpeg", "s.tar/0001.jpg"]:
        key = mf.key_of(rel)
        assert "." not in key and mf.name_of(key) == rel


def test_multilabel_and_column_targets_survive(tmp_path):
    for target, read in (("multilabel", "multilabel"), ("regression", ("width", "height"))):
        src = _gen(tmp_path / f"src-{target}", layout="list", target=target)
        root = str(src / "labels.csv")
        convert(_cfg(root, tmp_path / f"out-{target}", target=read), progress=False)
        a, b = open_source(root, target=read), open_source(tmp_path / f"out-{target}",
                                                            target=read)
        rel_a = [os.path.relpath(n, root_base(root)) for n in a.names]
        rel_b = [mf.name_of(n.split(".tar/", 1)[1].rsplit(".", 1)[0]) for n in b.names]
        ta = dict(zip(rel_a, a.targets.tolist()))
        tb = dict(zip(rel_b, b.targets.tolist()))
        if target == "multilabel":  # class names in the source, their ids in the shards
            ta = {k: [a.classes[j] for j, v in enumerate(t) if v] for k, t in ta.items()}
            tb = {k: [a.classes[int(b.classes[j])] for j, v in enumerate(t) if v]
                  for k, t in tb.items()}
        assert ta == tb and len(ta) == N


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != mf.MANIFEST}


def _stable(m: dict) -> dict:
    m = json.loads(json.dumps(m))
    for k in ("seconds", "photos_per_s"):
        m["summary"].pop(k)
    return m


def test_an_interrupted_run_resumes_and_joins_byte_for_byte(sets, tmp_path, monkeypatch):
    whole = convert(_cfg(sets["folder"], tmp_path / "whole", workers=2), progress=False)
    real, calls = convert_run.ShardWriter.finish, []

    def failing(self):
        calls.append(self.n)
        if len(calls) == 3:  # after 2 whole shards, mid-way through the 3rd
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(convert_run.ShardWriter, "finish", failing)
    with pytest.raises(KeyboardInterrupt):
        convert(_cfg(sets["folder"], tmp_path / "cut", workers=2), progress=False)
    cut = tmp_path / "cut"
    assert sorted(p.name for p in cut.iterdir()) == [
        ".shard-000002.tar.partial", mf.MANIFEST, "shard-000000.tar", "shard-000001.tar"]
    before = {p: (cut / p).stat().st_mtime_ns for p in ("shard-000000.tar", "shard-000001.tar")}
    monkeypatch.setattr(convert_run.ShardWriter, "finish", real)
    made = []
    monkeypatch.setattr(convert_run.ShardWriter, "__init__", _spy(made))
    resumed = convert(_cfg(sets["folder"], cut, workers=2), progress=False)
    assert made == [2, 3, 4]  # only the shards the cut run had not finished
    assert {p: (cut / p).stat().st_mtime_ns for p in before} == before
    assert _files(cut) == _files(tmp_path / "whole")
    assert _stable(resumed) == _stable(whole)


def _spy(made: list):
    init = convert_run.ShardWriter.__init__

    def spy(self, out, n):
        made.append(n)
        init(self, out, n)

    return spy


def test_a_killed_process_resumes_and_joins_byte_for_byte(sets, tmp_path):
    """SIGKILL mid-run (after its first shard), then the same command: the same bytes."""
    import signal
    import subprocess
    import sys
    import time

    src = str(sets["folder"])
    assert data_gen_main(["convert", src, "--out", str(tmp_path / "whole"), "--max-side",
                          "200", "--shard-size", "2", "--workers", "1", "--quiet"]) == 0
    cmd = [sys.executable, "-m", "data_gen", "convert", src, "--out", str(tmp_path / "cut"),
           "--max-side", "200", "--shard-size", "2", "--workers", "1", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            m = mf.read(tmp_path / "cut")
            if m and m["shards"]:
                break
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    m = mf.read(tmp_path / "cut")
    assert m is not None and not m["complete"], "the run ended before it was killed"
    assert subprocess.run(cmd, env=env, capture_output=True, timeout=300).returncode == 0
    assert _files(tmp_path / "cut") == _files(tmp_path / "whole")


def _corrupt_set(tmp_path: Path) -> Path:
    src = _gen(tmp_path / "src", num_images=6)
    good = next((src / "class_0000").glob("*.jpg")).read_bytes()
    (src / "class_0001" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (src / "class_0002" / "garbage.jpg").write_bytes(b"not an image at all")
    return src


def test_a_corrupt_source_file_is_counted_and_named(tmp_path, capsys):
    src = _corrupt_set(tmp_path)
    assert data_gen_main(["convert", str(src), "--out", str(tmp_path / "out"), "--max-side",
                          "200", "--workers", "1", "--quiet"]) == 0
    out, err = capsys.readouterr()
    s = json.loads(out)
    assert s["failed"] == 2 and s["converted"] == 6
    assert "'class_0001/truncated.jpg'" in err and "'class_0002/garbage.jpg'" in err
    m = mf.read(tmp_path / "out")
    assert sorted(n for n, _ in m["summary"]["failed_files"]) == [
        "class_0001/truncated.jpg", "class_0002/garbage.jpg"]
    assert len(open_source(tmp_path / "out").names) == 6


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            if p.is_file() else "dir" for p in sorted(root.rglob("*"))}


def test_nothing_outside_out_is_written_and_the_source_is_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_FEED_LISTING_CACHE", "off")
    src = _corrupt_set(tmp_path / "data")
    work = tmp_path / "data"
    before = _tree(work)
    convert(_cfg(src, work / "out", workers=2), progress=False)
    after = _tree(work)
    assert {k: v for k, v in after.items() if not k.startswith("out")} == before
    assert sorted(p.name for p in (work / "out").iterdir()) == [
        mf.MANIFEST, "shard-000000.tar", "shard-000001.tar"]


def test_refusals_are_one_line_naming_the_option(sets, tmp_path, capsys):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    ours = tmp_path / "ours"
    convert(_cfg(sets["folder"], ours), progress=False)
    cases = [
        (["--out", str(foreign)], "was not written by data_gen convert"),
        (["--out", str(ours), "--max-side", "300"], "other parameters (params: max_side"),
        (["--out", str(sets["folder"] / "inside")], "is inside the source"),
        (["--out", str(tmp_path / "x"), "--quality", "0"], "quality=0 (--quality)"),
    ]
    for extra, message in cases:
        assert data_gen_main(["convert", str(sets["folder"]), "--max-side", "200",
                              "--shard-size", "4", "--workers", "1", "--quiet", *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert (foreign / "notes.txt").read_text() == "mine" and len(list(foreign.iterdir())) == 1
    # the finished conversion again: verified, nothing to do, the same bytes
    files = _files(ours)
    assert data_gen_main(["convert", str(sets["folder"]), "--out", str(ours), "--max-side",
                          "200", "--shard-size", "4", "--workers", "1", "--quiet"]) == 0
    assert _files(ours) == files


def test_the_loaders_and_the_suite_read_the_result(sets, tmp_path):
    from compare.suite import main as suite
    from pipelines import AugmentSpec, LoaderConfig, create_loader

    out = tmp_path / "out"
    convert(_cfg(sets["folder"], out), progress=False)
    cfg = LoaderConfig(root=out, batch_size=4, device="cpu", num_workers=1, debug_indices=True,
                       augment=AugmentSpec(size=32), seed=2)
    with create_loader("pageable", cfg) as ld:
        labels = [y.clone() for _, y in ld]
        assert sorted(ld.last_indices.tolist()) == list(range(N))
    assert sorted(int(v) for y in labels for v in y) == sorted(_converted(out).values())
    assert suite(["--data", str(out), "--model", "none", "--backends", "pageable", "--steps",
                  "2", "--warmup", "1", "--repeats", "1", "--no-ceiling", "--workers", "1",
                  "--batch-size", "4", "--out", str(tmp_path / "run")]) == 0


def test_224px_crops_of_the_converted_set_match_the_originals(tmp_path):
    """For the same crop draws (RandomResizedCrop's, relative to the image: the same box in
    each image's own pixels, resized by PIL with a fractional box so that no rounding moves
    it), the 224 px inputs from photos converted to a 512 px side differ from the original's
    by a mean absolute difference of at most 2 levels of 255."""
    import tarfile

    import torch
    from torchvision.transforms import v2

    src = _gen(tmp_path / "src", num_images=8, width_range=(1400, 1800), quality_range=(90, 95))
    out = tmp_path / "out"
    convert(ConvertConfig(src=str(src), out=str(out), max_side=512, workers=1), progress=False)
    converted = {}
    for p in sorted(out.glob("shard-*.tar")):
        with tarfile.open(p) as tf:
            for ti in tf:
                if ti.name.endswith(".jpg"):
                    converted[mf.name_of(ti.name.rsplit(".", 1)[0])] = tf.extractfile(ti).read()
    assert len(converted) == 8
    rrc = v2.RandomResizedCrop(224, antialias=True)
    torch.manual_seed(0)
    diffs = []
    for rel, small in sorted(converted.items()):
        a = Image.open(src / rel).convert("RGB")
        b = Image.open(io.BytesIO(small)).convert("RGB")
        assert max(b.size) == 512
        sx, sy = b.size[0] / a.size[0], b.size[1] / a.size[1]
        for _ in range(8):
            p = rrc.make_params([torch.empty(3, a.size[1], a.size[0])])
            box = (p["left"], p["top"], p["left"] + p["width"], p["top"] + p["height"])
            ca = a.resize((224, 224), Image.BILINEAR, box=box)
            cb = b.resize((224, 224), Image.BILINEAR,
                          box=(box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy))
            diffs.append(np.abs(np.asarray(ca, np.float32) - np.asarray(cb, np.float32)).mean())
    assert 0 < float(np.mean(diffs)) <= 2.0, diffs


def test_a_bug_in_a_worker_reaches_the_caller(sets, tmp_path, monkeypatch):
    """Not a bad photo: an exception outside ``UNREADABLE`` in a worker process is re-raised
    by ``convert``, and the folder resumes afterwards."""
    from data_gen.convert import photo

    def broken(data, max_side, quality):
        raise RuntimeError("a bug in shrink")

    monkeypatch.setattr(photo, "shrink", broken)  # the forked workers inherit it
    with pytest.raises(RuntimeError, match="a bug in shrink"):
        convert(_cfg(sets["folder"], tmp_path / "out", workers=2), progress=False)
    monkeypatch.undo()
    m = convert(_cfg(sets["folder"], tmp_path / "out", workers=2), progress=False)
    assert m["summary"]["converted"] == N


def test_progress_shows_a_bar_with_an_eta_on_stderr(sets, tmp_path, capsys):
    convert(_cfg(sets["folder"], tmp_path / "out"), progress=True)
    out, err = capsys.readouterr()
    assert out == "" and "convert: 100%" in err and f"{N}/{N}" in err and "<00:00" in err


def test_a_manifest_that_lists_a_path_outside_out_is_not_trusted(sets, tmp_path):
    """A shard record is kept on resume only under its own name inside ``--out``."""
    out = tmp_path / "out"
    whole = convert(_cfg(sets["folder"], out), progress=False)
    (tmp_path / "shard-000000.tar").write_bytes((out / "shard-000000.tar").read_bytes())
    m = json.loads((out / mf.MANIFEST).read_text())
    m["shards"][0]["path"] = "../shard-000000.tar"
    (out / mf.MANIFEST).write_text(json.dumps(m))
    assert [r["path"] for r in mf.verified(out, m["shards"])] == [
        r["path"] for r in whole["shards"][1:]]
    assert _stable(convert(_cfg(sets["folder"], out), progress=False)) == _stable(whole)


def test_a_file_listed_twice_stays_two_samples(sets, tmp_path):
    """Consecutive members with one key are one sample to WebDataset: repeated names get
    ``#N`` keys, so both rows survive whatever their order."""
    rows = (sets["list"] / "labels.csv").read_text().splitlines()
    first = rows[1]
    lst = sets["list"] / "twice.csv"
    try:
        lst.write_text("\n".join([rows[0], first, first, *rows[2:]]) + "\n")
        convert(_cfg(str(lst), tmp_path / "out", shard_size=100), progress=False)
    finally:
        lst.unlink()
    names = _converted_names(tmp_path / "out")
    path = first.split(",")[0]
    assert len(names) == N + 1 and names.count(path) == 1 and names.count(path + "#2") == 1


def _converted_names(out: Path) -> list[str]:
    return [mf.name_of(n.split(".tar/", 1)[1].rsplit(".", 1)[0]) for n in open_source(out).names]


def test_a_run_killed_while_writing_its_first_manifest_resumes(sets, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".manifest.json.tmp").write_text('{"generator": "gpu-feed data_gen conv')
    m = convert(_cfg(sets["folder"], out), progress=False)
    assert m["complete"] and not (out / ".manifest.json.tmp").exists()
