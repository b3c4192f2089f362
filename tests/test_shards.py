"""WebDataset tar shards (``pipelines.sources.shards``) behind the contract, on every backend."""
from __future__ import annotations

import io
import os
import shutil
import tarfile
import warnings

import numpy as np
import pytest

from pipelines import AugmentSpec, BadFileError, LoaderConfig, create_loader
from pipelines.config import LastBatchPolicy
from pipelines.epoch_plan import contiguous_shard, epoch_batches, grouped_order, shard_indices
from pipelines.sources.root import list_dataset
from pipelines.sources.shards import ShardError, braces, index_shard, list_shards

BACKENDS = ["dali", "pinned", "pageable"]
N, SHARD = 37, 8  # 5 shards: 8, 8, 8, 8, 5


def _cfg(root, **kw):
    base = dict(root=root, batch_size=4, device="cpu", num_workers=1, debug_indices=True,
                augment=AugmentSpec(size=32), seed=2)
    base.update(kw)
    return LoaderConfig(**base)


def _key(name: str) -> int:
    return int(os.path.basename(name).split(".")[0])


def _tar(path, members):
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))


def _copy(wds, dst):
    shutil.copytree(wds, dst)
    return dst


# -- listing ---------------------------------------------------------------------------------
def test_every_way_of_naming_the_shards_lists_the_same_samples(wds, tiny_root):
    names, labels, classes = list_dataset(wds)
    assert len(names) == N and classes == ["0", "1", "2"]
    for root in (f"{wds}/*.tar", f"{wds}/shard-{{000000..000004}}.tar"):
        n2, l2, _ = list_dataset(root)
        assert n2 == names and np.array_equal(l2, labels)
    one = list_dataset(f"{wds}/shard-000004.tar")[0]
    assert len(one) == N - 4 * SHARD and one == names[4 * SHARD:]
    # the labels are the folder layout's: image i is in class i % 3
    assert [int(lab) for lab in labels] == [_key(n) % 3 for n in names]
    assert sorted(_key(n) for n in names) == list(range(N))


def test_braces_expand_ranges_with_padding_and_lists():
    assert braces("a-{08..11}.tar") == ["a-08.tar", "a-09.tar", "a-10.tar", "a-11.tar"]
    assert braces("{x,y}/s{1..2}.tar") == ["x/s1.tar", "x/s2.tar", "y/s1.tar", "y/s2.tar"]
    assert braces("plain.tar") == ["plain.tar"]


def test_a_sample_reads_the_same_bytes_as_the_folder_file(wds, tiny_root):
    with create_loader("pageable", _cfg(wds)) as ld:
        src = ld.data_source
        for i in (0, 9, N - 1):
            k = _key(src.names[i])
            want = (tiny_root / f"class_{k % 3:04d}" / f"img_{k:07d}.jpg").read_bytes()
            assert src.read(i) == want


def test_the_index_is_cached_and_invalidated_when_the_shard_changes(wds, tmp_path, monkeypatch):
    d = _copy(wds, tmp_path / "s")
    first = os.path.getmtime(d / "shard-000000.tar") - 10  # older than RACY_S: cacheable
    for t in d.glob("*.tar"):
        os.utime(t, (first, first))
    names = list_dataset(d)[0]
    import pipelines.sources.shards as shards

    def boom(path):
        raise AssertionError(f"indexed {path} again")

    monkeypatch.setattr(shards, "index_shard", boom)
    assert list_dataset(d)[0] == names  # every index from the cache
    t = d / "shard-000004.tar"
    _tar(t, [("00000099.jpg", (wds / "shard-000000.tar").read_bytes()[512:1024]),
             ("00000099.cls", b"1")])
    with pytest.raises(AssertionError, match="shard-000004.tar"):
        list_dataset(d)  # the changed shard is indexed again, not read from the cache


# -- the plan --------------------------------------------------------------------------------
def test_grouped_order_keeps_shards_whole_and_permutes_them():
    groups = np.array([3, 2, 4])
    o = grouped_order(groups, seed=0, epoch=0, shuffle=True)
    assert sorted(o.tolist()) == list(range(9))
    starts = {0: [0, 1, 2], 1: [3, 4], 2: [5, 6, 7, 8]}
    pos = 0
    for _ in range(3):  # the stream is whole shards back to back
        g = next(g for g, ids in starts.items() if ids[0] == o[pos])
        assert o[pos:pos + len(starts[g])].tolist() == starts[g]
        pos += len(starts[g])
    orders = {tuple(grouped_order(groups, seed=0, epoch=e, shuffle=True)) for e in range(8)}
    assert len(orders) > 1  # the shard order changes with the epoch


