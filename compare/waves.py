"""Waves: a DataLoader's workers delivering their batches in step (NOTE [settling] in
compare.runner). Pure functions of a window's data waits, without torch, so that the report
can use them where torch is not imported."""
from __future__ import annotations

# A data wait is *long* above max(LONG_WAIT_FLOOR_MS, LONG_WAIT_TIMES x the median wait).
LONG_WAIT_FLOOR_MS, LONG_WAIT_TIMES = 20.0, 4.0


def long_waits(waits_ms) -> list[int]:
    """The indices of the long waits of a window (``LONG_WAIT_*``): the waits that stand out
    from its typical one, so that a loader-bound window, where every batch waits about as
    long, has none."""
    w = list(waits_ms)
    if not w:
        return []
    floor = max(LONG_WAIT_FLOOR_MS, LONG_WAIT_TIMES * sorted(w)[len(w) // 2])
    return [i for i, x in enumerate(w) if x > floor]


def out_of_step(waits_ms, period: int) -> bool:
    """Whether the last ``3 x period`` waits hold fewer than three long ones, that is, fewer
    than three waves of ``period`` workers delivering in step (``in_step``;
    NOTE [settling] in compare.runner). False with fewer waits than that."""
    w = list(waits_ms)[-3 * period:]
    return len(w) >= 3 * period and len(long_waits(w)) < 3


# in_step: the long waits must hold IN_STEP_SHARE of all the wait, and IN_STEP_SHARE of them
# fall on one phase
IN_STEP_SHARE = 0.7


def in_step(waits_ms, workers: int) -> bool:
    """Whether a window's data waits come as waves of ``workers`` batches: the DataLoader's
    workers, started together, each make a whole batch and deliver in order, so their batches
    arrive together and the consumer waits once per wave. True when the window holds at least
    three waves, its long waits (``long_waits``) hold ``IN_STEP_SHARE`` of its wait,
    and that share of them fall on one phase modulo ``workers`` (give or take one batch, from
    6 workers on).

    Persistent workers drift out of step over some hundreds of batches, so in a short window
    this is a start-up transient, not the steady state (NOTE [settling] in compare.runner)."""
    w = list(waits_ms or ())
    if workers < 2 or len(w) < 3 * workers:
        return False
    long = long_waits(w)
    if len(long) < 3 or sum(w[i] for i in long) < IN_STEP_SHARE * sum(w):
        return False
    slack = 1 if workers >= 6 else 0  # with few workers, one batch either side is every phase
    near = lambda a, b: min((a - b) % workers, (b - a) % workers) <= slack  # noqa: E731
    best = max(sum(near(i % workers, p) for i in long) for p in range(workers))
    return best >= IN_STEP_SHARE * len(long)
