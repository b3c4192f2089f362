"""The host's CPU speed, probed: how long one core takes to decode a fixed JPEG with PIL.

A shared machine (a VM among other tenants) does not give its processes the same CPU speed from
one hour to the next, and the torch backends, which decode on the CPU, follow it. ``probe_ms``
decodes one fixed JPEG with PIL, the baseline's own decoder, on the calling thread, and returns
the fastest of a few rounds (the fastest is the least disturbed by the scheduler).
``python -m tools.microbench host-probe`` times it on one core shared with spinning processes:
it follows the share of a core a process gets (docs/results/cpu/host-probe.txt), and it is
noisy, off by a third on a small VM.
"""
from __future__ import annotations

import io
import time
from functools import lru_cache

import numpy as np

SIZE = (640, 480)     # the probe image, in pixels: a typical photo of the default data
DECODES = 8           # decodes per round
ROUNDS = 3            # rounds; the fastest counts


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

