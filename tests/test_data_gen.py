import errno
import hashlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from data_gen.__main__ import main
from data_gen.generate import GenConfig, ensure_dataset, generate, read_manifest

gen = importlib.import_module("data_gen.generate")  # the package's ``generate`` is the function
_ONE = gen._one


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
    args = ["--out", str(tmp_path), "--num-images", "3", "--classes", "2", "--quiet"]
    assert main(args) == 2
    assert "--force" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0
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


# --- where data_gen writes: atomic output, resume, and what it may replace ------------------

TINY = dict(num_images=10, classes=3, seed=5, width_range=(32, 48), workers=1)
TINY_ARGS = ["--num-images", "10", "--classes", "3", "--seed", "5", "--width-range", "32,48",
             "--workers", "1", "--quiet"]


def _tiny(out, **kw):
    return generate(GenConfig(out=str(out), **{**TINY, **kw}), progress=False)


def _snapshot(root):
    """``{relative path: sha256}`` of every file under ``root``."""
    root = Path(root)
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file()}


def _partial(out):
    return Path(out).parent / f".{Path(out).name}.data_gen-partial"


def _assert_clean(out, clean):
    """``out`` holds exactly what a clean run made: same bytes, no extra files, no partial."""
    snap = _snapshot(out)
    listed = {f["path"]: f["sha256"] for f in read_manifest(out)["files"]}
    assert set(snap) == set(listed) | {"manifest.json"}
    assert {k: v for k, v in snap.items() if k != "manifest.json"} == listed
    assert listed == {f["path"]: f["sha256"] for f in clean["files"]}
    assert not _partial(out).exists()


