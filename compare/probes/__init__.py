"""Lab probes: opt-in plug-ins of ``python -m compare``, one file each, declaring an option
(``--help-all`` only), the fields it adds to each repeat, its summary lines, and hooks around the
timed windows. A new probe is one file here and one entry in ``_registry``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class Probe:
    """A lab probe; every hook does nothing unless the probe overrides it."""

    name = ""  # its option's dest, and its key (a bool) in results.json's setup
    fields: tuple[str, ...] = ()  # what it adds to each repeat of a row (``Repeat.probes``)
    mode: tuple[str, str, str] | None = None  # for compare diff: what it is, without, with

    def add_arguments(self, add: Callable[..., None]) -> None:
        """Add its option(s): ``add(*names, lab=True, **argparse keywords)``."""

    def setting(self, a, out) -> Any:
        """What the hooks get (picklable, for ``--isolate``); falsy: the probe is off."""
        return bool(getattr(a, self.name, False))

    def check(self, setting, root: str) -> None:
        """Before any timing: raise ``ValueError`` where the probe cannot work here."""

    def window(self, setting, n: int, queue: int | None, epoch_batches: int) -> int:
        """The timed window, in batches, given the one the run would time (``n``)."""
        return n

    def before_window(self, setting, root: str) -> dict[str, Any] | None:
        """Before each timed window: fields for the repeat, or ``None`` when it did nothing."""
        return None

    def after_windows(self, setting, rerun: Callable[[], Any], unit: str,
                      first: bool) -> dict[str, Any]:
        """After a repeat's windows: fields for the repeat; ``rerun()`` times one more window."""
        return {}

    def summary_lines(self, res) -> list[str]:
        """Its section of summary.md (empty when the run did not use it)."""
        return []

    def warnings(self, res) -> list[str]:
        return []

    def row_suffix(self, res, v) -> str:
        """What it adds to row ``v``'s label in the table."""
        return ""


def _registry() -> tuple[Probe, ...]:
    from . import cold, long, trace

    return (long.PROBE, cold.PROBE, trace.PROBE)


PROBES: tuple[Probe, ...] = _registry()
FIELDS = frozenset(f for p in PROBES for f in p.fields)


@dataclass(frozen=True)
class Active:
    """The probes a run turned on (``{name: setting}``) and their dataset; hooks in order."""

    on: dict[str, Any] = field(default_factory=dict)
    root: str = ""

    @classmethod
    def of(cls, a, out, root) -> Active:
        on = {p.name: s for p in PROBES if (s := p.setting(a, out))}
        return cls(on, str(root))

    def _each(self):
        return [(p, self.on[p.name]) for p in PROBES if p.name in self.on]

    def check(self) -> None:
        for p, s in self._each():
            p.check(s, self.root)

    def window(self, n: int, queue: int | None, epoch_batches: int) -> int:
        for p, s in self._each():
            n = p.window(s, n, queue, epoch_batches)
        return n

    def before_window(self) -> dict[str, Any] | None:
        got = [g for p, s in self._each() if (g := p.before_window(s, self.root)) is not None]
        return {k: v for g in got for k, v in g.items()} if got else None

    def after_windows(self, rerun: Callable[[], Any], unit: str, first: bool) -> dict[str, Any]:
        return {k: v for p, s in self._each() for k, v in p.after_windows(s, rerun, unit, first).items()}
