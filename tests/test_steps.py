"""``compare.steps.host_sleep``: a step of a fixed length that queues no GPU work."""
import time

import pytest

from compare import steps
from compare.userstep import load_step


def test_host_sleep_takes_its_length_and_is_loadable_by_name():
    step = load_step("compare.steps:host_sleep(ms=30)")
    t = time.perf_counter()
    step(None, None)
    took = (time.perf_counter() - t) * 1000
    assert 30 <= took < 300


def test_a_length_not_above_zero_is_named():
    with pytest.raises(ValueError, match="ms=0"):
        steps.host_sleep(ms=0)
