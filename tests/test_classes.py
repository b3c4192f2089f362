"""One class list across splits (``LoaderConfig.classes``, ``pipelines.sources.classes``): the
ids of a split never depend on what it holds, on every backend and every source."""
from __future__ import annotations

import io
import os
import shutil
import tarfile
import warnings
from pathlib import Path

import pytest
import torch

from pipelines import AugmentSpec, LoaderConfig
from pipelines.sources.folder import DatasetRootError
from pipelines.sources.root import open_source
from tests.utils import make

BACKENDS = ["dali", "pinned", "pageable"]
NAMES = ["cat", "dog", "fox"]


def _cfg(root, **kw):
    base = dict(root=root, batch_size=4, device="cpu", num_workers=1, shuffle=False,
                augment=AugmentSpec(size=16))
    base.update(kw)
    return LoaderConfig(**base)


def _skip(backend):
    if backend == "dali":
        pytest.importorskip("nvidia.dali")


def _labels(backend, cfg) -> tuple[dict[str, int | list[float]], object]:
    """``{file name: label}`` of one epoch on ``backend``, and the loader (closed)."""
    out: dict[str, int | list[float]] = {}
    with make(backend, cfg) as ld:
        for b in ld:
            for i, y in zip(b.indices.tolist(), b.labels.cpu()):
                out[os.path.basename(ld.paths[i])] = y.tolist()
    return out, ld


@pytest.fixture(scope="module")
def jpegs(tiny_root) -> list[bytes]:
    return [p.read_bytes() for p in sorted(Path(tiny_root).rglob("*.jpg"))[:12]]


def _folder(root: Path, classes: list[str], jpegs: list[bytes]) -> Path:
    """``root/<class>/<class>_<k>.jpg``, two images per class."""
    for c in classes:
        (root / c).mkdir(parents=True)
        for k in range(2):
            (root / c / f"{c}_{k}.jpg").write_bytes(jpegs[(NAMES + ["owl"]).index(c) * 2 + k])
    return root


