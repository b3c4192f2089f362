"""The graph's random numbers: columns of the row of draws fed with each sample.

The graph has no random operator (``pipelines.transforms.draws`` NOTE [one plan]). While it is built,
each op that needs random numbers takes the next columns of the fed row here, and the
:class:`Row` records what they are, in order: the ``DrawPlan`` the source fills the rows by.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

from nvidia.dali import fn, types
from nvidia.dali import math as dmath

from pipelines.transforms.draws import DrawPlan, Step

_ROWS: list[Row] = []  # the row of the graph being built


class Row:
    """The fed row (a 1-D float32 DataNode per sample) and the steps taken from it."""

    def __init__(self, node):
        self.node = node
        self.steps: list[Step] = []
        self.width = 0
        self.size = None  # the fed output size's columns, once taken (out_size)

    def take(self, step: Step, vector: bool = False):
        """The step's columns: a scalar per sample for one column (unless ``vector``), else
        a 1-D vector."""
        c = self.width
        self.steps.append(step)
        self.width += step.width
        return self.node[c] if step.width == 1 and not vector else self.node[c:c + step.width]

    def plan(self) -> DrawPlan:
        return DrawPlan(tuple(self.steps))


@contextlib.contextmanager
def building(node) -> Iterator[Row]:
    """Make ``node`` the row that the ops built inside take their numbers from."""
    row = Row(node)
    _ROWS.append(row)
    try:
        yield row
    finally:
        _ROWS.remove(row)


def _row() -> Row:
    if not _ROWS:
        raise RuntimeError("pipelines.dali.draws: random numbers are taken only while "
                           "build_pipeline builds a graph")
    return _ROWS[-1]


def out_size(which: str):
    """The output size of the sample's epoch, fed with its row (a ``"size"`` step, taken once
    per graph; ``pipelines.resolution``): ``which="hw"``: ``[height, width]`` (a float
    vector), ``"resize"``: the eval ``resize_size`` (a float)."""
    row = _row()
    if row.size is None:
        row.size = row.take(Step("size"), vector=True)
    return row.size[0:2] if which == "hw" else row.size[2]


def window(scale: Sequence[float], ratio: Sequence[float]):
    """A leading ``RandomResizedCrop``'s window ``(start, shape)`` as ``[y, x]`` / ``[h, w]``,
    drawn on the host as torchvision draws it."""
    w = _row().take(Step("window", scale=(float(scale[0]), float(scale[1])),
                         ratio=(float(ratio[0]), float(ratio[1]))))
    return w[0:2], w[2:4]


def trivial(bins: int, mags: Sequence[bool], signs: Sequence[bool]):
    """``TrivialAugmentWide``'s op, magnitude bin and sign (1: negate), each INT32, drawn on
    the host as torchvision draws them (``pipelines.transforms.draws.Step``)."""
    c = _row().take(Step("trivial", bins=int(bins), mags=tuple(map(bool, mags)),
                         signs=tuple(map(bool, signs))))
    return tuple(fn.cast(c[k], dtype=types.INT32) for k in range(3))


def coin(p: float):
    """A float ``1.0`` with probability ``p`` (``torch.rand(1) < p``), else ``0.0``."""
    return _row().take(Step("coin", p=float(p)))


def uniform(lo: float, hi: float, shape: Sequence[int] | None = None):
    """Uniform on ``[lo, hi)``: a scalar, or a 1-D vector of ``shape[0]``; a constant ``lo``
    when the range is empty (nothing is drawn)."""
    if not hi > lo:
        return float(lo)
    k = int(math.prod(shape)) if shape else 1
    u = _row().take(Step("uniform", count=k), vector=shape is not None)
    return u * (float(hi) - float(lo)) + float(lo)


def integer(n: int, shape: Sequence[int] | None = None):
    """Uniform on ``{0, ..., n - 1}`` as INT32."""
    u = _row().take(Step("uniform", count=int(math.prod(shape)) if shape else 1),
                    vector=shape is not None)
    return fn.cast(dmath.min(dmath.floor(u * float(n)), float(n - 1)), dtype=types.INT32)


def choice(p: Sequence[float]):
    """An index drawn with the probabilities ``p`` (INT32)."""
    u = _row().take(Step("uniform"))
    total = float(sum(p))
    k = None
    acc = 0.0
    for q in list(p)[:-1]:
        acc += float(q) / total
        hit = fn.cast(u >= acc, dtype=types.INT32)
        k = hit if k is None else k + hit
    return k if k is not None else types.Constant(0, dtype=types.INT32)
