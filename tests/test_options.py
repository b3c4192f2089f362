"""Backend options: validated from their fields, refused where they have no effect, and a new
option is one field (validated, reachable from create_loader, sweepable in compare)."""
from dataclasses import dataclass

import pytest

from pipelines import (
    AugmentSpec,
    Backend,
    DaliOptions,
    LoaderConfig,
    TorchOptions,
    create_loader,
    dali_available,
    factory,
)
from pipelines.factory import options_for
from pipelines.options import option


@pytest.mark.parametrize("cls, kw, msg", [
    (TorchOptions, {"prefetch_factor": 0}, "prefetch_factor=0 must be an int >= 1"),
    (TorchOptions, {"prefetch_factor": False}, "prefetch_factor=False must be an int"),
    (TorchOptions, {"queue_depth": 0}, "queue_depth=0"),
    (TorchOptions, {"streams": -2}, "streams=-2"),
    (TorchOptions, {"cpu_binding": "spin"}, "cpu_binding='spin' is not valid"),
    (TorchOptions, {"persistent_workers": "yes"}, "persistent_workers='yes' must be a bool"),
    (DaliOptions, {"hw_decoder_load": 1.5}, r"hw_decoder_load=1.5 must be in \[0.0, 1.0\]"),
    (DaliOptions, {"hw_decoder_load": float("nan")}, "hw_decoder_load=nan must be a number"),
    (DaliOptions, {"pipelines": 0}, "pipelines=0"),
    (DaliOptions, {"use_mmap": "yes"}, "use_mmap='yes' must be a bool"),
    (DaliOptions, {"reader_threads": 0}, "reader_threads=0"),
    (DaliOptions, {"device_memory_padding": -1}, "device_memory_padding=-1"),
])
def test_invalid_options_name_the_field(cls, kw, msg):
    with pytest.raises(ValueError, match=f"^{msg}"):
        cls(**kw)


@pytest.mark.parametrize("cls, name, value", [
    (DaliOptions, "handoff", "stream"), (DaliOptions, "executor", "pipelined"),
    (DaliOptions, "labels_via", "torch"), (TorchOptions, "pin_mode", "ring"),
])
def test_a_removed_option_is_refused_by_name(cls, name, value):
    """The failed experiments' switches are gone; passing one says so and why, in one line."""
    with pytest.raises(TypeError, match=f"^{cls.__name__}: option {name}='{value}' was removed: "
                                        ".* drop it"):
        cls(**{name: value})
    with pytest.raises(TypeError, match=f"option {name}='{value}' was removed"):
        cls().replace(**{name: value})
    assert name not in cls.option_types()


def test_defaults_and_the_explicit_reader_threads():
    d = DaliOptions()
    assert d.threads(14) == 7 and d.threads(2) == 2 and d.threads(64) == 8
    assert DaliOptions(reader_threads=3).threads(14) == 3
    assert TorchOptions(queue_depth=3).changed() == {"queue_depth": 3}


def test_no_config_field_belongs_to_one_backend():
    import dataclasses

    names = {f.name for f in dataclasses.fields(LoaderConfig)}
    assert not [n for n in names if n.startswith("dali_")]
    assert not names & {"prefetch", "streams", "pin_mode", "persistent_workers"}


def test_options_for_the_wrong_backend_are_refused(tiny_root):
    cfg = LoaderConfig(root=tiny_root, batch_size=8, device="cpu", num_workers=0)
    with pytest.raises(TypeError, match="not for backend 'pinned'; pass a TorchOptions"):
        create_loader("pinned", cfg, options=DaliOptions())
    # pinned-only knobs on the untuned baseline: one line naming the option
    with pytest.raises(ValueError, match="streams=2 has no effect on backend 'pageable'"):
        create_loader("pageable", cfg, options=TorchOptions(streams=2))


@pytest.mark.skipif(not dali_available(), reason="needs DALI")
def test_the_dali_pipelines_rule_applies_to_dali_only(tiny_root):
    cfg = LoaderConfig(root=tiny_root, batch_size=8, device="cpu", num_workers=1,
                       augment=AugmentSpec(size=32))
    with pytest.raises(ValueError, match="pipelines=2 must be <= num_workers=1"):
        create_loader("dali", cfg, options=DaliOptions(pipelines=2))
    with create_loader("pinned", cfg) as ld:  # the torch backends do not care
        assert sum(len(y) for _, y in ld) == 37


@dataclass(frozen=True)
class _WithKnob(TorchOptions):
    """TorchOptions plus one new field and nothing else."""

    new_knob: int = option(3, lo=1)


def test_a_new_option_is_one_field(tiny_root, monkeypatch, tmp_path):
    # validated
    with pytest.raises(ValueError, match="^new_knob=0 must be an int >= 1"):
        _WithKnob(new_knob=0)
    # reachable from create_loader
    monkeypatch.setitem(factory.OPTIONS, Backend.PINNED, _WithKnob)
    monkeypatch.setitem(factory.OPTIONS, Backend.PAGEABLE, _WithKnob)
    assert options_for("pinned") is _WithKnob
    cfg = LoaderConfig(root=tiny_root, batch_size=8, device="cpu", num_workers=0,
                       augment=AugmentSpec(size=32))
    with create_loader("pinned", cfg, options=_WithKnob(new_knob=5)) as ld:
        assert ld.options.new_knob == 5
    # sweepable in compare, with its range checked before the first timed batch
    from compare.suite import plan_variants
    from compare.variants import parse_sweep

    vs = parse_sweep("new_knob=1,2", [Backend.PINNED])
    assert [v.label for v in vs] == ["pinned new_knob=1", "pinned new_knob=2"]
    assert [v.options_of().new_knob for v in vs] == [1, 2]
    with pytest.raises(ValueError, match=r"--sweep new_knob=0.*new_knob=0 must be an int >= 1"):
        plan_variants(parse_sweep("new_knob=0", [Backend.PINNED]), cfg)
