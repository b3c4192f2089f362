"""Issue 55, class 3, data_gen's share: ``--out s3://...`` after an interrupted upload
recognises its own unfinished upload and resumes or replaces it without ``--force``, and still
never replaces a foreign object silently (data_gen/upload.py NOTE [upload]). S3 is moto's
server on loopback."""
from __future__ import annotations

import pytest

from data_gen import upload
from data_gen.__main__ import main
from tests.remote_server import moto_s3

GEN = ["--format", "wds", "--num-images", "30", "--classes", "3", "--seed", "5", "--width-range",
       "40,64", "--shard-size", "8", "--workers", "1", "--quiet"]


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as (_, fs):
        yield fs


def _objects(fs, prefix: str) -> dict[str, bytes]:
    fs.invalidate_cache(prefix)
    return {p[len(prefix) + 1:]: fs.cat_file(p) for p in fs.find(prefix)}


def _interrupt_after(monkeypatch, n: int) -> list[str]:
    """Make ``Bucket.put`` raise KeyboardInterrupt after ``n`` uploads; the names uploaded."""
    real, done = upload.Bucket.put, []

    def put(self, local, rel):
        if len(done) == n:
            raise KeyboardInterrupt
        done.append(rel)
        real(self, local, rel)

    monkeypatch.setattr(upload.Bucket, "put", put)
    return done


def _counting(monkeypatch) -> list[str]:
    real, done = upload.Bucket.put, []

    def put(self, local, rel):
        done.append(rel)
        real(self, local, rel)

    monkeypatch.setattr(upload.Bucket, "put", put)
    return done


def test_an_interrupted_upload_is_resumed_without_force(s3, tmp_path, monkeypatch, capsys):
    local = tmp_path / "local"
    assert main([*GEN, "--out", str(local)]) == 0
    want = {p.name: p.read_bytes() for p in local.iterdir()}
    _interrupt_after(monkeypatch, 2)
    assert main([*GEN, "--out", "s3://bucket/resume"]) == 130
    assert set(_objects(s3, "bucket/resume")) - {upload.UPLOADING} == {
        "shard-000000.tar", "shard-000001.tar"}
    monkeypatch.undo()
    capsys.readouterr()
    put = _counting(monkeypatch)
    assert main([*GEN, "--out", "s3://bucket/resume"]) == 0, capsys.readouterr().err
    assert "2 of 4 objects are already there" in capsys.readouterr().err
    assert put == ["shard-000002.tar", "shard-000003.tar", "manifest.json"]
    assert _objects(s3, "bucket/resume") == want  # as a local run, and no marker left


def test_an_interrupted_upload_of_another_recipe_is_replaced(s3, tmp_path, monkeypatch, capsys):
    fewer = [*GEN, "--shard-size", "4"]  # 8 shards, then 4
    _interrupt_after(monkeypatch, 6)
    assert main([*fewer, "--out", "s3://bucket/other"]) == 130
    monkeypatch.undo()
    assert main([*GEN, "--out", "s3://bucket/other"]) == 0, capsys.readouterr().err
    local = tmp_path / "local"
    assert main([*GEN, "--out", str(local)]) == 0
    assert _objects(s3, "bucket/other") == {p.name: p.read_bytes() for p in local.iterdir()}


def test_a_foreign_object_beside_an_unfinished_upload_is_refused(s3, monkeypatch, capsys):
    _interrupt_after(monkeypatch, 1)
    assert main([*GEN, "--out", "s3://bucket/mixed"]) == 130
    monkeypatch.undo()
    s3.pipe_file("bucket/mixed/notes.txt", b"my notes")
    capsys.readouterr()
    assert main([*GEN, "--out", "s3://bucket/mixed"]) == 2
    err = capsys.readouterr().err
    assert "holds 1 objects (e.g. 'notes.txt')" in err and err.count("\n") == 1, err
    assert main([*GEN, "--out", "s3://bucket/mixed", "--force"]) == 0
    assert "held 1 objects: 0 replaced (same names), 1 left as they were" in capsys.readouterr().err
    after = _objects(s3, "bucket/mixed")
    assert after["notes.txt"] == b"my notes" and upload.UPLOADING not in after


def test_a_marker_data_gen_did_not_write_is_foreign(s3, capsys):
    s3.pipe_file(f"bucket/fake/{upload.UPLOADING}", b'{"files": ["shard-000000.tar"]}')
    s3.pipe_file("bucket/fake/shard-000000.tar", b"my own shard")
    assert main([*GEN, "--out", "s3://bucket/fake"]) == 2
    assert "holds 2 objects" in capsys.readouterr().err
    assert _objects(s3, "bucket/fake")["shard-000000.tar"] == b"my own shard"
