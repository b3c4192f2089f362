"""What ``Batch.labels`` holds (``LoaderConfig.target``), computed once when the dataset is
listed, so every backend yields the same targets for the same indices.

* ``"class"`` (default): the class index of each sample, as the source lists it (class
  folders, a list's label column, a shard's ``.cls`` / ``.json``); the backends carry it
  themselves.
* ``"none"``: no label: ``labels`` are the samples' dataset indices (int64), so
  self-supervised code can look samples up.
* a callable ``target_fn(relative_path)``: called once per sample when the loader is built,
  with the sample's path relative to the root (a shard sample's ``SHARD.tar/KEY.ext``); it
  returns an int (``labels``: int64 ``N``) or a sequence of floats, the same length for every
  sample (``labels``: float32 ``N x K``; multi-hot vectors for multi-label data, values for
  regression). Nothing is pickled per sample and no worker calls it.

Targets other than ``"class"`` are gathered by the dataset indices of each batch
(``Batch.indices``) and copied to the device with the batch.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

KINDS = ("class", "none")


def check_target(target: Any) -> Any:
    """``target`` if it is one of ``KINDS`` or a callable, else a ``ValueError`` naming it."""
    if callable(target) or (isinstance(target, str) and target in KINDS):
        return target
    raise ValueError(f"target={target!r} must be one of {list(KINDS)} or a callable "
                     "target_fn(relative_path) -> int | sequence of float")


def build_targets(target: Any, paths: Sequence[str], root: str | os.PathLike
                  ) -> torch.Tensor | None:
    """The targets of every sample (a CPU tensor indexed by dataset index), or ``None`` for
    ``"class"`` (the backends' own labels).

    Raises:
        ValueError: naming ``target``: the callable raised, or returned something that is not
            an int or a sequence of finite floats of one length.
    """
    if target == "class":
        return None
    if target == "none":
        return torch.arange(len(paths), dtype=torch.int64)
    fn: Callable[[str], Any] = target
    from pipelines.sources.root import root_base

    base = root_base(root)
    rows: list = []
    for p in paths:
        rel = os.path.relpath(p, base)
        try:
            v = fn(rel)
        except Exception as e:  # noqa: BLE001 - the user's function, named with its sample
            raise ValueError(f"target: target_fn({rel!r}) raised {type(e).__name__}: {e}"
                             ) from None
        rows.append(_value(v, rel, rows[0] if rows else None))
    if not rows:
        return torch.empty(0, dtype=torch.int64)
    if isinstance(rows[0], int):
        return torch.tensor(rows, dtype=torch.int64)
    return torch.tensor(rows, dtype=torch.float32)


def _value(v: Any, rel: str, first: Any) -> Any:
    if isinstance(v, bool) or not (isinstance(v, int) or _floats(v)):
        raise ValueError(f"target: target_fn({rel!r}) returned {v!r}; it must return an int "
                         "or a sequence of finite floats")
    if isinstance(v, int):
        if first is not None and not isinstance(first, int):
            raise ValueError(f"target: target_fn({rel!r}) returned an int, but a sequence for "
                             "the first sample; return one kind for every sample")
        return v
    out = [float(x) for x in v]
    if first is not None and (isinstance(first, int) or len(first) != len(out)):
        raise ValueError(f"target: target_fn({rel!r}) returned {len(out)} values, the first "
                         f"sample {1 if isinstance(first, int) else len(first)}; return one "
                         "length for every sample")
    return out


def _floats(v: Any) -> bool:
    try:
        return len(v) > 0 and all(not isinstance(x, bool) and math.isfinite(float(x)) for x in v)
    except (TypeError, ValueError):
        return False
