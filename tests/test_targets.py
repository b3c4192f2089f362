"""``LoaderConfig.target`` from the files (``pipelines.sources.targets``): class, multi-label,
column tuples, ``"none"`` and a ``target_fn`` on folders, CSV / TSV lists and tar shards, the
same on every backend and equal to what the files hold; bad cells; refusals; mixing; and
``data_gen --target`` round trips."""
from __future__ import annotations

import csv
import io
import json
import os
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from data_gen.__main__ import main as data_gen
from pipelines import AugmentSpec, LoaderConfig
from pipelines.sources.root import open_source
from pipelines.sources.shards import ShardError
from pipelines.transforms.mix import MixSpec, mix_batch, mix_rng
from tests.utils import make

BACKENDS = ["dali", "pinned", "pageable"]
REGR = ("width", "height")


def _cfg(root, **kw):
    base = dict(root=root, batch_size=8, device="cpu", num_workers=0, augment=AugmentSpec(size=16),
                seed=3)
    base.update(kw)
    return LoaderConfig(**base)


def _gen(out: Path, fmt: str, target: str) -> None:
    assert data_gen(["--out", str(out), "--num-images", "20", "--classes", "3", "--seed", "5",
                     "--width-range", "32,48", "--workers", "1", "--quiet", "--format", fmt,
                     "--target", target] + (["--shard-size", "6"] if fmt == "wds" else [])) == 0


@pytest.fixture(scope="module")
def roots(tiny_root, tmp_path_factory):
    """A folder, a CSV list with a multi-label column, a TSV list with regression columns, and
    tar shards of each kind: all written by ``data_gen --target``."""
    base = tmp_path_factory.mktemp("targets")
    for fmt in ("list", "wds"):
        for target in ("multilabel", "regression"):
            _gen(base / f"{fmt}-{target}", fmt, target)
    tsv = base / "list-regression" / "labels.tsv"
    with open(base / "list-regression" / "labels.csv") as f:
        tsv.write_text("".join("\t".join(r) + "\n" for r in csv.reader(f)))
    return {"folder": tiny_root, "csv": base / "list-multilabel" / "labels.csv", "tsv": tsv,
            "wds-multi": base / "wds-multilabel", "wds-regr": base / "wds-regression"}


def _members(root: Path) -> dict[str, dict[str, bytes]]:
    """``"SHARD.tar/KEY" -> {ext: bytes}`` of every shard sample, read with tarfile."""
    out: dict[str, dict[str, bytes]] = {}
    for shard in sorted(root.glob("*.tar")):
        with tarfile.open(shard) as tf:
            for m in tf:
                key, ext = m.name.split(".", 1)
                out.setdefault(f"{shard.name}/{key}", {})[ext] = tf.extractfile(m).read()
    return out


def _truth(root: Path, target, rels: list[str]) -> list:
    """What each sample's target must be, from the file's own contents."""
    root = Path(root)
    if target == "none":
        return [torch.tensor(i) for i in range(len(rels))]
    if callable(target):
        return [torch.tensor(target(r), dtype=torch.float32) for r in rels]
    if root.suffix in (".csv", ".tsv"):
        with open(root) as f:
            rows = {r["path"]: r for r in csv.DictReader(f, delimiter="\t" if root.suffix == ".tsv"
                                                         else ",")}
        cells = [rows[r] for r in rels]
        if isinstance(target, tuple):
            return [torch.tensor([float(c[k]) for k in target]) for c in cells]
        key = "labels" if target == "multilabel" else "label"
        names = sorted({n for c in rows.values() for n in c[key].split(";")})
        if target == "class":
            return [torch.tensor(names.index(c["label"])) for c in cells]
        return [torch.tensor([float(n in c["labels"].split(";")) for n in names]) for c in cells]
    if root.is_dir() and not list(root.glob("*.tar")):  # a folder: its class folders
        names = sorted(p.name for p in root.iterdir() if p.is_dir())
        return [torch.tensor(names.index(r.split(os.sep)[0])) for r in rels]
    members = _members(root)
    got = [members[r.rsplit(".", 1)[0]] for r in rels]
    if isinstance(target, tuple):
        return [torch.tensor([float(json.loads(m["json"])[k]) for k in target]) for m in got]
    if target == "class":
        return [torch.tensor(int(m["cls"])) for m in got]
    ids = [[int(t) for t in m["txt"].split()] for m in got]
    width = max(max(i) for i in ids) + 1
    return [torch.tensor([float(k in i) for k in range(width)]) for i in ids]


def _rel_fn(rel: str) -> list[float]:
    return [float(len(rel)), float(sum(map(ord, rel)) % 7)]


