"""File lists (``pipelines.sources.lists``): CSV, TSV and "path label" text behind the contract."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from pipelines import AugmentSpec, BadFileError, LoaderConfig, create_loader
from pipelines.sources.folder import list_samples
from pipelines.sources.root import list_dataset

BACKENDS = ["dali", "pinned", "pageable"]


def _cfg(root, **kw):
    base = dict(root=root, batch_size=4, device="cpu", num_workers=1, debug_indices=True,
                augment=AugmentSpec(size=32), seed=2)
    base.update(kw)
    return LoaderConfig(**base)


@pytest.fixture(scope="module")
def lists(tiny_root, tmp_path_factory):
    """The tiny folder as a CSV of class names, a TSV of ints and an ImageNet-val-style txt."""
    d = tmp_path_factory.mktemp("lists")
    paths, labels, classes = list_samples(tiny_root)
    rel = [os.path.relpath(p, d) for p in paths]
    (d / "names.csv").write_text("Path,Class,extra\n" + "".join(
        f"{r},{classes[k]},x\n" for r, k in zip(rel, labels)))
    (d / "ints.tsv").write_text("filename\tlabel\n" + "".join(
        f"{r}\t{k}\n" for r, k in zip(rel, labels)))
    flat = d / "val"
    flat.mkdir()
    lines = []
    for i, (p, k) in enumerate(zip(paths, labels)):
        shutil.copy(p, flat / f"ILSVRC2012_val_{i:08d}.JPEG")
        lines.append(f"val/ILSVRC2012_val_{i:08d}.JPEG {k}\n")
    (d / "val.txt").write_text("".join(lines))
    return d, paths, labels, classes


def test_each_list_kind_gives_the_folder_listing(lists):
    d, paths, labels, classes = lists
    for name in ("names.csv", "ints.tsv"):
        p, lab, cls = list_dataset(d / name)
        assert [os.path.realpath(x) for x in p] == [os.path.realpath(x) for x in paths]
        assert np.array_equal(lab, labels), name
    assert list_dataset(d / "names.csv")[2] == classes
    assert list_dataset(d / "ints.tsv")[2] == ["0", "1", "2"]
    p, lab, _ = list_dataset(d / "val.txt")
    assert len(p) == len(paths) and np.array_equal(lab, labels) and p[0].endswith(".JPEG")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_list_reads_like_its_folder_on_every_backend(backend, lists, tiny_root):
    d, paths, labels, _ = lists
    with create_loader(backend, _cfg(tiny_root, shuffle=False)) as ld:
        want = [(x.clone(), y.clone()) for x, y in ld]
    for name in ("names.csv", "val.txt"):
        with create_loader(backend, _cfg(d / name, shuffle=False)) as ld:
            got = [(x.clone(), y.clone()) for x, y in ld]
            assert sorted(ld.last_indices.tolist()) == list(range(len(paths)))
        assert len(got) == len(want)
        for (xa, ya), (xb, yb) in zip(want, got):
            assert (ya == yb).all()
            assert xa.shape == xb.shape
            if backend != "dali":  # DALI's crops depend on its RNG, not on the index
                assert (xa == xb).all()
    seen = []
    for rank in (0, 1):  # two ranks: disjoint shards covering the list
        with create_loader(backend, _cfg(d / "ints.tsv", rank=rank, world_size=2,
                                         last_batch="partial")) as ld:
            list(ld)
            seen += ld.last_indices.tolist()
    assert sorted(seen) == list(range(len(paths)))


def test_bad_rows_follow_the_policy(lists, tmp_path):
    d, paths, labels, _ = lists
    rel = [os.path.relpath(p, tmp_path) for p in paths]
    body = "".join(f"{r},{k}\n" for r, k in zip(rel, labels))
    bad = tmp_path / "bad.csv"
    bad.write_text("path,label\n" + body + f"{rel[0]},\n,3\n")
    with pytest.raises(ValueError, match=r"bad.csv'?: line 39: no label for"):
        list_dataset(bad)
    with pytest.warns(RuntimeWarning, match="dropped 2 rows with a bad label or path"):
        p, _, _ = list_dataset(bad, skip_bad=True)
    assert len(p) == len(paths)
    mixed = tmp_path / "mixed.csv"
    mixed.write_text("path,label\n" + f"{rel[0]},3\n{rel[1]},cat\n")
    with pytest.raises(ValueError, match="labels mix integers .* and class names"):
        list_dataset(mixed)
    nohead = tmp_path / "nohead.csv"
    nohead.write_text(f"{rel[0]},3\n")
    with pytest.raises(ValueError, match="must name a path column"):
        list_dataset(nohead)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_row_naming_a_missing_file_is_a_bad_file(backend, lists, tmp_path):
    d, paths, labels, _ = lists
    rel = [os.path.relpath(p, tmp_path) for p in paths]
    lst = tmp_path / "missing.csv"
    lst.write_text("path,label\n" + "".join(f"{r},{k}\n" for r, k in zip(rel, labels))
                   + "gone/nowhere.jpg,1\n")
    with create_loader(backend, _cfg(lst, on_bad_file="skip")) as ld:
        with pytest.warns(RuntimeWarning, match="skipped 1 bad files.*nowhere.jpg"):
            n = sum(len(y) for _, y in ld)
        assert ld.stats["bad_files"] == 1 and n == len(paths) + 1  # replaced within its batch
    with create_loader(backend, _cfg(lst)) as ld:
        with pytest.raises(BadFileError, match="nowhere.jpg"):
            list(ld)


def test_data_gen_list_layout_holds_the_folder_layouts_images(tmp_path):
    import json

    from data_gen.generate import GenConfig, generate

    kw = dict(num_images=24, classes=3, seed=4, width_range=(48, 64), workers=1)
    generate(GenConfig(out=str(tmp_path / "f"), **kw), progress=False)
    generate(GenConfig(out=str(tmp_path / "l"), layout="list", **kw), progress=False)
    fp, fl, fc = list_dataset(tmp_path / "f")
    lp, ll, lc = list_dataset(tmp_path / "l" / "labels.csv")
    assert fc == lc and len(fp) == len(lp) == 24
    sha = lambda d: {r["path"].rsplit("/", 1)[1]: (r["sha256"], r["label"])  # noqa: E731
                     for r in json.loads((tmp_path / d / "manifest.json").read_text())["files"]
                     if r["path"].startswith(("class_", "images/"))}
    assert sha("f") == sha("l")  # the same bytes and labels, image by image
    by_name = {p.rsplit("/", 1)[1]: k for p, k in zip(fp, fl.tolist())}
    assert {p.rsplit("/", 1)[1]: k for p, k in zip(lp, ll.tolist())} == by_name
    with pytest.raises(ValueError, match="layout='tar' \\(--format\\) must be one of"):
        GenConfig(out=str(tmp_path / "x"), layout="tar")
