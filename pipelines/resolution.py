"""``Resolutions``: the output size of each epoch, for progressive resizing
(``LoaderBase.set_resolution``).

NOTE [sizes ahead]
Every backend makes the next epoch's first batches before that epoch's ``iter()`` (the torch
backends' epoch stream, ``dali``'s running on). A batch is made at the size of its epoch as it
is known when the batch is started: the torch sampler asks ``at(epoch)`` when it sends the
epoch's first keys, ``dali``'s source when it feeds the epoch's first batch, and both keep that
size for the whole epoch. At the epoch's ``iter()`` the loader compares it with ``at(epoch)``
then: the same, and what was made ahead is kept; another (a size set after the epoch's first
batches were started), and only then is it dropped and the epoch started afresh. So a size
announced for an epoch (``set_resolution(size, epoch=k)``) before the epoch before it ends
costs what an epoch start at the same size costs; a size set for "the next ``iter()``"
(``set_resolution(size)``) costs that too when it is set early in the epoch before, else the
drop. Either way, workers and pipelines are kept.

The state saves the size of the epoch it resumes and the sizes set for the epochs after it, so a
resumed loader runs every later epoch at the size an uninterrupted one would.
"""
from __future__ import annotations

import reprlib
from typing import Any

from pipelines.epoch_plan import as_epoch
from pipelines.transforms.spec import AugmentSpec


class Resolutions:
    """Which ``AugmentSpec`` each epoch runs (``LoaderBase.set_resolution``).

    A size set without an epoch is that of every epoch from the next ``iter()`` on (it replaces
    every size set before); one set from epoch ``k`` holds for the epochs from ``k`` up to the
    next epoch a size is set from. Example: ``set(96)``, then ``set(128, epoch=4)`` and
    ``set(160, epoch=8)``: epochs 0-3 at 96, 4-7 at 128, 8 and later at 160.

    Args:
        own: the config's ``AugmentSpec`` (the size of every epoch until one is set).
        fixed: the loader runs a user's ``transform=``, whose sizes cannot change.
        max_pixels: the most output pixels a size may have (``LoaderConfig.max_image_pixels``).
    """

    def __init__(self, own: AugmentSpec, fixed: bool = False, max_pixels: int | None = None):
        self.own = own
        self.max_pixels = max_pixels  # LoaderConfig.max_image_pixels: the largest output too
        self.fixed = fixed
        self._base = own  # every epoch before the first of _from
        self._from: dict[int, AugmentSpec] = {}  # first epoch -> its size, until the next key

    def at(self, epoch: int) -> AugmentSpec:
        """The recipe of ``epoch`` at its size."""
        first = [k for k in self._from if k <= epoch]
        return self._from[max(first)] if first else self._base

    def set(self, size: Any, epoch: Any = None) -> None:
        """``size`` from the next ``iter()`` on (``epoch=None``) or from ``epoch`` on; a
        ``ValueError`` names ``size`` or ``epoch``."""
        spec = self.spec_at(size, "set_resolution: size")
        if epoch is None:
            self._base, self._from = spec, {}
            return
        try:
            k = as_epoch(epoch)
        except ValueError as e:
            raise ValueError(f"set_resolution: {e}") from None
        self._from[k] = spec

    def spec_at(self, size: Any, what: str) -> AugmentSpec:
        """The config's recipe at ``size``, or a ``ValueError`` naming ``what``."""
        if self.fixed:
            raise ValueError(f"{what}: the loader runs transform=, whose steps fix the sizes; "
                             "progressive resizing needs the AugmentSpec recipe (augment=)")
        try:
            spec = self.own.at_size(size)
        except ValueError as e:
            head = what.rpartition(": ")[0]  # the spec's message names size= itself
            msg = f"{head}: {e}" if head and str(e).startswith("size=") else f"{what}={size!r}: {e}"
            raise ValueError(msg) from None
        h, w = spec.hw
        if self.max_pixels is not None and h * w > self.max_pixels:
            raise ValueError(f"{what}={size!r}: {h} x {w} output pixels are more than "
                             f"max_image_pixels={self.max_pixels}, the largest image the loader "
                             "decodes; choose a smaller size")
        return spec

    # -- the state (NOTE [sizes ahead]) ---------------------------------------------------------
    def saved(self, epoch: int, ran: AugmentSpec) -> dict[str, Any]:
        """The state's parts that resume ``epoch`` at ``ran``: ``resolution`` (its
        ``[height, width]``, when not the config's) and ``resolution_schedule`` (``[[epoch,
        height, width], ...]``, each later epoch whose size differs from the epoch's before)."""
        out: dict[str, Any] = {}
        if ran.hw != self.own.hw:
            out["resolution"] = list(ran.hw)
        changes, last = [], ran.hw
        for k in sorted({epoch + 1, *(k for k in self._from if k > epoch)}):
            hw = self.at(k).hw
            if hw != last:
                changes.append([k, *hw])
                last = hw
        if changes:
            out["resolution_schedule"] = changes
        return out

    def checked(self, state: dict[str, Any], epoch: int):
        """``(spec, {epoch: spec})`` of a state's parts for resuming ``epoch``, or a
        ``ValueError`` naming the field; nothing is changed."""
        spec = self.own
        if "resolution" in state:
            r = state["resolution"]
            if not (isinstance(r, list) and len(r) == 2 and all(_positive(v) for v in r)):
                raise ValueError(f"load_state_dict: resolution={reprlib.repr(r)} is not a "
                                 "[height, width] of positive ints from state_dict()")
            spec = self.spec_at(tuple(r), "load_state_dict: resolution")
        later: dict[int, AugmentSpec] = {}
        rows = state.get("resolution_schedule", [])
        if not isinstance(rows, list):
            rows = [rows]
        last = epoch
        for row in rows:
            if not (isinstance(row, list) and len(row) == 3 and all(_positive(v) for v in row)
                    and row[0] > last):
                raise ValueError(f"load_state_dict: resolution_schedule has "
                                 f"{reprlib.repr(row)}, not an [epoch, height, width] of "
                                 f"positive ints with the epochs rising after epoch {epoch}; "
                                 "pass a state from state_dict() as it is")
            later[row[0]] = self.spec_at(tuple(row[1:]), "load_state_dict: resolution_schedule")
            last = row[0]
        return spec, later

    def load(self, spec: AugmentSpec, later: dict[int, AugmentSpec]) -> None:
        """Resume with ``checked``'s result: ``spec`` until the first epoch of ``later``."""
        self._base, self._from = spec, dict(later)


def _positive(v: Any) -> bool:
    return type(v) is int and v >= 1
