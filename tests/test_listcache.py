"""The listing cache (``pipelines.sources.cache``): reused while the tree is unchanged."""
from __future__ import annotations

import os
import time

import pytest

from pipelines.sources import cache as listcache
from pipelines.sources.root import list_dataset


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_FEED_LISTING_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "data"
    for c in ("a", "b"):
        (root / c / "sub").mkdir(parents=True)
        for i in range(3):
            (root / c / f"{i}.jpg").write_bytes(b"x")
        (root / c / "sub" / "s.png").write_bytes(b"x")
    old = time.time() - 60  # older than RACY_S, so the listing may be cached
    for d in [root] + [p for p in root.rglob("*") if p.is_dir()]:
        os.utime(d, (old, old))
    return root


def _walks(monkeypatch):
    calls = []
    import pipelines.sources.root as sources

    orig = sources.walk_folder
    monkeypatch.setattr(sources, "walk_folder", lambda *a, **k: calls.append(1) or orig(*a, **k))
    return calls


def test_the_second_listing_comes_from_the_cache_until_a_folder_changes(tree, monkeypatch):
    calls = _walks(monkeypatch)
    first = list_dataset(tree)
    assert len(calls) == 1 and len(first[0]) == 8
    again = list_dataset(tree)
    assert len(calls) == 1  # from the cache
    assert again[0] == first[0] and (again[1] == first[1]).all() and again[2] == first[2]
    (tree / "a" / "sub" / "new.jpg").write_bytes(b"x")  # a change deep in a class folder
    old = time.time() - 30
    os.utime(tree / "a" / "sub", (old, old))
    third = list_dataset(tree)
    assert len(calls) == 2 and len(third[0]) == 9
    (tree / "c").mkdir()  # a new class folder changes the root
    (tree / "c" / "x.jpg").write_bytes(b"x")
    assert list_dataset(tree)[2] == ["a", "b", "c"] and len(calls) == 3


def test_fresh_folders_are_not_cached_and_the_cache_can_be_off(tree, monkeypatch):
    calls = _walks(monkeypatch)
    (tree / "b" / "late.jpg").write_bytes(b"x")  # b's mtime is now: too fresh to trust
    list_dataset(tree)
    list_dataset(tree)
    assert len(calls) == 2
    monkeypatch.setenv("GPU_FEED_LISTING_CACHE", "off")
    assert listcache.cache_dir() is None


def test_warnings_of_the_walk_come_again_from_the_cache(tree):
    (tree / "a" / "notes.txt").write_bytes(b"x")
    old = time.time() - 60
    os.utime(tree / "a", (old, old))
    for _ in range(2):
        with pytest.warns(RuntimeWarning, match="skipped 1 files"):
            list_dataset(tree)
