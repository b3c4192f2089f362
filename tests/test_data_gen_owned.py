"""Issue 55, class 1, data_gen's share: a re-run never deletes or overwrites what is the user's.

A file an earlier run listed but whose bytes changed since is the user's now, and so is
anything a linked folder in ``out`` leads to (data_gen/outdir.py ``survey``, data_gen/partial.py
NOTE [atomic output]).
"""
import hashlib
from pathlib import Path

import pytest

from data_gen.__main__ import main
from data_gen.generate import read_manifest

ARGS = ["--num-images", "6", "--classes", "2", "--seed", "5", "--width-range", "32,48",
        "--workers", "1", "--quiet"]


def _snapshot(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file()}


def _err_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("layout", ["folder", "list", "wds"])
def test_a_listed_file_edited_since_is_refused_by_name_and_kept(tmp_path, capsys, layout):
    out = tmp_path / "d"
    argv = ["--out", str(out), "--format", layout, *ARGS]
    assert main(argv) == 0
    capsys.readouterr()
    rel = sorted(f["path"] for f in read_manifest(out)["files"])[0]
    (out / rel).write_bytes((out / rel).read_bytes()[:-1] + b"!")  # same size, other bytes
    before = _snapshot(out)
    for again in (argv, [*argv, "--seed", "6"]):  # the same recipe, then another
        assert main(again) == 2
        err = _err_line(capsys)
        assert repr(rel) in err and "--force" in err
        assert _snapshot(out) == before
    # --force: it stays as yours, and a run that would write that very name is refused
    assert main([*argv, "--force"]) == 2
    assert repr(rel) in _err_line(capsys) and _snapshot(out) == before


def test_with_force_an_edited_file_at_a_name_the_run_no_longer_writes_stays(tmp_path, capsys):
    out = tmp_path / "d"
    assert main(["--out", str(out), *ARGS]) == 0
    capsys.readouterr()
    edited = out / "class_0001" / "img_0000005.jpg"
    edited.write_bytes(b"my edit")
    fewer = ["--out", str(out), *ARGS, "--num-images", "4", "--force"]
    assert main(fewer) == 0
    assert "1 files that data_gen did not write" in _err_line(capsys)
    assert edited.read_bytes() == b"my edit"
    assert "class_0001/img_0000005.jpg" not in {f["path"] for f in read_manifest(out)["files"]}


def test_with_force_nothing_is_written_through_a_linked_folder(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "img_0000000.jpg").write_bytes(b"my photo")
    out = tmp_path / "d"
    out.mkdir()
    (out / "class_0000").symlink_to(mine, target_is_directory=True)
    assert main(["--out", str(out), *ARGS, "--force"]) == 2
    assert "class_0000/img_0000000.jpg" in _err_line(capsys)
    assert _snapshot(mine) == {"img_0000000.jpg": hashlib.sha256(b"my photo").hexdigest()}
    assert sorted(p.name for p in out.iterdir()) == ["class_0000"]
