"""The host's CPU speed, probed in each unit: how long one core takes to decode a fixed JPEG.

NOTE [host speed]
The torch backends decode on the CPU, so their rates follow the speed the host's cores give
them, and a shared machine (a VM among other tenants) does not give the same speed from one
hour to the next. On the H200 machine two calls of one lease started their unit processes at
different speeds, and the CPU-bound rows moved with them while DALI's did not
(docs/results/h200/seeds-reference/README.md, steady section). A run's repeats cannot show
that, and no spread model of one run can: the probe measures it
(docs/results/cpu/host-probe.txt: it follows the share of a core a process gets).

``probe_ms`` decodes one fixed JPEG with PIL, the baseline's own decoder, on the calling
thread, and returns the fastest of a few rounds (the fastest is the least disturbed by the
scheduler). Each unit takes it before it builds its loader (``Repeat.cpu_probe_ms``);
``compare diff`` compares the two runs' probes (``host_shift``), and the summary gives the
spread across the run. The probe is noisy on a noisy host: a fraction of a second on one core,
it can be off by a third on a small VM, and on the H200 machine the probes of one run spread
wider than its units' rates and did not rank them (docs/results/h200/seeds-reference/README.md,
steady section). So it is no per-unit correction, and two runs' hosts count as different only
when every probe of one ran slower than every probe of the other. A row's rate can follow the
CPU's speed at most in proportion: a change no larger than the host's, in the same direction,
is what the host alone can make (``compare.diff.judge``).
"""
from __future__ import annotations

import io
import statistics
import time
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

SIZE = (640, 480)     # the probe image, in pixels: a typical photo of the default data
DECODES = 8           # decodes per round
ROUNDS = 3            # rounds; the fastest counts
HOST_TOLERANCE = 0.05  # two runs' hosts differ when their probes differ by more than this
MIN_PROBES = 2  # probes a run needs before its host is told apart from another's


@lru_cache(maxsize=1)
def _jpeg() -> bytes:
    """The probe's JPEG: smooth gradients with seeded noise, quality 90 (the same bytes on
    every machine with the same Pillow)."""
    from PIL import Image

    w, h = SIZE
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (w + h)], axis=-1)
    img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def probe_ms(decodes: int = DECODES, rounds: int = ROUNDS) -> float:
    """Milliseconds for one core to decode the probe JPEG with PIL (the fastest round's mean)."""
    from PIL import Image

    data = _jpeg()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(decodes):
            with Image.open(io.BytesIO(data)) as im:
                im.load()
        best = min(best, (time.perf_counter() - t) / decodes)
    return round(best * 1e3, 4)


def median_ms(values: Sequence[float | None]) -> float | None:
    """The median of the probes that were taken (``None`` when none was)."""
    got = [v for v in values if v is not None and v > 0]
    return statistics.median(got) if got else None


def host_speed(a_ms: float | None, b_ms: float | None) -> float | None:
    """How much faster B's host ran than A's (``> 1``: faster) by the two probes' medians, or
    ``None`` when either run has no probe (runs before the probe was added)."""
    if not a_ms or not b_ms:
        return None
    return a_ms / b_ms


def host_shift(a_ms: Sequence[float | None], b_ms: Sequence[float | None]
               ) -> float | None:
    """B's host speed over A's (``host_speed`` of the medians) when the probes tell the two
    hosts apart: each run has ``MIN_PROBES`` or more, and every probe of one run is slower
    than every probe of the other; else ``None`` (the probes' own spread covers the gap)."""
    a = [v for v in a_ms if v is not None and v > 0]
    b = [v for v in b_ms if v is not None and v > 0]
    if len(a) < MIN_PROBES or len(b) < MIN_PROBES:
        return None
    if not (max(a) < min(b) or max(b) < min(a)):
        return None
    return host_speed(median_ms(a), median_ms(b))


def explained_by_host(ratio: float, speed: float | None,
                      tolerance: float = HOST_TOLERANCE) -> bool:
    """Whether a row's change ``ratio`` (B/A) is one the host alone can make: the hosts differ
    by more than ``tolerance``, and ``ratio`` lies between 1 and their speed ratio (a
    CPU-bound rate follows the CPU's speed at most in proportion; NOTE [host speed])."""
    if speed is None or abs(speed - 1) <= tolerance:
        return False
    lo, hi = sorted((1.0, speed * (1 + tolerance) if speed > 1 else speed * (1 - tolerance)))
    return lo <= ratio <= hi
