"""The per-sample random draws of the shared plan, made on the host for ``dali``.

NOTE [one plan]
Every backend draws a sample's augmentation from one seed, ``sample_seed(seed, epoch, index)``
(``pipelines.epoch_plan``): the torch backends seed the CPU generator with it and run the
torchvision transforms, which draw from that generator. ``dali`` cannot seed its operators
per sample, so its graph has no random operator at all: every random number it uses arrives
with the batch, as one ``float32`` row per sample made here from the same seed
(``pipelines.dali.random`` hands the row out as columns while the graph is built, and
records what each column is: a :class:`Step`).

* A leading ``RandomResizedCrop`` window and the flips are drawn exactly as torchvision draws
  them (:func:`rrc_window` is ``RandomResizedCrop.make_params`` on a generator of its own), in
  the order of the transforms, so while no other random op comes before them in the recipe
  ``dali`` crops and flips every sample as ``pinned`` and ``pageable`` do
  (``tests/test_one_plan.py``). The window needs the decoded image's size: ``dali``'s source
  reads it from the header when it first checks the file (``pipelines.dali.source``).
* ``TrivialAugmentWide``'s op, magnitude bin and sign are drawn as torchvision v2 draws them
  too (a ``"trivial"`` step), so after an exact window and flip they are the same op and
  magnitude.
* Every other random number (RandAugment's and AutoAugment's ops, colour factors, erasing
  boxes, warps, ``RandomApply`` / ``RandomChoice`` branches) is a uniform number from the same
  generator, after those. ``dali`` computes the same distributions from them, but not
  torchvision's values: its ops consume numbers in another order.

The row depends on ``(seed, epoch, index)`` only: not on the pipeline count, the hardware
decoder's share, what ran before, or the rank. So a ``dali`` loader's state is its position,
and a resumed or rebuilt loader draws what an uninterrupted one draws.

NOTE [views]
With ``AugmentSpec(views=k)`` each image is decoded once and augmented ``k`` times. View ``v``
draws from its own seed, :func:`view_seed`: the ``SeedSequence`` of ``(seed, epoch, index,
v)``. numpy pads a short entropy with zeros, so view 0's seed is ``sample_seed(seed, epoch,
index)`` itself: view 0 of ``k`` is the single view of ``views=1``, and a view's draws depend
on nothing but its key, on every backend. ``dali``'s row is then ``k`` rows of the same
:class:`Step` s side by side (a :class:`DrawPlan` with ``views=k``), view ``v``'s made from
view ``v``'s seed.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    import numpy.typing as npt

# numpy's SeedSequence constants (numpy/random/bit_generator.pyx)
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_M32 = 0xFFFFFFFF


def view_seed(seed: int, epoch: int, index: int, view: int = 0) -> int:
    """The 63-bit seed of view ``view`` of a sample (NOTE [views]); view 0's is
    ``pipelines.epoch_plan.sample_seed(seed, epoch, index)``."""
    ss = np.random.SeedSequence((seed & _M32, epoch, index, view))
    return int(ss.generate_state(1, dtype=np.uint64)[0]) >> 1


def sample_seeds(seed: int, epoch: int, indices, view: int = 0) -> np.ndarray:
    """``view_seed(seed, epoch, i, view)`` (view 0: ``pipelines.epoch_plan.sample_seed(seed,
    epoch, i)``) for every ``i`` of ``indices``, at once (numpy's ``SeedSequence`` hash,
    vectorised; ``tests/test_one_plan.py`` checks it against ``sample_seed``). Returns
    ``uint64``."""
    if not 0 <= view <= _M32:
        raise ValueError(f"sample_seeds: view={view!r} must be in [0, 2**32)")
    idx = np.asarray(indices, dtype=np.uint64)
    if idx.size and int(idx.max()) > _M32:
        raise ValueError("sample_seeds: indices must be below 2**32")
    if not 0 <= epoch <= _M32:
        raise ValueError(f"sample_seeds: epoch={epoch!r} must be in [0, 2**32)")
    n = idx.shape[0]
    M = np.uint64(_M32)
    h = _INIT_A

    def hashmix(value: np.ndarray) -> np.ndarray:
        nonlocal h
        value = (value ^ np.uint64(h)) & M
        h = (h * _MULT_A) & _M32
        value = (value * np.uint64(h)) & M
        return value ^ (value >> np.uint64(16))

    def mix(x: npt.NDArray[np.uint64], y: npt.NDArray[np.uint64]) -> np.ndarray:
        r = (np.uint64(_MIX_L) * x - np.uint64(_MIX_R) * y) & M
        return r ^ (r >> np.uint64(16))

    entropy = [np.full(n, seed & _M32, np.uint64), np.full(n, epoch, np.uint64), idx,
               np.full(n, view, np.uint64)]
    pool = [hashmix(e) for e in entropy]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    h = _INIT_B
    words = []
    for k in range(2):  # generate_state(1, uint64): two 32-bit words, low first
        v = (pool[k] ^ np.uint64(h)) & M
        h = (h * _MULT_B) & _M32
        v = (v * np.uint64(h)) & M
        words.append(v ^ (v >> np.uint64(16)))
    return ((words[1] << np.uint64(32)) | words[0]) >> np.uint64(1)


_M24 = np.uint64(0xFFFFFF)


def mt_raws(seeds: np.ndarray, count: int) -> np.ndarray:
    """The first ``count`` 32-bit outputs of torch's CPU generator after ``manual_seed(s)``,
    for every ``s`` of ``seeds`` (``N x count`` uint64).

    torch's generator is MT19937 seeded with ``s & 0xFFFFFFFF`` (``init_genrand``); this is
    that recurrence and the first twist, vectorised over the seeds. It costs about 430 numpy
    steps whatever ``N`` is, so callers pass many seeds at once (``pipelines.dali.source``
    draws a few thousand samples per call)."""
    if not 0 < count <= 227:
        raise ValueError(f"mt_raws: count={count!r} must be in [1, 227]")
    n = len(seeds)
    last = count + 397
    st = np.empty((last + 1, n), np.uint32)
    st[0] = (np.asarray(seeds, np.uint64) & np.uint64(_M32)).astype(np.uint32)
    mul = np.uint32(1812433253)
    t = np.empty(n, np.uint32)
    with np.errstate(over="ignore"):
        for j in range(1, last + 1):
            prev, cur = st[j - 1], st[j]
            np.right_shift(prev, 30, out=t)
            np.bitwise_xor(t, prev, out=t)
            np.multiply(t, mul, out=cur)
            cur += np.uint32(j)
    s = st.astype(np.uint64)
    y = (s[:count] & np.uint64(0x80000000)) | (s[1:count + 1] & np.uint64(0x7FFFFFFF))
    v = s[397:397 + count] ^ (y >> np.uint64(1)) ^ ((y & np.uint64(1)) * np.uint64(0x9908B0DF))
    v ^= v >> np.uint64(11)
    v ^= (v << np.uint64(7)) & np.uint64(0x9D2C5680)
    v ^= (v << np.uint64(15)) & np.uint64(0xEFC60000)
    v ^= v >> np.uint64(18)
    return np.ascontiguousarray((v & np.uint64(_M32)).T)


def _unit(raw: np.ndarray) -> np.ndarray:
    """``torch.rand`` (float32) from raw outputs: their low 24 bits over 2**24 (float64,
    exact)."""
    return (raw & _M24).astype(np.float64) * 2.0 ** -24


def _uniform32(raw: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """``torch.empty(1).uniform_(lo, hi)`` from raw outputs, as ATen computes it (float32
    bounds, the product and sum in double, then float32); float64 of the float32."""
    lo32, hi32 = np.float32(lo), np.float32(hi)
    return (_unit(raw) * np.float64(hi32 - lo32) + np.float64(lo32)).astype(np.float32) \
        .astype(np.float64)


def rrc_windows(raws: np.ndarray, off: np.ndarray, height: np.ndarray, width: np.ndarray,
                scale: Sequence[float], ratio: Sequence[float]):
    """torchvision's ``RandomResizedCrop`` windows ``(top, left, h, w)`` (``N x 4``) and the
    raw outputs each consumed, from each sample's raw outputs starting at ``off``.

    The algorithm of ``RandomResizedCrop.make_params`` on the numbers torch would draw: ten
    attempts of an area ``U(scale)`` and a log aspect ratio ``U(log ratio)`` (``torch.exp``
    itself, for its rounding), sizes rounded half to even, the first that fits wins and its
    offsets are ``randint``; none fits: the centre crop with the aspect ratio clamped.
    ``tests/test_one_plan.py`` checks it against torchvision."""
    n = len(off)
    rows = np.arange(n)[:, None]
    att = off[:, None] + 2 * np.arange(10)[None, :]
    H = height.astype(np.float64)[:, None]
    W = width.astype(np.float64)[:, None]
    target = H * W * _uniform32(raws[rows, att], scale[0], scale[1])
    log_ratio = torch.log(torch.tensor(ratio))
    lr = _uniform32(raws[rows, att + 1], float(log_ratio[0]), float(log_ratio[1]))
    ar = torch.exp(torch.from_numpy(lr.astype(np.float32))).numpy().astype(np.float64)
    w = np.rint(np.sqrt(target * ar))
    h = np.rint(np.sqrt(target / ar))
    fits = (w > 0) & (w <= W) & (h > 0) & (h <= H)
    found = fits.any(axis=1)
    k = np.argmax(fits, axis=1)
    r = np.arange(n)
    h_sel, w_sel = h[r, k].astype(np.int64), w[r, k].astype(np.int64)
    hh, ww = height.astype(np.int64), width.astype(np.int64)
    ri = raws[r, np.where(found, off + 2 * k + 2, off)]
    rj = raws[r, np.where(found, off + 2 * k + 3, off)]
    top = (ri % np.maximum(hh - h_sel + 1, 1).astype(np.uint64)).astype(np.int64)
    left = (rj % np.maximum(ww - w_sel + 1, 1).astype(np.uint64)).astype(np.int64)
    # the fallback: the whole image, its aspect ratio clamped to ratio, centred
    in_ratio = width.astype(np.float64) / height.astype(np.float64)
    lo_r, hi_r = min(ratio), max(ratio)
    fh = np.where(in_ratio < lo_r, np.rint(ww / lo_r), hh).astype(np.int64)
    fw = np.where(in_ratio > hi_r, np.rint(hh * hi_r), ww).astype(np.int64)
    out = np.stack([np.where(found, top, (hh - fh) // 2), np.where(found, left, (ww - fw) // 2),
                    np.where(found, h_sel, fh), np.where(found, w_sel, fw)], axis=1)
    used = np.where(found, 2 * k + 4, 20)
    return out, used


@dataclass(frozen=True)
class Step:
    """What some columns of the row are, in the order the augmentation draws them.

    ``kind``:
        ``"window"``: 4 columns ``top, left, h, w`` of a leading ``RandomResizedCrop`` with
            ``scale`` and ``ratio`` (:func:`rrc_window`).
        ``"coin"``: 1 column, ``1.0`` with probability ``p`` (``torch.rand(1) < p``, as
            torchvision's flips draw), else ``0.0``.
        ``"uniform"``: ``count`` columns, each uniform on ``[0, 1)``.
        ``"trivial"``: 3 columns ``op, bin, negate`` of ``TrivialAugmentWide``, drawn as
            torchvision v2 draws them: the op ``randint(len(mags))``; for an op with
            magnitudes (``mags``) the bin ``randint(bins)``, and for a signed one (``signs``)
            a negative magnitude when ``rand() <= 0.5``.
        ``"size"``: 3 columns ``height, width, resize``, no random number: the output size of
            the sample's epoch and its eval ``resize_size`` (``set_resolution``: the size is
            fed, so one graph serves every size; ``pipelines.resolution``).
    """

    kind: str
    count: int = 1
    p: float = 0.5
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    bins: int = 0
    mags: tuple[bool, ...] = ()
    signs: tuple[bool, ...] = ()

    @property
    def width(self) -> int:
        return {"window": 4, "trivial": 3, "size": 3}.get(self.kind, self.count)


@dataclass(frozen=True)
class DrawPlan:
    """The row layout of a graph: its :class:`Step` s in the order they draw, once per view
    (``views`` side by side, NOTE [views])."""

    steps: tuple[Step, ...]
    views: int = 1

    @property
    def view_width(self) -> int:
        """The columns of one view."""
        return sum(s.width for s in self.steps)

    @property
    def width(self) -> int:
        return self.views * self.view_width

    @property
    def needs_size(self) -> bool:
        return any(s.kind == "window" for s in self.steps)

    @property
    def carries_size(self) -> bool:
        """Whether the rows carry the output size (a ``"size"`` step)."""
        return any(s.kind == "size" for s in self.steps)

    @property
    def raw_count(self) -> int:
        """Raw outputs a view of a sample may consume: 22 per window (ten attempts and the
        offsets), one per coin or uniform number, none for the size."""
        return max(1, sum({"window": 22, "trivial": 3, "size": 0}.get(s.kind, s.count)
                          for s in self.steps))

    def raws(self, seed: int, epoch: int, indices) -> np.ndarray:
        """The raw outputs of the samples ``indices`` of ``epoch`` (:func:`mt_raws` of their
        ``sample_seeds``), ``N x (views * raw_count)``, view by view; pass many at once."""
        return np.concatenate([mt_raws(sample_seeds(seed, epoch, indices, v), self.raw_count)
                               for v in range(self.views)], axis=1)

    def rows(self, raws: np.ndarray, sizes=None, out_size=None) -> np.ndarray:
        """The ``N x width`` float32 rows from the samples' :meth:`raws`; ``sizes``: ``N x 2``
        decoded ``(height, width)``, needed when a step is a window; ``out_size``: the
        ``(height, width, resize)`` of the samples' epoch, needed when a step is a size."""
        if self.views > 1:
            k = self.raw_count
            one = DrawPlan(self.steps)
            return np.concatenate([one.rows(raws[:, v * k:(v + 1) * k], sizes, out_size)
                                   for v in range(self.views)], axis=1)
        n = len(raws)
        out = np.zeros((n, max(1, self.width)), np.float32)
        if self.needs_size and sizes is None:
            raise ValueError("DrawPlan.rows: a crop window needs the images' sizes")
        if self.carries_size and out_size is None:
            raise ValueError("DrawPlan.rows: a size step needs the epoch's out_size")
        off = np.zeros(n, np.int64)
        r = np.arange(n)
        c = 0
        for st in self.steps:
            if st.kind == "window":
                sz = np.asarray(sizes, np.int64).reshape(n, 2)
                win, used = rrc_windows(raws, off, sz[:, 0], sz[:, 1], st.scale, st.ratio)
                out[:, c:c + 4] = win
                off = off + used
            elif st.kind == "trivial":
                op = (raws[r, off] % np.uint64(len(st.mags))).astype(np.int64)
                has = np.asarray(st.mags, bool)[op]
                signed = np.asarray(st.signs, bool)[op] & has
                b = np.where(has, raws[r, off + 1] % np.uint64(max(1, st.bins)), 0)
                neg = signed & (_unit(raws[r, off + 1 + has]) <= 0.5)
                out[:, c], out[:, c + 1], out[:, c + 2] = op, b, neg
                off = off + 1 + has + signed
            elif st.kind == "size":
                out[:, c:c + 3] = np.asarray(out_size, np.float32)
            elif st.kind == "coin":
                out[:, c] = _unit(raws[r, off]) < st.p
                off = off + 1
            else:
                cols = off[:, None] + np.arange(st.count)[None, :]
                out[:, c:c + st.count] = _unit(raws[r[:, None], cols])
                off = off + st.count
            c += st.width
        return out