def _one_line(err):
    err = err.strip()
    assert err and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A clean run of TINY, to compare against."""
    return _tiny(tmp_path_factory.mktemp("clean") / "d")


def _interrupt_after(monkeypatch, n):
    """Make the next in-process run (workers=1) stop with Ctrl-C after ``n`` images."""
    real, calls = _ONE, []

    def one(args):
        if len(calls) == n:
            raise KeyboardInterrupt
        calls.append(args[0])
        return real(args)

    monkeypatch.setattr(gen, "_one", one)
    return calls


def _count_images(monkeypatch):
    real, calls = _ONE, []

    def one(args):
        calls.append(args[0])
        return real(args)

    monkeypatch.setattr(gen, "_one", one)
    return calls


@pytest.mark.parametrize("victim_path", ["../victim", "absolute"])
def test_a_manifest_path_outside_out_is_refused_and_nothing_deleted(tmp_path, capsys, victim_path):
    out, victim = tmp_path / "d", tmp_path / "victim"
    _tiny(out)
    victim.write_text("not yours")
    p = str(victim) if victim_path == "absolute" else victim_path
    m = json.loads((out / "manifest.json").read_text())
    m["files"].append({"path": p})
    (out / "manifest.json").write_text(json.dumps(m))
    before = _snapshot(out)
    for force in ([], ["--force"]):
        assert main(["--out", str(out), *TINY_ARGS, "--seed", "6", *force]) == 2
        assert repr(p) in _one_line(capsys.readouterr().err)
    with pytest.raises(ValueError, match="victim"):
        ensure_dataset(GenConfig(out=str(out), **{**TINY, "seed": 6}), progress=False)
    assert victim.read_text() == "not yours"
    assert _snapshot(out) == before and not _partial(out).exists()


def test_an_interrupted_run_leaves_out_as_it_was_and_the_next_run_resumes(
        tmp_path, monkeypatch, clean):
    out = tmp_path / "d"
    _tiny(out, seed=99)  # an earlier output, to be replaced
    before = _snapshot(out)
    _interrupt_after(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        _tiny(out)
    assert _snapshot(out) == before  # untouched
    journal = _partial(out) / "journal.jsonl"
    assert len(journal.read_text().splitlines()) == 4
    with open(journal, "a") as f:  # a run killed while journalling, and while writing a file
        f.write('{"path": "class_0001/img_0000')
    (_partial(out) / "data" / "class_0001" / "img_0000004.jpg").write_bytes(b"half a jpeg")
    calls = _count_images(monkeypatch)
    _tiny(out)
    assert sorted(calls) == list(range(4, 10))  # the 4 journalled images were reused
    _assert_clean(out, clean)


@pytest.mark.slow
def test_a_run_killed_in_a_subprocess_resumes_to_a_clean_result(tmp_path, capsys):
    out = tmp_path / "d"
    args = ["--out", str(out), "--num-images", "300", "--classes", "3", "--width-range", "32,48",
            "--workers", "2", "--quiet"]
    proc = subprocess.Popen([sys.executable, "-m", "data_gen", *args],
                            cwd=Path(__file__).parents[1], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    journal = _partial(out) / "journal.jsonl"
    deadline = time.monotonic() + 60
    while not (journal.exists() and journal.read_text().count("\n") >= 5):
        assert proc.poll() is None and time.monotonic() < deadline, "finished before the kill"
        time.sleep(0.01)
    proc.send_signal(signal.SIGSTOP)  # it holds the partial folder: a second run is refused
    try:
        assert main(args) == 2
        assert "another data_gen run" in _one_line(capsys.readouterr().err)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not out.exists()
    assert main(args) == 0  # at once: its orphaned pool workers hold no lock
    _assert_clean(out, _tiny(tmp_path / "clean", num_images=300, seed=0, workers=2))


def test_a_partial_folder_of_another_recipe_is_replaced(tmp_path, monkeypatch, clean):
    out = tmp_path / "d"
    _interrupt_after(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        _tiny(out, seed=1)
    calls = _count_images(monkeypatch)
    _tiny(out)
    assert len(calls) == 10
    _assert_clean(out, clean)


@pytest.mark.parametrize("foreign, moves", [(False, 0), (True, 3)])
def test_an_interruption_while_moving_into_place_is_resumed(
        tmp_path, monkeypatch, clean, foreign, moves):
    """Ctrl-C after the old files are deleted: at the rename, or (beside a foreign file, which
    makes it move file by file) after the manifest and two images are moved."""
    out = tmp_path / "d"
    _tiny(out, seed=99)
    if foreign:
        (out / "notes.txt").write_text("mine")
    real, done = os.replace, []

    def replace(src, dst):
        if len(done) == moves:
            raise KeyboardInterrupt
        done.append(dst)
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        _tiny(out, force=foreign)
    monkeypatch.setattr(os, "replace", real)
    calls = _count_images(monkeypatch)
    _tiny(out, force=foreign)
    assert len(calls) == max(0, moves - 1)  # the images already moved out are made again
    if foreign:
        assert (out / "notes.txt").read_text() == "mine"
        (out / "notes.txt").unlink()
    _assert_clean(out, clean)


def test_a_folder_in_the_partial_folders_place_is_refused(tmp_path, capsys):
    out = tmp_path / "d"
    _partial(out).mkdir()
    (_partial(out) / "keep.txt").write_text("mine")
    assert main(["--out", str(out), *TINY_ARGS]) == 2
    assert "was not made by data_gen" in _one_line(capsys.readouterr().err)
    assert (_partial(out) / "keep.txt").read_text() == "mine" and not out.exists()


def test_force_writes_beside_foreign_files_and_warns_with_the_count(tmp_path, capsys, clean):
    out = tmp_path / "d"
    (out / "class_0000").mkdir(parents=True)
    mine = {"notes.txt": "a", "class_0000/photo.jpg": "b", "class_0000/img_0000099.jpg": "c"}
    for rel, text in mine.items():
        (out / rel).write_text(text)
    assert main(["--out", str(out), *TINY_ARGS]) == 2
    assert "--force" in _one_line(capsys.readouterr().err)
    assert set(_snapshot(out)) == set(mine) and not _partial(out).exists()
    for seed in ("5", "6"):  # the second run replaces the first one's files, not yours
        assert main(["--out", str(out), *TINY_ARGS, "--seed", seed, "--force"]) == 0
        assert "3 files" in _one_line(capsys.readouterr().err)
        snap = _snapshot(out)
        listed = {f["path"] for f in read_manifest(out)["files"]}
        assert set(snap) == listed | set(mine) | {"manifest.json"}
        assert all((out / rel).read_text() == text for rel, text in mine.items())
    assert not _partial(out).exists()


def test_a_foreign_file_beside_an_earlier_output_is_kept(tmp_path, capsys):
    out = tmp_path / "d"
    _tiny(out)
    (out / "class_0001" / "extra.jpg").write_text("mine")
    before = _snapshot(out)
    assert main(["--out", str(out), *TINY_ARGS, "--seed", "6"]) == 2
    assert "1 files that data_gen did not write" in _one_line(capsys.readouterr().err)
    assert _snapshot(out) == before
    assert main(["--out", str(out), *TINY_ARGS, "--seed", "6", "--force"]) == 0
    got = capsys.readouterr()
    assert "1 files" in _one_line(got.err)
    assert "replaced" in json.loads(got.out)  # the earlier output (seed 5) is gone: it says so
    assert main(["--out", str(out), *TINY_ARGS, "--seed", "6", "--force"]) == 0
    assert "replaced" not in json.loads(capsys.readouterr().out)  # the same recipe again
    assert (out / "class_0001" / "extra.jpg").read_text() == "mine"
    assert read_manifest(out)["args"]["seed"] == 6


def test_regenerating_with_fewer_classes_leaves_no_empty_class_folder(tmp_path):
    _tiny(tmp_path / "d", classes=5)
    m = _tiny(tmp_path / "d", classes=2, num_images=4)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [
        "class_0000", "class_0001", "manifest.json"]
    assert sorted(_snapshot(tmp_path / "d")) == sorted(
        [f["path"] for f in m["files"]] + ["manifest.json"])


@pytest.mark.parametrize("args, msg", [(["--num-images", "3", "--classes", "4"], "--classes"),
                                       (["--seed", "-1"], "--seed"),
                                       (["--workers", "0"], "--workers")])
def test_bad_options_are_named_and_nothing_is_written(tmp_path, capsys, args, msg):
    assert main(["--out", str(tmp_path / "x"), *TINY_ARGS, *args]) == 2
    assert msg in _one_line(capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kw", [dict(seed=True), dict(num_images=2.0), dict(classes=None),
                                dict(width_range=(32, True))])
def test_config_rejects_non_ints(tmp_path, kw):
    with pytest.raises(TypeError, match=next(iter(kw))):
        GenConfig(out=str(tmp_path), **{**TINY, **kw})


def test_an_unwritable_parent_gives_one_line(tmp_path, capsys):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        if os.access(parent, os.W_OK):
            pytest.skip("chmod does not stop this user (root)")
        assert main(["--out", str(parent / "d"), *TINY_ARGS]) == 2
        assert "--out" in _one_line(capsys.readouterr().err)
        assert list(parent.iterdir()) == []
    finally:
        parent.chmod(0o700)


def test_a_permission_error_gives_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    """The same as above, for root too: mkdir fails as it would in a read-only folder."""
    real = os.mkdir

    def mkdir(path, *a, **kw):
        if str(path).startswith(str(tmp_path)):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real(path, *a, **kw)

    monkeypatch.setattr(os, "mkdir", mkdir)
    assert main(["--out", str(tmp_path / "d"), *TINY_ARGS]) == 2
    err = _one_line(capsys.readouterr().err)
    assert "--out" in err and "Permission denied" in err
    assert list(tmp_path.iterdir()) == []


def test_out_under_a_file_gives_one_line(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert main(["--out", str(tmp_path / "f" / "d"), *TINY_ARGS]) == 2
    assert "--out" in _one_line(capsys.readouterr().err)
    assert (tmp_path / "f").read_text() == "x"


# --- ensure_dataset: the suite's cache ------------------------------------------------------

def test_ensure_dataset_reuses_a_matching_cache(tmp_path, monkeypatch):
    cfg = GenConfig(out=str(tmp_path / "c"), **TINY)
    ensure_dataset(cfg, progress=False)
    calls = _count_images(monkeypatch)
    before = _snapshot(tmp_path / "c")
    assert ensure_dataset(cfg, progress=False) == tmp_path / "c"
    assert calls == [] and _snapshot(tmp_path / "c") == before


def test_ensure_dataset_recovers_from_an_interrupted_run(tmp_path, monkeypatch, clean):
    cfg = GenConfig(out=str(tmp_path / "c"), **TINY)
    _interrupt_after(monkeypatch, 6)
    with pytest.raises(KeyboardInterrupt):
        ensure_dataset(cfg, progress=False)
    calls = _count_images(monkeypatch)
    ensure_dataset(cfg, progress=False)
    assert len(calls) == 4
    _assert_clean(tmp_path / "c", clean)


@pytest.mark.parametrize("stale", ["other recipe", "missing file", "bad-inputs corpus"])
def test_ensure_dataset_replaces_a_stale_earlier_output(tmp_path, clean, stale):
    out = tmp_path / "c"
    if stale == "bad-inputs corpus":
        from data_gen.bad_inputs import make_bad_inputs

        make_bad_inputs(out, good=4)
    else:
        _tiny(out, seed=5 if stale == "missing file" else 7, classes=4)
        if stale == "missing file":
            _tiny(out)
            (out / clean["files"][0]["path"]).unlink()
    ensure_dataset(GenConfig(out=str(out), **TINY), progress=False)
    _assert_clean(out, clean)


def test_ensure_dataset_refuses_foreign_files_without_mentioning_force(tmp_path):
    out = tmp_path / "c"
    _tiny(out, seed=7)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError) as ei:
        ensure_dataset(GenConfig(out=str(out), **TINY), progress=False)
    msg = str(ei.value)
    assert str(out) in msg and "delete it" in msg and "--force" not in msg
    assert (out / "notes.txt").read_text() == "mine" and read_manifest(out)["args"]["seed"] == 7


def test_the_suite_reports_a_foreign_file_in_its_cache_as_one_line(tmp_path, capsys, monkeypatch):
    from compare.__main__ import main as compare_main

    monkeypatch.setenv("GPU_FEED_CACHE", str(tmp_path))
    (tmp_path / "default-4-seed0").mkdir()
    (tmp_path / "default-4-seed0" / "notes.txt").write_text("mine")
    assert compare_main(["--num-images", "4", "--model", "none", "--device", "cpu"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert "GPU_FEED_CACHE" in err and "--force" not in err
    assert (tmp_path / "default-4-seed0" / "notes.txt").read_text() == "mine"
