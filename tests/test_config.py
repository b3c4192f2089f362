import pytest

from pipelines import AugmentSpec, LastBatchPolicy, LoaderConfig
from pipelines.config import OutputDType
from pipelines.transforms.spec import Mode


@pytest.mark.parametrize(
    "kw, name",
    [
        ({"batch_size": 0}, "batch_size"),
        ({"num_workers": -1}, "num_workers"),
        ({"last_batch": "sometimes"}, "last_batch"),
        ({"dtype": "int8"}, "dtype"),
        ({"device": "tpu"}, "device"),
        ({"rank": 2, "world_size": 2}, "rank"),
        ({"rank": 0, "world_size": 0}, "world_size"),
    ],
)
def test_invalid_values_name_the_option(kw, name):
    with pytest.raises(ValueError, match=name):
        LoaderConfig(root="x", **kw)


def test_enums_parse_from_names_and_config_is_frozen():
    c = LoaderConfig(root="x", last_batch="pad", dtype="bfloat16", num_workers=3)
    assert c.last_batch is LastBatchPolicy.PAD and c.dtype is OutputDType.BFLOAT16
    assert c.rank is None and c.world_size is None  # resolved when a loader is built
    assert (c.resolved().rank, c.resolved().world_size) == (0, 1)  # no torch.distributed here
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        c.batch_size = 3  # type: ignore[misc]
    assert c.replace(batch_size=3).batch_size == 3


@pytest.mark.parametrize(
    "kw, name",
    [({"mode": "test"}, "mode"), ({"scale": (0.5, 0.1)}, "scale"), ({"ratio": (0, 1)}, "ratio"),
     ({"flip_p": 2}, "flip_p"), ({"size": 0}, "size"), ({"std": (1, 0, 1)}, "std"),
     ({"size": 224, "resize_size": 100}, "resize_size")],
)
def test_augment_spec_validation(kw, name):
    with pytest.raises(ValueError, match=name):
        AugmentSpec(**kw)


def test_augment_spec_defaults():
    s = AugmentSpec(mode="eval", size=224)
    assert s.mode is Mode.EVAL and s.resize_size == 256
    assert s.mean_255[0] == pytest.approx(0.485 * 255)


@pytest.mark.parametrize("kw, name", [
    ({"seed": -1}, "seed"), ({"seed": 0.5}, "seed"), ({"seed": 2**63}, "seed"),
    ({"seed": True}, "seed"), ({"batch_size": True}, "batch_size"),
    ({"num_workers": 2.0}, "num_workers"),
    ({"shuffle": "no"}, "shuffle"), ({"channels_last": 1}, "channels_last"),
    ({"allow_empty_classes": "yes"}, "allow_empty_classes"),
    ({"max_image_pixels": 0}, "max_image_pixels"),
])
def test_wrong_types_and_ranges_name_the_option(kw, name):
    with pytest.raises(ValueError, match=f"^{name}="):
        LoaderConfig(root="x", **kw)


def test_numpy_integers_are_accepted_as_plain_ints():
    import numpy as np

    c = LoaderConfig(root="x", batch_size=np.int64(8), seed=np.uint32(7), num_workers=np.int32(1))
    assert (c.batch_size, c.seed, c.num_workers) == (8, 7, 1)
    assert type(c.batch_size) is int and type(c.seed) is int
