"""Issue 55, class 4: what a ``target_fn`` returns, and the path it is given
(``pipelines.sources.targets``): a ``str`` or ``bytes`` is refused (never split into
characters), numpy integer scalars are ints, values are checked in the dtype they end in
(float32 overflow is refused), an int beyond int64 is refused naming ``target`` and the sample,
and a shard member is ``SHARD.tar/MEMBER`` as the tar names it, also with ``..`` in it."""
from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest
import torch

from pipelines.sources.targets import build_targets, relative_path
from tests.utils import jpeg

PATHS = ["/r/c/a.jpg", "/r/c/b.jpg"]


def _build(fn):
    return build_targets(fn, PATHS, "/r")


@pytest.mark.parametrize("value", ["12", "3.5", b"12", bytearray(b"1")])
def test_a_string_or_bytes_is_refused_not_split_into_characters(value):
    with pytest.raises(ValueError, match=r"target: target_fn\('c/a.jpg'\) returned") as e:
        _build(lambda rel: value)
    assert "\n" not in str(e.value)


def test_numpy_integer_scalars_are_ints():
    got = _build(lambda rel: np.int64(7) if rel.endswith("a.jpg") else np.uint8(2))
    assert got.dtype == torch.int64 and got.tolist() == [7, 2]
    assert _build(lambda rel: [np.int32(1), np.float64(0.5)]).tolist() == [[1.0, 0.5]] * 2


@pytest.mark.parametrize("value", [[1e39], [3.5e38, 1.0], (float("inf"),), [float("nan")]])
def test_values_are_checked_in_float32(value):
    with pytest.raises(ValueError, match=r"target: target_fn\('c/a.jpg'\)"):
        _build(lambda rel: value)
    assert _build(lambda rel: [3.0e38]).dtype == torch.float32  # finite in float32: kept


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 10**30])
def test_an_int_beyond_int64_is_refused_naming_target_and_the_sample(value):
    with pytest.raises(ValueError, match=r"target: target_fn\('c/a.jpg'\) returned .*int64"):
        _build(lambda rel: value)
    assert _build(lambda rel: 2**63 - 1).tolist() == [2**63 - 1] * 2


def test_a_shard_member_is_shard_tar_slash_member_even_with_dotdot():
    assert relative_path("/d/s.tar/x/../y.jpg", "/d", "/d/s.tar") == "s.tar/x/../y.jpg"
    assert relative_path("/d/s.tar/../y.jpg", "/d", "/d/s.tar") == "s.tar/../y.jpg"
    assert relative_path("/d/c/y.jpg", "/d") == "c/y.jpg"


def test_a_loader_on_a_shard_with_dotdot_members_gives_target_fn_the_member_name(tmp_path):
    from pipelines import AugmentSpec, LoaderConfig
    from tests.utils import make

    shard = tmp_path / "s-000.tar"
    names = ["a.jpg", "x/../b.jpg", "../c.jpg"]
    with tarfile.open(shard, "w") as t:
        for k, name in enumerate(names):
            data = jpeg(16, 16, seed=k)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    seen: list[str] = []

    def fn(rel: str) -> int:
        seen.append(rel)
        return len(seen)

    cfg = LoaderConfig(root=str(tmp_path), batch_size=3, device="cpu", num_workers=0,
                       augment=AugmentSpec(size=8), target=fn, shuffle=False)
    with make("pageable", cfg) as ld:
        assert ld.targets.tolist() == [1, 2, 3]
    assert seen == [f"s-000.tar/{n}" for n in names]
