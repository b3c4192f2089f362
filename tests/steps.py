"""Training steps for the suite's tests (``--step tests.steps:...``)."""
from __future__ import annotations

import time


def sleepy(ms: float = 20.0):
    """A step that only sleeps ``ms`` milliseconds: a known, steady cost."""
    def step(images, labels):
        time.sleep(ms / 1000.0)
    return step


def takes_one(images):  # the wrong signature, for the refusal test
    return None
