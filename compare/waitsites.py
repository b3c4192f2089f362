"""Where the training loop waits for data (``--wait-sites``): its Python stack, sampled while it
waits in ``next()`` on the loader.

NOTE [wait sites]
A data wait says how long the loop waited, not on what. ``WaitSites`` runs a thread that wakes
every ``INTERVAL_S`` and, while the loop is inside ``next()`` (``waiting``, which
``metrics.measure`` sets around the call), reads the loop thread's innermost ``DEPTH`` Python
frames (``sys._current_frames``) outside the standard library, and counts them as one site,
``"dir/file.py:line function < caller < ..."``. ``stop`` gives the ``TOP`` sites with their
shares of the samples. Standard-library frames (``queue``, ``threading``, ``selectors``,
``multiprocessing``) are left out: they say how a wait is made, not whose it is.

It sees Python frames only. A wait inside native code shows as the Python call that entered
it: DALI's ``Pipeline.share_outputs`` (its executor had not finished the batch), the
DataLoader's ``_try_get_data`` (no worker had delivered), a CUDA event's ``synchronize``.
Work the loader does on the loop's thread inside ``next()`` counts as well (``pinned``'s
normalisation without CUDA). That is enough to tell the loader's own wait from the hand-over's
or the copy's. Each sample takes the GIL, so sampling is off unless asked for, and the suite
records it per repeat (``Repeat.wait_sites``) and lists it per row in the summary.
"""
from __future__ import annotations

import sys
import sysconfig
import threading
from collections import Counter

INTERVAL_S = 0.002  # between samples
DEPTH = 4           # frames a site holds, innermost first
TOP = 5             # sites kept per window


_STDLIB = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")})
_SITE = tuple({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})


def _stdlib(filename: str) -> bool:
    return filename.startswith(_STDLIB) and not filename.startswith(_SITE)


def site_of(frame, depth: int = DEPTH) -> str:
    """``frame`` and its callers outside the standard library, innermost first, as
    ``"dir/file.py:line function < ..."`` (NOTE [wait sites])."""
    parts = []
    while frame is not None and len(parts) < depth:
        code = frame.f_code
        if not _stdlib(code.co_filename):
            path = code.co_filename.replace("\\", "/").split("/")
            parts.append(f"{'/'.join(path[-2:])}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return " < ".join(parts)


class WaitSites:
    """Samples one thread's stack while its ``waiting`` is true (NOTE [wait sites]).

    Args:
        thread_id: the thread to watch (default: the one that builds this object).
        interval: seconds between samples.
    """

    def __init__(self, thread_id: int | None = None, interval: float = INTERVAL_S):
        self.thread_id = threading.get_ident() if thread_id is None else thread_id
        self.interval = interval
        self.waiting = False
        self.counts: Counter = Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if not self.waiting:
                continue
            frame = sys._current_frames().get(self.thread_id)
            if frame is not None and self.waiting:
                self.counts[site_of(frame)] += 1

    def start(self) -> WaitSites:
        self._thread = threading.Thread(target=self._run, name="wait-sites", daemon=True)
        self._thread.start()
        return self

    def stop(self, top: int = TOP) -> dict[str, float] | None:
        """The ``top`` sites and their shares of the samples; ``None`` when none was taken
        (the loop never waited as long as one interval)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        total = sum(self.counts.values())
        if not total:
            return None
        return {s: round(c / total, 3) for s, c in self.counts.most_common(top)}


def merge(sites) -> dict[str, float]:
    """The mean share of each site over several windows' ``stop()`` results (``None`` ones
    skipped), largest first."""
    got = [s for s in sites if s]
    if not got:
        return {}
    total: Counter = Counter()
    for s in got:
        total.update({k: v / len(got) for k, v in s.items()})
    return {k: round(v, 3) for k, v in total.most_common()}