@pytest.mark.parametrize("policy", list(LastBatchPolicy))
def test_contiguous_slices_have_the_strided_counts(policy):
    order = np.arange(11)
    for w in (2, 3):
        parts = [contiguous_shard(order, rank=r, world_size=w, policy=policy) for r in range(w)]
        strided = [shard_indices(order, rank=r, world_size=w, policy=policy) for r in range(w)]
        assert [len(p) for p in parts] == [len(s) for s in strided]
        for p in parts:  # contiguous in the (wrapped) stream
            assert all((b - a) % 11 == 1 for a, b in zip(p[:-1], p[1:]))


def test_the_window_bounds_the_shuffle():
    groups = np.full(10, 10)
    b = epoch_batches(100, batch_size=100, seed=1, epoch=0, shuffle=True,
                      policy=LastBatchPolicy.PARTIAL, groups=groups, window=10)[0]
    stream = grouped_order(groups, seed=1, epoch=0, shuffle=True)
    for a in range(0, 100, 10):  # each window of 10 holds the same samples as the stream's
        assert sorted(b[a:a + 10]) == sorted(stream[a:a + 10])
    assert not np.array_equal(b, stream)


# -- the contract on every backend -----------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_exactly_once_per_epoch_and_deterministic(backend, wds):
    runs = []
    for _ in range(2):
        seen = []
        with create_loader(backend, _cfg(wds)) as ld:
            assert len(ld) == 10
            for e in range(2):
                ld.set_epoch(e)
                batches = [(x.clone(), y.clone()) for x, y in ld]
                assert len(batches) == len(ld)
                assert sorted(ld.last_indices.tolist()) == list(range(N))
                seen.append((ld.last_indices.tolist(), batches))
        runs.append(seen)
    assert runs[0][0][0] != runs[0][1][0]  # another order each epoch
    for (ia, ba), (ib, bb) in zip(runs[0], runs[1]):
        assert ia == ib  # the same order for the same (seed, epoch)
        for (xa, ya), (xb, yb) in zip(ba, bb):
            assert (ya == yb).all()
            if backend != "dali":  # DALI's crops come from its RNG, not the sample index
                assert (xa == xb).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("policy", ["pad", "drop", "partial"])
