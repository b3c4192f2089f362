"""The op registry: one ``OpDef`` per ``Op`` kind, from torchvision transform to DALI graph.

An entry says which torchvision classes translate to its kind and how (``translate``, used by
``pipelines.transforms.migrate.translate.from_torchvision``), and how the DALI graph builds it (``build``,
used by ``pipelines.dali.graph``), plus what the translator and the graph need to know about
the kind: whether it runs on uint8 images only, whether it commutes with a per-channel value
map, whether it can be fused into the JPEG decoder (when first) or into the output
``crop_mirror_normalize`` (when last). Adding an op is one ``register(OpDef(...))``; the
supported ops are registered in ``pipelines.transforms.migrate.translate``, next to the helpers their
translations share.

This module does not import ``nvidia.dali``: builders name functions of ``pipelines.dali``
through ``dali("module.function")``, which imports them when the graph is built.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipelines.transforms.migrate.plan import Op

# (the transform, the image before it: a flow.State) -> (the plan ops, or (param, reason))
Translate = Callable[[Any, Any], tuple[list[Op], tuple[str, str] | None]]
Build = Callable[[Any, Op], Any]  # (DALI images, op) -> DALI images


def _never(op: Op) -> bool:
    return False


def always(op: Op) -> bool:
    return True


@dataclass(frozen=True)
class OpDef:
    """One op kind, in the translator and in the DALI graph.

    Attributes:
        kind: the ``Op.kind`` it builds.
        build: ``(images, op) -> images`` in the DALI graph, on decoded HWC images (uint8, or
            float after an ``affine`` op); DALI imported lazily (see ``dali``).
        torchvision: the torchvision class names that ``translate`` translates (none for kinds
            that only the translator or ``AugmentSpec`` emits, such as ``affine``).
        translate: ``(transform, state) -> (ops, problem)``: the plan ops for one step, or
            ``([], (param, reason))`` when DALI cannot reproduce it; ``state`` is the
            ``flow.State`` before the step. It may emit ops of other registered kinds.
        uint8_only: refused after a float conversion (torchvision clamps float images to
            [0, 1]; DALI runs it on uint8).
        commutes: whether the op commutes with a per-channel value map ``a * x + b``, so the
            float conversion may stay after it.
        decode: when the op comes first, ``(jpegs, op, device, decoder_kwargs) -> images``
            decoding and applying it in one operator.
        mirror: when the op comes last, ``op -> mirror`` for the output
            ``crop_mirror_normalize``.
        conditional: the builder uses DALI's conditional execution (``if`` on per-sample
            values), so the pipeline is built with ``enable_conditionals=True``.
    """

    kind: str
    build: Build
    torchvision: tuple[str, ...] = ()
    translate: Translate | None = None
    uint8_only: bool = False
    commutes: Callable[[Op], bool] = _never
    decode: Callable[..., Any] | None = None
    mirror: Callable[[Op], Any] | None = None
    conditional: bool = False


REGISTRY: dict[str, OpDef] = {}


def register(entry: OpDef) -> OpDef:
    """Add ``entry`` (one op kind; its torchvision names must be new)."""
    taken = [n for n in entry.torchvision for e in REGISTRY.values()
             if e.kind != entry.kind and n in e.torchvision]
    if taken:
        raise ValueError(f"{', '.join(taken)} already translate to another op kind")
    REGISTRY[entry.kind] = entry
    return entry


def for_transform(name: str) -> OpDef | None:
    """The entry translating the torchvision class ``name``, or ``None``."""
    return next((e for e in REGISTRY.values() if name in e.torchvision), None)


def names() -> tuple[str, ...]:
    """Every torchvision class name some entry translates, in registration order."""
    return tuple(n for e in REGISTRY.values() for n in e.torchvision)


def entry(op: Op) -> OpDef:
    """The registry entry of ``op``'s kind."""
    e = REGISTRY.get(op.kind)
    if e is None:  # from_torchvision only emits registered kinds
        raise ValueError(f"op kind={op.kind!r} has no DALI translation")
    return e


def build(images, op: Op):
    """``op`` on ``images`` in a DALI graph."""
    return entry(op).build(images, op)


class dali:
    """``pipelines.dali.<module>.<function>``, imported when first called (DALI is optional).

    ``dali("geometry.flip")(images, op)`` calls ``pipelines.dali.geometry.flip(images, op)``.
    """

    def __init__(self, path: str):
        self.path = path
        self.fn: Callable[..., Any] | None = None

    def resolve(self) -> Callable[..., Any]:
        """The function, imported once (``pipelines.dali.graph`` resolves every builder before
        DALI's conditional execution traces the graph, so the trace never meets the import)."""
        if self.fn is None:
            module, _, name = self.path.rpartition(".")
            self.fn = getattr(importlib.import_module(f"pipelines.dali.{module}"), name)
        return self.fn

    def __call__(self, *args):
        return (self.fn or self.resolve())(*args)

    def __repr__(self) -> str:
        return f"dali({self.path!r})"


__all__ = ["OpDef", "REGISTRY", "always", "build", "dali", "entry", "for_transform", "names",
           "register"]
