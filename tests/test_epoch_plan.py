import itertools

import numpy as np
import pytest

from pipelines import DatasetRootError, LastBatchPolicy
from pipelines.epoch_plan import epoch_batches, epoch_order, num_batches, sample_seed
from pipelines.sources.folder import list_samples


def test_listing_is_sorted_with_class_indices_and_any_case_extensions(tmp_path):
    for c in ("b", "a"):
        (tmp_path / c).mkdir()
    for name in ("z.JPG", "y.jpeg", "x.Jpg", "notes.txt", "w.png", "v.WebP", "u.bmp", "t.gif"):
        (tmp_path / "b" / name).write_bytes(b"x")
    (tmp_path / "a" / "q.jpg").write_bytes(b"x")
    with pytest.warns(RuntimeWarning, match=r"skipped 2 files whose extension is not one of "
                                            r".*b/notes.txt, .*b/t.gif"):
        paths, labels, classes = list_samples(tmp_path)
    assert classes == ["a", "b"]
    assert [p.rsplit("/", 1)[1] for p in paths] == [
        "q.jpg", "u.bmp", "v.WebP", "w.png", "x.Jpg", "y.jpeg", "z.JPG"]
    assert labels.tolist() == [0, 1, 1, 1, 1, 1, 1] and labels.dtype == np.int64
    # a user-set list (any case), as LoaderConfig.extensions
    with pytest.warns(RuntimeWarning, match="skipped 8 files"):
        paths, _, _ = list_samples(tmp_path, extensions=(".PNG",), allow_empty=True)
    assert [p.rsplit("/", 1)[1] for p in paths] == ["w.png"]
    with pytest.raises(ValueError, match="extensions='png' must be a non-empty sequence"):
        list_samples(tmp_path, extensions="png")


def _only_gif(p):
    (p / "c").mkdir()
    (p / "c" / "a.gif").write_bytes(b"x")
    return p


@pytest.mark.parametrize("setup, msg", [
    (lambda p: p / "missing", "does not exist"),
    (lambda p: p, "no class sub-folders"),
    (_only_gif, r"no .jpg/.jpeg/.png/.webp/.bmp files \(1 files with other extensions"),
])
def test_bad_roots_raise_one_clear_error(tmp_path, setup, msg):
    with pytest.raises(DatasetRootError, match=msg):
        list_samples(setup(tmp_path))


def test_epoch_order_is_a_deterministic_permutation():
    a = epoch_order(1000, seed=1, epoch=3, shuffle=True)
    assert sorted(a.tolist()) == list(range(1000))
    assert np.array_equal(a, epoch_order(1000, seed=1, epoch=3, shuffle=True))
    assert not np.array_equal(a, epoch_order(1000, seed=1, epoch=4, shuffle=True))
    assert np.array_equal(epoch_order(5, seed=1, epoch=4, shuffle=False), np.arange(5))


def test_docstring_example_of_last_batch_policy():
    mk = lambda p: [b.tolist() for b in epoch_batches(  # noqa: E731
        7, batch_size=3, seed=0, epoch=0, shuffle=False, policy=p)]
    assert mk(LastBatchPolicy.DROP) == [[0, 1, 2], [3, 4, 5]]
    assert mk(LastBatchPolicy.PARTIAL) == [[0, 1, 2], [3, 4, 5], [6]]
    assert mk(LastBatchPolicy.PAD) == [[0, 1, 2], [3, 4, 5], [6, 0, 1]]


@pytest.mark.parametrize("n, bs, world, policy", list(itertools.product(
    [1, 7, 37, 100], [1, 3, 8], [1, 2, 3], list(LastBatchPolicy))))
def test_shards_cover_every_sample_once_and_len_matches(n, bs, world, policy):
    seen = []
    lens = []
    for rank in range(world):
        bl = epoch_batches(n, batch_size=bs, seed=5, epoch=2, shuffle=True, policy=policy,
                           rank=rank, world_size=world)
        assert len(bl) == num_batches(n, batch_size=bs, policy=policy, rank=rank, world_size=world)
        if policy is not LastBatchPolicy.PARTIAL:
            assert all(len(b) == bs for b in bl)
        lens.append(len(bl))
        seen += np.concatenate(bl).tolist() if bl else []
    if policy is LastBatchPolicy.PARTIAL:
        assert sorted(seen) == list(range(n))          # exactly once
    elif policy is LastBatchPolicy.DROP:
        assert len(set(seen)) == len(seen)             # at most once
        assert len(seen) > n - world * bs - world
    else:
        assert set(seen) == set(range(n))              # everything, padding repeats a few
        assert len(seen) < n + world * bs + world
    if policy is not LastBatchPolicy.PARTIAL:
        assert len(set(lens)) == 1                     # equal step counts on every rank


def test_sample_seed_depends_on_all_three_inputs():
    s = sample_seed(0, 0, 0)
    assert len({s, sample_seed(1, 0, 0), sample_seed(0, 1, 0), sample_seed(0, 0, 1)}) == 4
    assert 0 <= s < 2**63 and s == sample_seed(0, 0, 0)
