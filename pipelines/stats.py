"""``loader.stats``: what a loader skipped, so nothing is lost silently."""
from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import cast


class BadFileStats:
    """Counts and names the bad files a loader skipped (``on_bad_file='skip'``).

    ``bad_files`` and ``bad`` accumulate over the loader's life; ``epoch_bad`` is the current
    epoch's list. At the end of an epoch with skips, one warning names them (up to 10).
    """

    def __init__(self) -> None:
        self.bad: list[tuple[str, str]] = []
        self.epoch_bad: list[tuple[str, str]] = []
        self.dropped_batches = 0
        self.epoch = 0

    @property
    def bad_files(self) -> int:
        return len(self.bad)

    def start_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.epoch_bad = []

    def add(self, bad: Iterable[tuple[str, str]], dropped_batch: bool = False) -> None:
        bad = cast("list[tuple[str, str]]", [tuple(b) for b in bad])
        self.bad += bad
        self.epoch_bad += bad
        self.dropped_batches += int(dropped_batch)

    def end_epoch(self) -> None:
        if not self.epoch_bad:
            return
        names = ", ".join(f"{p} ({r})" for p, r in self.epoch_bad[:10])
        more = f" and {len(self.epoch_bad) - 10} more" if len(self.epoch_bad) > 10 else ""
        warnings.warn(f"epoch {self.epoch}: skipped {len(self.epoch_bad)} bad files: {names}{more}",
                      RuntimeWarning, stacklevel=2)

    def as_dict(self) -> dict:
        return {"bad_files": self.bad_files, "dropped_batches": self.dropped_batches,
                "bad": list(self.bad)}

    def __getitem__(self, key: str):
        return self.as_dict()[key]