KINDS = {
    "folder": ["class", "none", _rel_fn],
    "csv": ["class", "multilabel", "none", _rel_fn],
    "tsv": [REGR, "none"],
    "wds-multi": ["class", "multilabel", _rel_fn],
    "wds-regr": [REGR, "none"],
}


@pytest.mark.parametrize("source", sorted(KINDS))
def test_every_target_kind_on_every_source_is_the_files_own_on_every_backend(roots, source):
    pytest.importorskip("nvidia.dali")
    root = roots[source]
    for target in KINDS[source]:
        got = []
        for backend in BACKENDS:
            with make(backend, _cfg(root, target=target)) as ld:
                rows = {i: y.clone() for b in ld for i, y in zip(b.indices.tolist(), b.labels)}
                base = root if os.path.isdir(root) else os.path.dirname(root)
                rels = [os.path.relpath(p, base) for p in ld.paths]
            got.append(rows)
        want = _truth(root, target, rels)
        assert sorted(got[0]) == list(range(len(rels)))
        for i, w in enumerate(want):
            y = got[0][i]
            assert y.dtype == (torch.float32 if w.dim() else torch.int64), (source, target)
            assert torch.equal(y, w.to(y.dtype)), (source, target, i, y, w)
            assert all(torch.equal(y, g[i]) for g in got[1:]), (source, target, i)


def test_bad_cells_are_errors_naming_the_row_column_and_target_or_counted_skips(tmp_path,
                                                                                 tiny_root):
    img = next(Path(tiny_root).rglob("*.jpg"))
    lst = tmp_path / "bad.csv"
    lst.write_text(f"path,age,labels\n{img},3.5,a;b\n{img},,a\n{img},old,c|a\n{img},2,\n")
    with pytest.raises(ValueError, match=r"line 3: target=\('age',\): no 'age' value"):
        open_source(lst, target=("age",))
    nan = tmp_path / "nan.csv"
    nan.write_text(f"path,age\n{img},old\n{img},nan\n")
    with pytest.raises(ValueError, match=r"line 2: target=\('age',\): 'age' is 'old', not a"):
        open_source(nan, target=("age",))
    with pytest.raises(ValueError, match="the file list names no sample"):
        open_source(nan, target=("age",), skip_bad=True)
    with pytest.warns(RuntimeWarning, match="dropped 2 rows"):
        s = open_source(lst, target=("age",), skip_bad=True)
    assert s.targets.tolist() == [[3.5], [2.0]] and s.targets.dtype == np.float32
    with pytest.raises(ValueError, match=r"line 5: target='multilabel': no label"):
        open_source(lst, target="multilabel")
    with pytest.warns(RuntimeWarning, match="dropped 1 rows"):
        s = open_source(lst, target="multilabel", skip_bad=True)
    assert s.classes == ["a", "b", "c"]
    assert s.targets.tolist() == [[1, 1, 0], [1, 0, 0], [1, 0, 1]]
    with pytest.raises(ValueError, match=r"target=\('size',\).*no column 'size'"):
        open_source(lst, target=("size",))
    mixed = tmp_path / "mixed.csv"
    mixed.write_text(f"path,labels\n{img},1;2\n{img},cat\n")
    with pytest.raises(ValueError, match="mix class ids"):
        open_source(mixed, target="multilabel")
    txt = tmp_path / "list.txt"
    txt.write_text(f"{img} 0\n")
    with pytest.raises(ValueError, match=r"target=\('age',\).*\.txt list"):
        open_source(txt, target=("age",))
    # shards: a missing key and a non-numeric value in a sample's .json
    data = img.read_bytes()
    shard = tmp_path / "s" / "a.tar"
    shard.parent.mkdir()
    with tarfile.open(shard, "w") as tf:
        for key, meta in (("k0", {"age": 1}), ("k1", {}), ("k2", {"age": "x"}), ("k3", {"age": 4})):
            for ext, b in (("jpg", data), ("json", json.dumps(meta).encode())):
                ti = tarfile.TarInfo(f"{key}.{ext}")
                ti.size = len(b)
                tf.addfile(ti, io.BytesIO(b))
    with pytest.raises(ShardError, match=r"sample 'k1': target=\('age',\): no 'age' value"):
        open_source(shard.parent, target=("age",))
    with pytest.warns(RuntimeWarning, match="skipped 2 bad shards or samples"):
        s = open_source(shard.parent, target=("age",), skip_bad=True)
    assert s.targets.tolist() == [[1.0], [4.0]] and [n[-6:] for n in s.names] == ["k0.jpg", "k3.jpg"]
    with make("pageable", _cfg(shard.parent, target=("age",), on_bad_file="skip")) as ld:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert sorted(float(y) for b in ld for y in b.labels) == [1.0, 4.0]


