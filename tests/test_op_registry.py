"""The op registry (``pipelines.transforms.migrate.ops``): one entry per op kind, from torchvision to DALI.

Every kind the translator emits has a DALI builder, every entry's torchvision names are
supported, and a new op is one entry: registered here for one test (``RandomInvert``), it is
translated by ``from_torchvision`` and built by the DALI graph on CPU with no other change.
"""
from __future__ import annotations

import pytest
import torch
from torchvision.transforms import v2

from pipelines import AugmentSpec, LoaderConfig, create_loader
from pipelines.transforms.migrate import (
    SUPPORTED,
    Op,
    UnsupportedTransformError,
    flow,
    from_torchvision,
    ops,
    spec_ops,
    translate,
)

F32 = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]
NORM = v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])

# every branch of every built-in translation (both RandomResizedCrop windows, the three Resize
# forms, the affine op a float conversion before a padded crop needs)
COMPOSES = [
    [v2.RandomResizedCrop(32), v2.RandomHorizontalFlip(), *F32, NORM],
    [v2.RandomResizedCrop(32, scale=(0.9, 1.0)), *F32],
    [v2.Resize((40, 30)), v2.RandomVerticalFlip(0.3), *F32],
    [v2.CenterCrop(40), v2.Resize(32), *F32],
    [v2.Resize(36, max_size=48), v2.CenterCrop(32), *F32],
    [v2.ColorJitter(0.2, 0.2, 0.2, 0.1), v2.RandomGrayscale(0.2), v2.GaussianBlur(3),
     v2.RandomCrop(32, pad_if_needed=True), *F32],
    [*F32, NORM, v2.RandomCrop(32, padding=2, fill=0.5), v2.RandomHorizontalFlip()],
]


def _kinds(plan):
    return {op.kind for op in plan.ops}


def test_every_emitted_kind_has_a_builder_and_every_name_is_supported():
    emitted = set().union(*(_kinds(from_torchvision(c)) for c in COMPOSES))
    for mode in ("train", "eval"):
        emitted |= _kinds(spec_ops(AugmentSpec(mode=mode, size=32)))
    assert emitted <= set(ops.REGISTRY), emitted - set(ops.REGISTRY)
    assert "affine" in emitted and "resize_shorter" in emitted
    for kind, e in ops.REGISTRY.items():
        assert e.kind == kind and callable(e.build)
        assert e.translate is not None or not e.torchvision
        assert set(e.torchvision) <= set(SUPPORTED)
    # SUPPORTED is the registry's names plus the steps that are not ops
    rest = set(SUPPORTED) - set(ops.names())
    assert rest == {"Normalize", *translate.FORMAT, *translate.DTYPE}
    assert all(ops.for_transform(n) is None for n in rest)
    with pytest.raises(ValueError, match="no DALI translation"):
        ops.build(None, Op("no_such_kind"))


@pytest.mark.dali
def test_every_builder_names_a_dali_function():
    for e in ops.REGISTRY.values():
        for f in (e.build, e.decode, e.mirror):
            if isinstance(f, ops.dali):
                assert callable(f.resolve()), f


def test_the_registry_module_does_not_import_dali():
    import subprocess
    import sys

    code = ("import sys, pipelines.transforms.migrate, pipelines.transforms.migrate.ops; "
            "assert 'nvidia.dali' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- a new op in one entry ---------------------------------------------------------------------
def _invert_translate(t, s):
    return [Op("invert", (("p", float(t.p)),))], None


def _invert_build(images, op):
    from nvidia.dali import fn, types

    coin = fn.cast(fn.random.coin_flip(probability=op["p"]), dtype=types.FLOAT)
    x = fn.cast(images, dtype=types.FLOAT)
    return fn.cast(x + (255.0 - 2.0 * x) * coin, dtype=types.UINT8)


INVERT = ops.OpDef("invert", _invert_build, ("RandomInvert",), _invert_translate,
                   uint8_only=True)


def _images(root, transform):
    cfg = LoaderConfig(root=root, batch_size=8, device="cpu", num_workers=2, shuffle=False,
                       augment=AugmentSpec(size=32), transform=transform)
    with create_loader("dali", cfg) as ld:
        return torch.cat([x for x, _ in ld])


@pytest.mark.dali
def test_a_new_op_is_one_registry_entry(tiny_root):
    def invert(p):
        return v2.Compose([v2.CenterCrop(32), v2.RandomInvert(p), *F32])

    with pytest.raises(UnsupportedTransformError, match="RandomInvert"):
        from_torchvision(invert(1.0))
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(ops.REGISTRY, "invert", INVERT)
        # flow.walk models RandomInvert as an unknown value map; on uint8 images it is a uint8
        # -> uint8 step like ColorJitter (the test's stand-in for a class flow already models)
        mp.setitem(flow.HANDLERS, "RandomInvert", lambda t, s, out: s)
        assert [op.kind for op in from_torchvision(invert(1.0)).ops] == ["center_crop", "invert"]
        assert "RandomInvert" in translate.supported()
        with pytest.raises(UnsupportedTransformError, match="after a float conversion"):
            from_torchvision([*F32, v2.RandomInvert(1.0), v2.CenterCrop(32)])
        plain = _images(tiny_root, v2.Compose([v2.CenterCrop(32), *F32]))
        inverted, kept = _images(tiny_root, invert(1.0)), _images(tiny_root, invert(0.0))
    assert plain.shape == (37, 3, 32, 32)
    torch.testing.assert_close(inverted, 1.0 - plain, atol=1e-6, rtol=0)
    torch.testing.assert_close(kept, plain, atol=0, rtol=0)
    assert "invert" not in ops.REGISTRY  # removed again
    with pytest.raises(UnsupportedTransformError, match="RandomInvert"):
        from_torchvision(invert(1.0))