def test_two_ranks_read_disjoint_shard_slices(backend, policy, wds):
    per_rank, lens = [], []
    for rank in (0, 1):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # partial's DDP warning
            ld = create_loader(backend, _cfg(wds, rank=rank, world_size=2, last_batch=policy))
        with ld:
            list(ld)
            lens.append(len(ld))
            got = ld.last_indices.tolist()
            per_rank.append(got)
            shards = {ld.paths[i].rsplit("/", 1)[0] for i in got}
            assert len(shards) <= 4  # about half of the 5 shards, plus one shared at the edge
    both = per_rank[0] + per_rank[1]
    if policy == "partial":
        assert sorted(both) == list(range(N))
    elif policy == "drop":
        assert len(set(both)) == len(both) == 32  # 18 per rank, cut to whole batches of 4
    else:
        assert set(both) == set(range(N)) and len(both) - N <= 4 * 2
        assert lens[0] == lens[1]
    if policy != "partial":
        assert lens[0] == lens[1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_mid_epoch_on_shards(backend, wds):
    with create_loader(backend, _cfg(wds)) as ld:
        ld.set_epoch(1)
        full = []
        it = iter(ld)
        for k, (_x, _y) in enumerate(it):
            full.append(ld.last_batch_indices.tolist())
            if k == 3:
                state = ld.state_dict()
        rest = full[4:]
    with create_loader(backend, _cfg(wds)) as ld:
        ld.load_state_dict(state)
        got = [ld.last_batch_indices.tolist() for _ in ld]
    assert got == rest


# -- bad input -------------------------------------------------------------------------------
def test_a_truncated_shard_is_an_error_or_keeps_its_whole_samples(wds, tmp_path):
    d = _copy(wds, tmp_path / "s")
    t = d / "shard-000001.tar"
    data = t.read_bytes()
    t.write_bytes(data[: len(data) // 2])
    with pytest.raises(ShardError, match=r"shard-000001.tar.*truncated"):
        list_dataset(d)
    with pytest.warns(RuntimeWarning, match=r"skipped 1 bad shards or samples.*truncated"):
        names = list_dataset(d, skip_bad=True)[0]
    kept = [n for n in names if "shard-000001" in n]
    assert 0 < len(kept) < SHARD and len(names) == N - SHARD + len(kept)


def test_garbage_after_the_last_header_is_found(wds, tmp_path):
    d = _copy(wds, tmp_path / "s")
    t = d / "shard-000002.tar"
    data = bytearray(t.read_bytes())
    idx = index_shard(str(t))
    cut = int(idx.offsets[3]) - 512  # the 4th sample's image header
    data[cut:cut + 512] = b"\x07" * 512
    t.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="shard-000002.tar.*no tar header accounts for"):
        list_dataset(d)


def test_bad_samples_and_unreadable_shards_follow_the_policy(wds, tmp_path):
    jpg = (wds / "shard-000000.tar")
    img = index_shard(str(jpg))
    good = jpg.read_bytes()[int(img.offsets[0]): int(img.offsets[0] + img.sizes[0])]
    d = tmp_path / "bad"
    d.mkdir()
    _tar(d / "a.tar", [("k1.jpg", good), ("k1.cls", b"0"),     # fine
                       ("k2.jpg", good),                        # no label
                       ("k3.jpg", good), ("k3.cls", b"cat"),    # a bad label
                       ("k4.cls", b"1"),                        # no image
                       ("k5.jpg", good), ("k5.json", b'{"label": 2}')])  # a JSON label
    (d / "b.tar").write_bytes(b"this is not a tar file" * 40)
    with pytest.raises(ShardError, match="b.tar.*cannot be read as a tar"):
        list_dataset(d / "b.tar")
    with pytest.warns(RuntimeWarning, match=r"b.tar.*cannot be read as a tar"):
        assert len(list_dataset(d, skip_bad=True)[0]) == 2  # the bad shard is skipped, counted
    os.remove(d / "b.tar")
    with pytest.raises(ShardError, match=r"a.tar.*sample 'k2': no .cls or .json label"):
        list_dataset(d)
    with pytest.warns(RuntimeWarning, match=r"skipped 3 bad shards or samples") as rec:
        names, labels, classes = list_dataset(d, skip_bad=True)
    msg = str(rec[0].message)
    assert "bad label" in msg and "no image member" in msg
    assert [os.path.basename(n) for n in names] == ["k1.jpg", "k5.jpg"]
    assert labels.tolist() == [0, 2] and classes == ["0", "1", "2"]
    with pytest.raises(ShardError, match="missing.tar' does not exist"):
        list_dataset(f"{d}/{{a,missing}}.tar")


def test_image_extensions_left_out_are_counted(tmp_path, wds):
    d = tmp_path / "mixed"
    d.mkdir()
    src = wds / "shard-000000.tar"
    img = index_shard(str(src))
    good = src.read_bytes()[int(img.offsets[0]): int(img.offsets[0] + img.sizes[0])]
    _tar(d / "a.tar", [("k1.jpg", good), ("k1.cls", b"0"), ("k2.png", good), ("k2.cls", b"1")])
    with pytest.warns(RuntimeWarning, match=r"skipped 1 samples whose image extension.*1 .png"):
        s = list_shards(d, (".jpg",))
    assert len(s.names) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_corrupt_image_in_a_shard_is_a_bad_file(backend, tmp_path, wds):
    d = tmp_path / "c"
    d.mkdir()
    src = wds / "shard-000000.tar"
    idx = index_shard(str(src))
    members = []
    for k in range(8):
        data = src.read_bytes()[int(idx.offsets[k]): int(idx.offsets[k] + idx.sizes[k])]
        if k == 5:
            data = data[:40]  # a truncated JPEG
        members += [(f"s{k}.jpg", data), (f"s{k}.cls", str(k % 2).encode())]
    _tar(d / "a.tar", members)
    with create_loader(backend, _cfg(d, shuffle=False)) as ld:
        with pytest.raises(BadFileError, match=r"a.tar/s5.jpg"):
            list(ld)
    with create_loader(backend, _cfg(d, shuffle=False, on_bad_file="skip")) as ld:
        with pytest.warns(RuntimeWarning, match=r"skipped 1 bad files: .*a.tar/s5.jpg"):
            n = sum(len(y) for _, y in ld)
        assert n == 8 and ld.stats.bad_files == 1 and ld.stats.bad[0][0].endswith("a.tar/s5.jpg")


# -- the suite -------------------------------------------------------------------------------
def test_the_suite_reads_shards_and_diff_sets_them_beside_the_folder(wds, tiny_root, tmp_path,
                                                                     capsys):
    from compare.__main__ import main
    from compare.diff import main as diff

    fast = ["--model", "none", "--steps", "2", "--warmup", "0", "--repeats", "2", "--device",
            "cpu", "--batch-size", "4", "--workers", "1", "--backends", "pageable,dali"]
    for name, root in (("folder", tiny_root), ("shards", f"{wds}/*.tar")):
        assert main(["--data", str(root), *fast, "--out", str(tmp_path / name)]) == 0
    import json

    setup = json.loads((tmp_path / "shards" / "results.json").read_text())["setup"]
    assert setup["source"] == "shards" and setup["dataset"]["shards"] == 5
    capsys.readouterr()
    assert diff([str(tmp_path / "folder"), str(tmp_path / "shards")]) == 0
    out = capsys.readouterr().out
    assert "read from a folder in A and from shards in B" in out
    assert "pageable" in out and "dali" in out and "differs" not in out


@pytest.mark.cuda
@pytest.mark.parametrize("backend", BACKENDS)
def test_shards_on_the_gpu(backend, wds):
    with create_loader(backend, _cfg(wds, device="cuda")) as ld:
        devs = {str(x.device) for x, _ in ld}
        assert devs == {"cuda:0"} and sorted(ld.last_indices.tolist()) == list(range(N))
