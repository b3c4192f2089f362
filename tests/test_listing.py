"""The listing follows ImageFolder's conventions and is safe: links, junk files, empty classes."""
import os
import warnings

import pytest
from utils import jpeg

from pipelines import DatasetRootError, LoaderConfig, create_loader
from pipelines.sources.folder import list_samples


def _tree(root, layout):
    for rel in layout:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(jpeg(seed=len(rel)))
    return root


def _listed(root, **kw):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        paths, labels, classes = list_samples(root, **kw)
    rel = [os.path.relpath(p, root) for p in paths]
    return rel, labels.tolist(), classes, [str(x.message) for x in w]


def test_a_link_to_the_root_inside_a_class_is_not_followed_and_is_named(tmp_path):
    _tree(tmp_path, ["cat/0.jpg", "cat/1.jpg", "dog/0.jpg", "dog/1.jpg", "dog/2.jpg"])
    os.symlink("..", tmp_path / "cat" / "up")
    rel, labels, classes, warns = _listed(tmp_path)
    assert rel == ["cat/0.jpg", "cat/1.jpg", "dog/0.jpg", "dog/1.jpg", "dog/2.jpg"]
    assert labels == [0, 0, 1, 1, 1]  # dog/0.jpg is a dog, once
    assert len(warns) == 1 and "cat/up" in warns[0] and "loops" in warns[0]


def test_a_self_loop_lists_each_file_once(tmp_path):
    _tree(tmp_path, ["class_a/a.jpg", "class_a/sub/b.jpg"])
    os.symlink(".", tmp_path / "class_a" / "loop")
    os.symlink("..", tmp_path / "class_a" / "sub" / "back")
    rel, _, _, warns = _listed(tmp_path)
    assert rel == ["class_a/a.jpg", "class_a/sub/b.jpg"]
    assert len(warns) == 1 and "class_a/loop" in warns[0] and "class_a/sub/back" in warns[0]


def test_links_into_another_class_list_files_under_their_real_class(tmp_path):
    _tree(tmp_path, ["cat/0.jpg", "dog/deep/0.jpg", "dog/1.jpg"])
    os.symlink(tmp_path / "dog" / "deep", tmp_path / "cat" / "borrowed")
    os.symlink(tmp_path / "dog" / "1.jpg", tmp_path / "cat" / "alias.jpg")
    rel, labels, _, warns = _listed(tmp_path)
    assert rel == ["cat/0.jpg", "dog/1.jpg", "dog/deep/0.jpg"] and labels == [0, 1, 1]
    assert len(warns) == 1 and "cat/borrowed" in warns[0] and "cat/alias.jpg" in warns[0]


def test_class_folder_links_are_followed_silently_and_outside_links_once(tmp_path):
    data, outside = tmp_path / "data", tmp_path / "elsewhere"
    _tree(outside, ["cats/0.jpg", "more/1.jpg"])
    (data).mkdir()
    os.symlink(outside / "cats", data / "cat")          # a subset built from links: normal
    _tree(data, ["dog/0.jpg"])
    os.symlink(outside / "more", data / "dog" / "m1")   # leaves the root: followed once
    os.symlink(outside / "more", data / "dog" / "m2")   # the same folder again: not followed
    rel, labels, _, warns = _listed(data)
    assert rel == ["cat/0.jpg", "dog/0.jpg", "dog/m1/1.jpg"] and labels == [0, 1, 1]
    assert len(warns) == 1 and "followed once" in warns[0] and "dog/m2" in warns[0]
    assert "cat " not in warns[0]


def test_hidden_and_os_metadata_files_are_ignored(tmp_path):
    _tree(tmp_path, ["c/a.jpg", "c/._a.jpg", "c/.hidden/b.jpg", "c/__MACOSX/x.jpg",
                     "c/@eaDir/t.jpg", ".trash/z.jpg", "__MACOSX/c/y.jpg"])
    (tmp_path / "c" / "Thumbs.db").write_bytes(b"x")
    rel, _, classes, warns = _listed(tmp_path)
    assert rel == ["c/a.jpg"] and classes == ["c"] and warns == []


def test_an_empty_class_raises_naming_it_unless_allowed(tmp_path):
    _tree(tmp_path, ["a/0.jpg", "c/0.jpg"])
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "readme.txt").write_text("x")
    with pytest.raises(DatasetRootError, match=r"'b'.*allow_empty_classes=True"):
        list_samples(tmp_path)
    paths, labels, classes = list_samples(tmp_path, allow_empty=True)
    assert classes == ["a", "b", "c"] and labels.tolist() == [0, 2]  # b keeps its index
    cfg = LoaderConfig(root=tmp_path, batch_size=2, device="cpu", num_workers=0,
                       allow_empty_classes=True)
    with create_loader("pageable", cfg) as ld:
        assert sorted(y.tolist() for _, y in ld)[0] in ([0, 2], [2, 0])


@pytest.mark.parametrize("root, exc", [("", ValueError), (None, ValueError), (3, TypeError)])
def test_empty_or_missing_root_names_the_option(root, exc):
    with pytest.raises(exc, match="root="):
        LoaderConfig(root=root)


def test_non_utf8_names_are_listed(tmp_path):
    cls = os.fsdecode(b"cl\xe9")
    name = os.fsdecode(b"\xff\xfeimg.jpg")
    _tree(tmp_path, [f"{cls}/{name}", "plain/a.jpg"])
    rel, labels, classes, _ = _listed(tmp_path)
    assert os.fsencode(rel[0]) == b"cl\xe9/\xff\xfeimg.jpg" and labels == [0, 1]