def _list(path: Path, rows: list[tuple[str, str]], jpegs: list[bytes]) -> Path:
    """A CSV list of ``(file, label)`` rows; each file a JPEG beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for k, (name, _) in enumerate(rows):
        (path.parent / name).write_bytes(jpegs[k % len(jpegs)])
    path.write_text("path,label\n" + "".join(f"{n},{y}\n" for n, y in rows))
    return path


def _shards(folder: Path, samples: list[tuple[str, str, str]], jpegs: list[bytes]) -> Path:
    """One tar of ``(key, label member ext, label text)`` samples."""
    folder.mkdir(parents=True)
    with tarfile.open(folder / "s-000000.tar", "w") as tf:
        for k, (key, ext, text) in enumerate(samples):
            for name, data in ((f"{key}.jpg", jpegs[k % len(jpegs)]),
                               (f"{key}.{ext}", text.encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return folder


# -- the option ----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, kind", [(0, ValueError), (2**24 + 1, ValueError), (True, TypeError),
                                       ("cat", TypeError), ({"cat": 0}, TypeError),
                                       ([], ValueError), (["cat", "cat"], ValueError),
                                       (["cat", ""], ValueError), (["cat", 3], ValueError)])
def test_a_bad_classes_is_refused_naming_it(tmp_path, bad, kind):
    with pytest.raises(kind, match=r"^classes="):
        LoaderConfig(tmp_path, classes=bad)


def test_classes_is_stored_as_a_tuple_or_a_count_and_refused_without_class_targets(tmp_path):
    assert LoaderConfig(tmp_path, classes=["b", "a"]).classes == ("b", "a")  # the order is the ids
    assert LoaderConfig(tmp_path, classes=10).classes == 10
    for target in ("none", ("age",), lambda rel: 0):
        with pytest.raises(ValueError, match="classes fixes class ids, and target="):
            LoaderConfig(tmp_path, classes=3, target=target)


# -- folders -------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_folder_missing_a_class_keeps_the_ids(tmp_path, jpegs, backend):
    _skip(backend)
    train = _folder(tmp_path / "train", NAMES, jpegs)
    val = _folder(tmp_path / "val", ["cat", "fox"], jpegs)
    with make("pageable", _cfg(train)) as ld:
        classes = list(ld.classes)
    assert classes == NAMES
    got, _ = _labels(backend, _cfg(val))  # the old way: fox renumbered to 1
    assert got["fox_0.jpg"] == 1
    got, ld = _labels(backend, _cfg(val, classes=classes))
    assert list(ld.classes) == NAMES
    assert got == {"cat_0.jpg": 0, "cat_1.jpg": 0, "fox_0.jpg": 2, "fox_1.jpg": 2}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_class_folder_outside_the_list_is_an_error_or_a_counted_skip(tmp_path, jpegs, backend):
    _skip(backend)
    val = _folder(tmp_path / "val", ["cat", "owl", "fox"], jpegs)
    with pytest.raises(DatasetRootError, match=r"class folder 'owl' \(2 samples.*not in classes"):
        make(backend, _cfg(val, classes=NAMES))
    with pytest.warns(RuntimeWarning, match=r"skipped 2 samples of 1 classes.*'owl' \(2\)"):
        got, ld = _labels(backend, _cfg(val, classes=NAMES, on_bad_file="skip"))
    assert got == {"cat_0.jpg": 0, "cat_1.jpg": 0, "fox_0.jpg": 2, "fox_1.jpg": 2}
    assert ld.stats["bad_files"] == 2
    assert sorted(os.path.basename(p) for p, _ in ld.stats["bad"]) == ["owl_0.jpg", "owl_1.jpg"]
    assert all("'owl' is not in classes" in why for _, why in ld.stats["bad"])


def test_a_count_names_the_folders_by_id_and_empty_folders_follow_allow_empty(tmp_path, jpegs):
    root = tmp_path / "ids"
    for c in ("0", "2"):
        (root / c).mkdir(parents=True)
        (root / c / "a.jpg").write_bytes(jpegs[0])
    s = open_source(root, classes=3)
    assert s.classes == ["0", "1", "2"] and s.labels.tolist() == [0, 2]
    (root / "1").mkdir()  # a class of the list with no image: refused, as without classes
    with pytest.raises(DatasetRootError, match=r"1 class folder\(s\) hold no .* '1'"):
        open_source(root, classes=3)
    assert open_source(root, classes=3, allow_empty=True).labels.tolist() == [0, 2]
    shutil.rmtree(root / "1")
    (root / "9").mkdir()  # outside the list, even empty: refused naming it, skipped under skip
    with pytest.raises(DatasetRootError, match=r"class folder '9' \(no image\) is not in classes"):
        open_source(root, classes=3, allow_empty=True)
    assert open_source(root, classes=3, skip_bad=True).labels.tolist() == [0, 2]


def test_the_listing_cache_serves_every_class_list(tmp_path, jpegs, monkeypatch):
    """One cache entry, three class lists: each gets its own labels, and a second read (a
    cache hit) the same as the first."""
    monkeypatch.setenv("GPU_FEED_LISTING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("pipelines.sources.cache.RACY_S", 0.0)
    val = _folder(tmp_path / "val", ["cat", "fox"], jpegs)
    os.utime(val, (1, 1))
    for d in val.iterdir():
        os.utime(d, (1, 1))
    cases = [(None, [0, 0, 1, 1]), (NAMES, [0, 0, 2, 2]), (["fox", "cat"], [1, 1, 0, 0]),
             (None, [0, 0, 1, 1])]
    for classes, want in cases + cases:
        s = open_source(val, classes=classes)
        assert s.labels.tolist() == want, classes
    assert len(list((tmp_path / "cache").glob("*.npz"))) >= 1


def test_the_resume_state_tells_the_fixed_ids_apart(tmp_path, jpegs):
    val = _folder(tmp_path / "val", ["cat", "fox"], jpegs)
    with make("pageable", _cfg(val, classes=NAMES)) as ld:
        state = ld.state_dict()
    with make("pageable", _cfg(val, classes=NAMES)) as ld:
        ld.load_state_dict(state)
    with make("pageable", _cfg(val)) as ld, pytest.raises(ValueError, match="listing"):
        ld.load_state_dict(state)


# -- file lists ----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_list_missing_a_class_keeps_the_ids_by_name_and_by_id(tmp_path, jpegs, backend):
    _skip(backend)
    by_name = _list(tmp_path / "n" / "val.csv", [("a.jpg", "cat"), ("b.jpg", "fox")], jpegs)
    got, ld = _labels(backend, _cfg(by_name, classes=NAMES))
    assert got == {"a.jpg": 0, "b.jpg": 2} and list(ld.classes) == NAMES
    by_id = _list(tmp_path / "i" / "val.csv", [("a.jpg", "0"), ("b.jpg", "2")], jpegs)
    got, ld = _labels(backend, _cfg(by_id, classes=NAMES))  # ids index the names
    assert got == {"a.jpg": 0, "b.jpg": 2} and list(ld.classes) == NAMES
    got, ld = _labels(backend, _cfg(by_id, classes=1000))
    assert got == {"a.jpg": 0, "b.jpg": 2} and len(ld.classes) == 1000


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_list_label_outside_the_list_is_an_error_or_a_counted_skip(tmp_path, jpegs, backend):
    _skip(backend)
    names = _list(tmp_path / "n" / "val.csv", [("a.jpg", "cat"), ("b.jpg", "owl")], jpegs)
    with pytest.raises(DatasetRootError, match=r"label 'owl' .*'.*b\.jpg'\) is not in classes"):
        make(backend, _cfg(names, classes=NAMES))
    ids = _list(tmp_path / "i" / "val.csv", [("a.jpg", "1"), ("b.jpg", "3")], jpegs)
    with pytest.raises(DatasetRootError, match=r"label '3' \(an id\).*classes=3: ids 0\.\.2"):
        make(backend, _cfg(ids, classes=3))
    with pytest.warns(RuntimeWarning, match="skipped 1 samples"):
        got, ld = _labels(backend, _cfg(ids, classes=3, on_bad_file="skip"))
    assert got == {"a.jpg": 1} and ld.stats["bad_files"] == 1


# -- tar shards ----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_shards_keep_the_ids_and_skip_outside_ones_counted(tmp_path, jpegs, backend):
    _skip(backend)
    root = _shards(tmp_path / "wds", [("a", "cls", "0"), ("b", "cls", "4"), ("c", "cls", "2"),
                                      ("d", "cls", "7")], jpegs)
    with pytest.raises(DatasetRootError, match=r"label '7' \(an id\).*d\.jpg.*classes=5"):
        make(backend, _cfg(root, classes=5))
    with pytest.warns(RuntimeWarning, match="skipped 1 samples"):
        got, ld = _labels(backend, _cfg(root, classes=5, on_bad_file="skip"))
    assert got == {"a.jpg": 0, "b.jpg": 4, "c.jpg": 2}
    assert list(ld.classes) == ["0", "1", "2", "3", "4"] and ld.stats["bad_files"] == 1
    assert len(ld) == 1  # the plan holds the three samples left (groups follow)
    with pytest.warns(RuntimeWarning, match="skipped 1 samples"), make(
            backend, _cfg(root, classes=5, on_bad_file="skip", batch_size=2)) as ld2:
        assert len(ld2) == 2


# -- multi-label ---------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_multilabel_targets_use_the_same_list(tmp_path, jpegs, backend):
    _skip(backend)
    lst = _list(tmp_path / "m" / "val.csv", [("a.jpg", "fox"), ("b.jpg", "cat;fox")], jpegs)
    got, ld = _labels(backend, _cfg(lst, target="multilabel", classes=NAMES))
    assert got == {"a.jpg": [0.0, 0.0, 1.0], "b.jpg": [1.0, 0.0, 1.0]}
    assert list(ld.classes) == NAMES
    owl = _list(tmp_path / "o" / "val.csv", [("a.jpg", "fox"), ("b.jpg", "cat;owl")], jpegs)
    with pytest.raises(DatasetRootError, match="label 'owl'"):
        make(backend, _cfg(owl, target="multilabel", classes=NAMES))
    with pytest.warns(RuntimeWarning, match="skipped 1 samples"):
        got, ld = _labels(backend, _cfg(owl, target="multilabel", classes=NAMES,
                                        on_bad_file="skip"))
    assert got == {"a.jpg": [0.0, 0.0, 1.0]} and ld.stats["bad_files"] == 1
    root = _shards(tmp_path / "wds", [("a", "txt", "1"), ("b", "txt", "0 3")], jpegs)
    s = open_source(root, target="multilabel", classes=4)
    assert s.classes == ["0", "1", "2", "3"]
    assert s.targets is not None and s.targets.tolist() == [[0, 1, 0, 0], [1, 0, 0, 1]]


def test_mix_counts_the_fixed_classes(tmp_path, jpegs):
    from pipelines.transforms.mix import MixSpec

    val = _folder(tmp_path / "val", ["cat", "fox"], jpegs)
    with make("pageable", _cfg(val, classes=NAMES, mix=MixSpec(mixup_alpha=0.2))) as ld:
        b = next(iter(ld))
    assert b.labels.shape == (4, 3) and torch.all(b.labels[:, 1] == 0)


def test_no_warning_and_nothing_skipped_when_every_class_is_listed(tmp_path, jpegs):
    val = _folder(tmp_path / "val", NAMES, jpegs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = open_source(val, classes=list(reversed(NAMES)), skip_bad=True)
    assert s.skipped == () and s.labels.tolist() == [2, 2, 1, 1, 0, 0]


def test_remote_shards_keep_the_ids_and_skip_outside_ones_counted(tmp_path, jpegs, monkeypatch):
    from tests.remote_server import FaultyServer

    monkeypatch.setenv("GPU_FEED_LISTING_CACHE", str(tmp_path / "cache"))
    folder = _shards(tmp_path / "wds", [("a", "cls", "0"), ("b", "cls", "7"), ("c", "cls", "2")],
                     jpegs)
    with FaultyServer(str(folder)) as srv:
        root = f"{srv.url}/s-{{000000..000000}}.tar"
        with pytest.raises(DatasetRootError, match=r"label '7' \(an id\).*classes=3"):
            make("pageable", _cfg(root, classes=3))
        with pytest.warns(RuntimeWarning, match="skipped 1 samples"):
            got, ld = _labels("pageable", _cfg(root, classes=3, on_bad_file="skip"))
    assert got == {"a.jpg": 0, "c.jpg": 2} and ld.stats["bad_files"] == 1


def test_every_id_of_a_large_count_is_valid_in_a_small_split(tmp_path, jpegs):
    """Without classes, an id past ``index_limit`` (a million for a small list) is taken for a
    typo; with a count above it, every id below the count is a class."""
    from pipelines.sources.lists import MIN_CLASS_LIMIT

    n = MIN_CLASS_LIMIT + 10
    lst = _list(tmp_path / "l" / "val.csv", [("a.jpg", "3"), ("b.jpg", str(n - 1))], jpegs)
    with pytest.raises(ValueError, match="too large to be a class index"):
        open_source(lst)
    s = open_source(lst, classes=n)
    assert s.labels.tolist() == [3, n - 1] and len(s.classes) == n
    root = _shards(tmp_path / "wds", [("a", "cls", "3"), ("b", "cls", str(n - 1))], jpegs)
    with pytest.raises(DatasetRootError, match="too large to be a class index"):
        open_source(root)
    assert open_source(root, classes=n).labels.tolist() == [3, n - 1]
