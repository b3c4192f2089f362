"""``--long``: the steady-state check, a window of at least 10x each loader's queue that crosses
an epoch boundary (compare.isolate NOTE [steady state])."""
from __future__ import annotations

from . import Probe

QUEUES = 10  # a --long window holds at least this many times its loader's queue


class Long(Probe):
    name = "long"
    mode = ("window", "default", "long (--long)")

    def add_arguments(self, add) -> None:
        add("--long", action="store_true", lab=True,
            help=f"time a window of at least {QUEUES}x each loader's queue, across an epoch "
                 "boundary (the steady-state check)")

    def window(self, setting, n, queue, epoch_batches) -> int:
        return max(n, QUEUES * (queue or 0), epoch_batches + 1)

    def summary_lines(self, res) -> list[str]:
        if not res.setup.get("long"):
            return []
        return [f"**Long windows** (`--long`): each timed window held at least {QUEUES}x its "
                "loader's queue and crossed an epoch boundary; `compare diff` against a run "
                "without it shows whether the default window timed the steady state.", ""]


PROBE = Long()