def test_folders_refuse_file_targets_and_flat_folders_and_path_only_lists_serve_none(
        tiny_root, tmp_path):
    for target in ("multilabel", ("age",)):
        with pytest.raises(ValueError, match=r"^target=.*folder"):
            make("pinned", _cfg(tiny_root, target=target))
    flat = tmp_path / "flat"
    flat.mkdir()
    imgs = sorted(Path(tiny_root).rglob("*.jpg"))[:5]
    for k, p in enumerate(imgs):
        (flat / f"{k}.jpg").write_bytes(p.read_bytes())
    with pytest.raises(ValueError, match="no class sub-folders"):
        open_source(flat)
    for _ in range(2):  # the second from the listing cache, under its own key
        s = open_source(flat, target="none")
        assert [os.path.basename(n) for n in s.names] == [f"{k}.jpg" for k in range(5)]
        assert s.classes == []
    with pytest.raises(ValueError, match="no class sub-folders"):
        open_source(flat)  # a flat entry never answers a class listing
    lst = tmp_path / "paths.csv"
    lst.write_text("path\n" + "".join(f"{p}\n" for p in imgs))
    for target, root in (("none", flat), ("none", lst), (_rel_fn, flat)):
        with make("pageable", _cfg(root, target=target)) as ld:
            n = sum(len(b.labels) for b in ld)
        assert n == 5


def test_mix_mixes_multi_hot_rows_and_refuses_column_targets(roots):
    root = roots["csv"]
    spec = MixSpec(mixup_alpha=0.4, cutmix_alpha=1.0, label_smoothing=0.1)
    with make("pageable", _cfg(root, target="multilabel")) as ld:
        plain = {i: y for b in ld for i, y in zip(b.indices.tolist(), b.labels)}
        C = len(ld.classes)
    with make("pageable", _cfg(root, target="multilabel", mix=spec)) as ld:
        for pos, b in enumerate(ld):
            y = torch.stack([plain[i] for i in b.indices.tolist()])
            want = mix_batch(torch.zeros(b.images.shape), y, spec, C, mix_rng(3, 0, 0, pos))[1]
            assert torch.allclose(b.labels, want)
            k = y.sum(1) * (1 - 0.1) + 0.1  # smoothed label counts; a row sums to
            s = b.labels.sum(1)              # lam * k_i + (1 - lam) * k_(i-1)
            lo, hi = torch.minimum(k, k.roll(1, 0)), torch.maximum(k, k.roll(1, 0))
            assert ((s >= lo - 1e-5) & (s <= hi + 1e-5)).all()
    for target in (REGR, "none"):
        with pytest.raises(ValueError, match="^mix mixes class and multi-label targets"):
            _cfg(root, target=target, mix=spec)


def test_data_gen_targets_round_trip_to_the_images_own_sizes(roots):
    """``--target regression`` writes each image's width and height; the loader's targets are
    those of the decoded file (list) and of the shard's image member (wds)."""
    s = open_source(roots["tsv"], target=REGR)
    for p, y in zip(s.names, s.targets.tolist()):
        with Image.open(p) as im:
            assert y == [float(im.size[0]), float(im.size[1])]
    s = open_source(roots["wds-regr"], target=REGR)
    members = _members(roots["wds-regr"])
    for name, y in zip(s.names, s.targets.tolist()):
        shard, key = name.split(os.sep)[-2:]
        with Image.open(io.BytesIO(members[f"{shard}/{key.split('.')[0]}"]["jpg"])) as im:
            assert y == [float(im.size[0]), float(im.size[1])]
    m = open_source(roots["wds-multi"], target="multilabel")
    assert m.targets.shape == (20, 3) and m.targets.sum() > 20  # some images have two classes
    assert data_gen(["--out", "/nonexistent-unused", "--target", "multilabel"]) == 2  # folder


def test_edited_shard_targets_are_never_served_stale(tmp_path, roots):
    src = sorted(roots["wds-regr"].glob("*.tar"))[0]
    shard = tmp_path / "one.tar"
    shard.write_bytes(src.read_bytes())
    before = open_source(shard, target=REGR).targets.copy()
    out = tmp_path / "edit.tar"
    with tarfile.open(shard) as tf, tarfile.open(out, "w") as w:
        for m in tf:
            b = tf.extractfile(m).read()
            if m.name.endswith(".json"):
                b = json.dumps({**json.loads(b), "width": 7}).encode()
                m.size = len(b)
            w.addfile(m, io.BytesIO(b))
    os.replace(out, shard)
    after = open_source(shard, target=REGR).targets
    assert (after[:, 0] == 7).all() and np.array_equal(after[:, 1], before[:, 1])
