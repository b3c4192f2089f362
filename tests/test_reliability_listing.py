"""Issue 40, classes 1, 4 (lists and shards) and 7 (URL roots): the listing cache never changes
what is read, labels are plausible class indices, and URL roots other than remote shards are
refused by name.

Every test points the caches at its own ``tmp_path`` (``GPU_FEED_LISTING_CACHE`` and
``GPU_FEED_CACHE``), so the user's cache is never touched.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from pipelines import AugmentSpec, LoaderConfig, create_loader
from pipelines.sources import cache as listcache
from pipelines.sources import root as sources_mod
from pipelines.sources import shards as shards_mod
from pipelines.sources.folder import IMAGE_EXTENSIONS, DatasetRootError, walk_folder
from pipelines.sources.lists import index_limit, list_file
from pipelines.sources.root import list_dataset, source_kind
from pipelines.sources.shards import ShardError, list_shards
from tests.utils import jpeg

BACKENDS = ["dali", "pinned", "pageable"]
OLD = time.time() - 120  # older than RACY_S: a listing or index of it may be cached


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("GPU_FEED_LISTING_CACHE", str(folder / "listings"))
    monkeypatch.setenv("GPU_FEED_CACHE", str(folder))
    return folder / "listings"


def _cfg(root, **kw):
    base = dict(root=root, batch_size=4, device="cpu", num_workers=1, debug_indices=True,
                augment=AugmentSpec(size=32), seed=5)
    base.update(kw)
    return LoaderConfig(**base)


def _age(root: Path) -> None:
    for d in [root] + [p for p in root.rglob("*")]:
        os.utime(d, (OLD, OLD), follow_symlinks=False)


def _folder(root: Path, seed: int, classes=("a", "b", "c"), per=4) -> Path:
    """An ImageFolder whose images depend on ``seed`` (two seeds: same names, other pixels)."""
    for ci, c in enumerate(classes):
        (root / c).mkdir(parents=True)
        for i in range(per):
            (root / c / f"{i}.jpg").write_bytes(jpeg(40 + 8 * ci, 32, seed=seed * 100 + ci * 10 + i))
    _age(root)
    return root


def _walks(monkeypatch):
    calls = []
    orig = sources_mod.walk_folder
    monkeypatch.setattr(sources_mod, "walk_folder",
                        lambda *a, **k: calls.append(1) or orig(*a, **k))
    return calls


def _entries(folder: Path):
    return sorted(p for p in folder.glob("*.npz"))


def _rel(paths, root) -> list:
    return [os.path.relpath(p, root) for p in paths]


def _batches(loader):
    return [(x.clone(), y.clone()) for x, y in loader]


def _same(a, b):
    assert len(a) == len(b) and len(a) > 0
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(ya, yb)
        assert torch.equal(xa, xb)


# == class 1: the listing cache never changes what is read ===================================
def test_a_relative_root_cached_from_one_cwd_reads_the_right_files_from_another(
        cache, tmp_path, monkeypatch):
    a = _folder(tmp_path / "A" / "data", seed=1)
    _folder(tmp_path / "B" / "data", seed=2)  # same names, other pixels: a decoy
    calls = _walks(monkeypatch)
    monkeypatch.chdir(tmp_path / "A")
    first = list_dataset("data")
    assert first[0][0] == os.path.join("data", "a", "0.jpg") and len(_entries(cache)) == 1
    monkeypatch.chdir(tmp_path / "B")
    paths, labels, classes = list_dataset("../A/data")  # A's folder, spelled from B
    assert len(calls) == 1  # from the cache
    assert all(p.startswith(os.path.join("..", "A", "data") + os.sep) for p in paths)
    assert paths == walk_folder("../A/data")[0][0]
    assert np.array_equal(labels, first[1]) and classes == first[2]
    for p in paths:  # A's bytes, never B's
        assert os.path.realpath(p).startswith(str(a.resolve()) + os.sep)
        assert Path(p).read_bytes() == (a / os.path.relpath(p, "../A/data")).read_bytes()
    # B's own "data" is another folder: its own entry, its own images
    mine = list_dataset("data")
    assert len(calls) == 2 and Path(mine[0][0]).read_bytes() != Path(paths[0]).read_bytes()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_relative_root_from_another_cwd_loads_the_same_batches_on_every_backend(
        backend, cache, tmp_path, monkeypatch):
    a = _folder(tmp_path / "A" / "data", seed=1)
    _folder(tmp_path / "B" / "data", seed=2)
    monkeypatch.setenv("GPU_FEED_LISTING_CACHE", "off")
    with create_loader(backend, _cfg(a)) as ref:  # absolute, no cache: the truth
        want = _batches(ref)
    monkeypatch.setenv("GPU_FEED_LISTING_CACHE", str(cache))
    monkeypatch.chdir(tmp_path / "A")
    list_dataset("data")  # cached with A's spelling
    assert len(_entries(cache)) == 1
    monkeypatch.chdir(tmp_path / "B")
    with create_loader(backend, _cfg("../A/data")) as b:
        assert all(os.path.realpath(p).startswith(str(a.resolve())) for p in b.paths)
        got = _batches(b)
    _same(want, got)


def test_a_symlinked_root_and_a_second_spelling_give_the_same_listing(cache, tmp_path, monkeypatch):
    real = _folder(tmp_path / "real" / "data", seed=3)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    other = tmp_path / "real" / ".." / "real" / "data"  # a second spelling, not normalised
    calls = _walks(monkeypatch)
    base = list_dataset(real)
    for root in (link, other, str(link) + "/"):
        paths, labels, classes = list_dataset(root)
        assert all(p.startswith(str(Path(root)) + os.sep) for p in paths), root
        assert _rel(paths, root) == _rel(base[0], real)
        assert np.array_equal(labels, base[1]) and classes == base[2]
    assert len(calls) == 1  # one walk, one entry, every spelling served from it
    assert len(_entries(cache)) == 1


def test_the_walks_warnings_from_the_cache_name_the_callers_spelling(cache, tmp_path, monkeypatch):
    real = _folder(tmp_path / "real" / "data", seed=3)
    (real / "a" / "notes.txt").write_bytes(b"x")
    _age(real)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    calls = _walks(monkeypatch)
    with pytest.warns(RuntimeWarning, match="skipped 1 files") as first:
        list_dataset(real)
    with pytest.warns(RuntimeWarning, match="skipped 1 files") as again:
        list_dataset(link)
    assert len(calls) == 1
    msg = str(again[0].message)
    assert f"root={str(link)!r}" in msg and f"{link}/a/notes.txt" in msg
    assert str(real) not in msg and str(real) in str(first[0].message)


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_through_a_symlinked_root_with_the_cache_on(backend, cache, tmp_path):
    real = _folder(tmp_path / "real" / "data", seed=3)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    with create_loader(backend, _cfg(real)) as ref:  # caches the listing with real's spelling
        n = len(ref)
        full = _batches(ref)
        fresh = ref.state_dict()
    assert len(_entries(cache)) == 1
    k = n // 2
    with create_loader(backend, _cfg(link)) as a:  # from the cache
        assert a.state_dict()["listing"] == fresh["listing"]
        it = iter(a)
        for _ in range(k):
            next(it)
        state = a.state_dict()
        it.close()
    with create_loader(backend, _cfg(real)) as b:
        b.load_state_dict(json.loads(json.dumps(state)))  # refused before: two listing hashes
        rest = _batches(b)
    _same(full[k:], rest)
    with create_loader(backend, _cfg(link)) as c:  # and the other way round
        c.load_state_dict(fresh)


def _damage(kind: str, file: Path) -> None:
    data = file.read_bytes()
    if kind == "zero":
        file.write_bytes(b"")
    elif kind == "truncated":
        file.write_bytes(data[: len(data) // 2])
    elif kind == "garbage":
        file.write_bytes(os.urandom(4096))
    elif kind == "zip-garbage":  # a zip signature, then junk: BadZipFile
        file.write_bytes(b"PK\x03\x04" + os.urandom(500))
    elif kind == "pickle":  # what np.load refuses without allow_pickle
        file.write_bytes(b"\x80\x04\x95" + os.urandom(100))
    elif kind == "directory":
        file.unlink()
        file.mkdir()
    else:
        raise AssertionError(kind)


DAMAGE = ["zero", "truncated", "garbage", "zip-garbage", "pickle", "directory"]


@pytest.mark.parametrize("kind", DAMAGE)
def test_a_damaged_listing_entry_is_a_miss_that_is_rebuilt(kind, cache, tmp_path, monkeypatch):
    root = _folder(tmp_path / "data", seed=4)
    calls = _walks(monkeypatch)
    want = list_dataset(root)
    (entry,) = _entries(cache)
    _damage(kind, entry)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not even a warning
        got = list_dataset(root)
    assert len(calls) == 2  # walked again
    assert got[0] == want[0] and np.array_equal(got[1], want[1]) and got[2] == want[2]
    if kind != "directory":  # rewritten whole: the next call is a hit again
        assert entry.is_file() and entry.stat().st_size > 0
        list_dataset(root)
        assert len(calls) == 2


def _rewrite(file: Path, **change) -> None:
    with np.load(file) as z:
        arrays = {k: z[k] for k in z.files}
    for k, v in change.items():
        if v is None:
            arrays.pop(k)
        else:
            arrays[k] = v
    with open(file, "wb") as f:
        np.savez(f, **arrays)


WRONG = {
    "no paths": dict(paths=None),
    "labels too short": "short",
    "labels out of range": "range",
    "labels as floats": "float",
    "an absolute path": "abs",
    "paths as an object array": dict(paths=np.array(["x"], dtype=object)),
    "two roots": dict(root=listcache._join(["a/", "b/"])),
}


@pytest.mark.parametrize("what", list(WRONG))
def test_a_listing_entry_with_wrong_arrays_is_a_miss(what, cache, tmp_path, monkeypatch):
    root = _folder(tmp_path / "data", seed=4)
    calls = _walks(monkeypatch)
    want = list_dataset(root)
    (entry,) = _entries(cache)
    change = WRONG[what]
    if change == "short":
        change = dict(labels=np.zeros(3, np.int64))
    elif change == "range":
        change = dict(labels=np.full(len(want[0]), 7, np.int64))
    elif change == "float":
        change = dict(labels=want[1].astype(np.float64))
    elif change == "abs":
        change = dict(paths=listcache._join(["/etc/passwd"] * len(want[0])))
    _rewrite(entry, **change)
    got = list_dataset(root)
    assert len(calls) == 2
    assert got[0] == want[0] and np.array_equal(got[1], want[1]) and got[2] == want[2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_damaged_listing_entry_builds_a_loader_on_every_backend(backend, cache, tmp_path):
    root = _folder(tmp_path / "data", seed=4)
    list_dataset(root)
    (entry,) = _entries(cache)
    for kind in ("zero", "truncated"):
        _damage(kind, entry)
        with create_loader(backend, _cfg(root)) as loader:
            assert len(loader.paths) == 12
            assert sum(len(y) for _, y in loader) == 12


def test_an_entry_of_the_old_version_with_absolute_paths_is_never_read(cache, tmp_path,
                                                                        monkeypatch):
    root = _folder(tmp_path / "data", seed=4)
    decoy = _folder(tmp_path / "decoy", seed=5)
    (decoy_paths, labels, classes), _ = walk_folder(decoy)
    current = listcache.VERSION
    monkeypatch.setattr(listcache, "VERSION", 1)
    key = listcache._key(str(root), IMAGE_EXTENSIONS, False)
    monkeypatch.setattr(listcache, "VERSION", current)
    dirs = [os.path.realpath(root)] + walk_folder(root)[1]
    cache.mkdir(parents=True)
    with open(cache / f"{key}.npz", "wb") as f:  # version 1's layout: the decoy's absolute paths
        np.savez(f, paths=listcache._join(decoy_paths), labels=labels,
                 classes=listcache._join(classes), dirs=listcache._join(dirs),
                 mtimes=listcache._mtimes(dirs), warnings=listcache._join([]))
    paths = list_dataset(root)[0]
    assert all(p.startswith(str(root) + os.sep) for p in paths)


def test_entries_are_written_durably(cache, tmp_path, monkeypatch):
    root = _folder(tmp_path / "data", seed=4)
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("fsync", fd)) or real_fsync(fd))
    monkeypatch.setattr(os, "replace",
                        lambda a, b: events.append(("replace", str(b))) or real_replace(a, b))
    list_dataset(root)
    kinds = [e[0] for e in events]
    assert "replace" in kinds and "fsync" in kinds[: kinds.index("replace")]  # file synced first
    assert kinds[-1] == "fsync"  # then the folder
    assert [p.name for p in cache.iterdir()] == [_entries(cache)[0].name]  # no temp file left
    monkeypatch.undo()


def test_a_failed_write_keeps_the_old_entry_and_leaves_no_temp_file(cache, tmp_path, monkeypatch):
    root = _folder(tmp_path / "data", seed=4)
    list_dataset(root)
    (entry,) = _entries(cache)
    before = entry.read_bytes()
    (root / "a" / "new.jpg").write_bytes(jpeg(seed=9))  # a change: the next call rewrites
    os.utime(root / "a", (OLD + 1, OLD + 1))

    def boom(f, **arrays):
        f.write(b"PK\x03\x04 half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(listcache.np, "savez", boom)
    paths = list_dataset(root)[0]
    assert len(paths) == 13  # the walk's listing, whatever the cache did
    assert entry.read_bytes() == before and list(cache.iterdir()) == [entry]


# -- the shard index cache --------------------------------------------------------------------
def _tar(path: Path, members) -> Path:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            ti.mtime = int(OLD)
            tf.addfile(ti, io.BytesIO(data))
    os.utime(path, (OLD, OLD))
    return path


def _shard_set(folder: Path, labels_by_shard, kind="cls") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    k = 0
    for s, labels in enumerate(labels_by_shard):
        members = []
        for lab in labels:
            members.append((f"{k:04d}.jpg", jpeg(32, 32, seed=k)))
            data = (lab if isinstance(lab, str) else str(lab)).encode() if kind == "cls" else \
                json.dumps({"label": lab}).encode()
            members.append((f"{k:04d}.{kind}", data))
            k += 1
        _tar(folder / f"shard-{s:03d}.tar", members)
    return folder


@pytest.mark.parametrize("kind", DAMAGE)
def test_a_damaged_shard_index_entry_is_a_miss_that_is_rebuilt(kind, cache, tmp_path,
                                                                  monkeypatch):
    root = _shard_set(tmp_path / "wds", [[0, 1, 2], [1, 2, 0]])
    calls = []
    orig = shards_mod.index_shard
    monkeypatch.setattr(shards_mod, "index_shard", lambda p: calls.append(p) or orig(p))
    want = list_dataset(root)
    entries = _entries(cache / "shards")
    assert len(calls) == 2 and len(entries) == 2
    for e in entries:
        _damage(kind, e)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = list_dataset(root)
    assert len(calls) == 4  # indexed again
    assert got[0] == want[0] and np.array_equal(got[1], want[1]) and got[2] == want[2]
    if kind != "directory":
        list_dataset(root)
        assert len(calls) == 4  # rewritten: hits again


@pytest.mark.parametrize("what", ["offsets short", "keys short", "labels as floats",
                                  "no damage field", "odd problems"])
def test_a_shard_index_entry_with_wrong_arrays_is_a_miss(what, cache, tmp_path, monkeypatch):
    root = _shard_set(tmp_path / "wds", [[0, 1, 2]])
    want = list_dataset(root)
    (entry,) = _entries(cache / "shards")
    with np.load(entry) as z:
        offsets, labels = z["offsets"], z["labels"]
    change = {"offsets short": dict(offsets=offsets[:1]),
              "keys short": dict(keys=listcache._join(["0000"])),
              "labels as floats": dict(labels=labels.astype(np.float64)),
              "no damage field": dict(damage=None),
              "odd problems": dict(problems=listcache._join(["x"]), nproblems=np.int64(1))}[what]
    _rewrite(entry, **change)
    calls = []
    orig = shards_mod.index_shard
    monkeypatch.setattr(shards_mod, "index_shard", lambda p: calls.append(p) or orig(p))
    got = list_dataset(root)
    assert len(calls) == 1
    assert got[0] == want[0] and np.array_equal(got[1], want[1]) and got[2] == want[2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_damaged_shard_index_entry_builds_a_loader_on_every_backend(backend, cache, tmp_path):
    root = _shard_set(tmp_path / "wds", [[0, 1, 2, 0], [1, 2, 0, 1]])
    list_dataset(root)
    for kind in ("zero", "zip-garbage"):
        for e in _entries(cache / "shards"):
            _damage(kind, e)
        with create_loader(backend, _cfg(root)) as loader:
            assert len(loader.paths) == 8
            assert sum(len(y) for _, y in loader) == 8


# == class 4: labels from lists and shards ====================================================
def _list(tmp_path: Path, labels, suffix=".csv", seed=0) -> Path:
    img = tmp_path / "img"
    img.mkdir(exist_ok=True)
    rows = []
    for i, lab in enumerate(labels):
        (img / f"{i}.jpg").write_bytes(jpeg(32, 32, seed=seed + i))
        rows.append((f"img/{i}.jpg", lab))
    f = tmp_path / f"list{suffix}"
    if suffix == ".csv":
        f.write_text("path,label\n" + "".join(f"{p},{lab}\n" for p, lab in rows))
    else:
        f.write_text("".join(f"{p} {lab}\n" for p, lab in rows))
    return f


@pytest.mark.parametrize("suffix", [".csv", ".txt"])
def test_integer_valued_float_labels_in_a_list_are_indices(suffix, tmp_path):
    f = _list(tmp_path, ["2.0", "0.0", "10.0", "1.0", "2.0", "3"], suffix)
    paths, labels, classes = list_dataset(f)
    assert labels.tolist() == [2, 0, 10, 1, 2, 3]  # as text, "2.0" sorted after "10.0"
    assert classes == [str(i) for i in range(11)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_float_labels_reach_the_batches_as_indices_on_every_backend(backend, tmp_path):
    f = _list(tmp_path, ["2.0", "0.0", "10.0", "1.0"])
    with create_loader(backend, _cfg(f, shuffle=False, batch_size=4)) as loader:
        (x, y), = list(loader)
        assert y.tolist() == [2, 0, 10, 1]
        assert len(loader.classes) == 11


@pytest.mark.parametrize("suffix", [".csv", ".txt"])
def test_a_huge_label_in_a_list_names_the_file_and_line(suffix, tmp_path):
    f = _list(tmp_path, ["0", "1", "3000000000", "2"], suffix)
    line = 4 if suffix == ".csv" else 3  # the CSV's header is line 1
    with pytest.raises(ValueError, match=rf"list{suffix}'?: line {line}: label '3000000000' is too large"):
        list_dataset(f)
    with pytest.warns(RuntimeWarning, match="dropped 1 rows"):  # under skip: counted, dropped
        paths, labels, classes = list_dataset(f, skip_bad=True)
    assert labels.tolist() == [0, 1, 2] and classes == ["0", "1", "2"]
    (tmp_path / "f").mkdir()
    float_huge = _list(tmp_path / "f", ["0", "3e9"], suffix)  # a float spelling of an id
    with pytest.raises(ValueError, match="line .*too large"):
        list_dataset(float_huge)


def test_the_index_bound_is_relative_to_the_rows_above_a_million(tmp_path):
    assert index_limit(3) == 1_000_000 and index_limit(10_000_000) == 40_000_000
    assert index_limit(10 ** 12) == 2 ** 31
    ok = _list(tmp_path, ["0", "999999"])
    assert len(list_dataset(ok)[2]) == 1_000_000  # a subset of a huge taxonomy is fine
    (tmp_path / "b").mkdir()
    bad = _list(tmp_path / "b", ["0", "1000000"])
    with pytest.raises(ValueError, match="line 3: label '1000000' is too large.*below 1,000,000"):
        list_file(bad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_huge_list_label_is_a_value_error_at_create_loader(backend, tmp_path):
    f = _list(tmp_path, ["0", "1", "3000000000.0"])
    with pytest.raises(ValueError, match="line 4: label '3000000000.0' is too large"):
        create_loader(backend, _cfg(f))


@pytest.mark.parametrize("kind", ["cls", "json"])
def test_integer_valued_float_labels_in_shards_are_indices(kind, cache, tmp_path):
    labels = [2.0, 0.0, 10.0, 1.0] if kind == "json" else ["2.0", "0.0", "10.0", "1.0"]
    root = _shard_set(tmp_path / "wds", [labels], kind=kind)
    _, got, classes = list_dataset(root)
    assert got.tolist() == [2, 0, 10, 1] and classes == [str(i) for i in range(11)]


@pytest.mark.parametrize("label", ["3000000000", "5000000", "99999999999999999999999"])
def test_a_huge_shard_label_is_an_error_naming_the_shard_and_sample(label, cache, tmp_path):
    root = _shard_set(tmp_path / "wds", [[0, 1], [2, label, 1]])
    bad = str(root / "shard-001.tar")
    with pytest.raises(ShardError, match=rf"shard '{bad}', sample '0003':.*too large"):
        list_dataset(root)
    assert issubclass(ShardError, ValueError)
    with pytest.warns(RuntimeWarning, match="skipped 1 bad shards or samples"):
        s = list_shards(root, [".jpg"], skip_bad=True)
    assert s.labels.tolist() == [0, 1, 2, 1] and s.classes == ["0", "1", "2"]
    assert s.groups.tolist() == [2, 2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_huge_shard_label_is_a_value_error_at_create_loader(backend, cache, tmp_path):
    root = _shard_set(tmp_path / "wds", [[0, 1, 3_000_000_000]], kind="json")
    with pytest.raises(ValueError, match="shard-000.tar', sample '0002'.*too large"):
        create_loader(backend, _cfg(root))


# == class 7: URL roots ======================================================================
# remote shard roots are read (tests/test_remote.py); other schemes, and remote roots that
# name no .tar shards, are refused by name, before any request
URLS = ["s3://bucket/train", "gs://bucket/train-{000000..000009}.tar", "http://host/data/",
        "hf://datasets/x/y", "file:///data/train", "ftp://host/a.tar"]
REFUSED = r".*(scheme is not supported|must name .tar shards)"


@pytest.mark.parametrize("url", URLS)
def test_a_url_root_is_refused_by_the_config_in_the_users_spelling(url):
    with pytest.raises(DatasetRootError, match=REFUSED) as e:
        LoaderConfig(root=url)
    assert repr(url) in str(e.value)  # not Path's folded 's3:/bucket'


@pytest.mark.parametrize("url", URLS)
def test_a_url_root_is_refused_by_name(url):
    for call in (source_kind, list_dataset, sources_mod.open_source):
        for root in (url, Path(url)):  # Path folds '//': the check still sees the scheme
            with pytest.raises(DatasetRootError, match=REFUSED) as e:
                call(root)
            msg = str(e.value)
            assert "\n" not in msg and "does not exist" not in msg
            assert url.split(":")[0] in msg


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("url", ["s3://bucket/train", "gs://bucket/shard-{0..3}.tar"])
def test_a_url_root_is_refused_by_every_backend(backend, url):
    with pytest.raises(ValueError, match=r"root='.*': " + REFUSED):
        create_loader(backend, _cfg(url))


def test_a_local_folder_that_looks_like_a_url_is_read(tmp_path, monkeypatch, cache):
    monkeypatch.chdir(tmp_path)
    _folder(Path("s3:") / "bucket", seed=6)
    assert len(list_dataset("s3:/bucket")[0]) == 12
    assert len(list_dataset(LoaderConfig(root="s3://bucket").root)[0]) == 12
    assert source_kind("C:/nowhere").value == "folder"  # a drive letter is not a scheme
    shutil.rmtree("s3:")


@pytest.mark.parametrize("root", [b"/tmp", 3])
def test_a_root_that_is_not_a_str_path_is_a_type_error_naming_it(root):
    with pytest.raises(TypeError, match=r"root=.* must be a str or os.PathLike path"):
        list_dataset(root)
