"""``--resume``: finish an isolated run that stopped early (a time limit, a lost machine).

NOTE [resume]: units run in a seeded order and ``results.json`` is rewritten after each one,
so a stopped run holds the first N units of its ``setup["order"]``; the same command with
``--resume`` runs the others into the same file. One table comes from one command and one
machine: another setup, host or software is refused (docs/benchmarking.md, Resuming a run).
"""
from __future__ import annotations

import json
from pathlib import Path

from .diff import host_changes
from .results import SuiteResult, strict

GPU = ("gpu", "gpu_memory_gib", "cudnn", "simplejpeg")  # the facts diff.HOST leaves out


def load_partial(out: Path) -> SuiteResult:
    """The stopped run in ``out``; ``ValueError`` naming ``--resume`` when there is none."""
    path = Path(out) / "results.json"
    if not path.is_file():
        raise ValueError(f"--resume: {path} does not exist, so no isolated run stopped there (only those "
                         "can be resumed: --isolate, the default with CUDA); run without --resume to start")
    try:
        saved = SuiteResult.load(path)
    except (ValueError, OSError) as e:  # torn, cut short, overwritten, or of another version
        raise ValueError(f"--resume: {path} is damaged or not a results.json of this version, so it "
                         f"cannot be resumed: {e}") from None
    if saved.complete:
        raise ValueError(f"--resume: the run in {path} is complete, nothing to resume; drop "
                         "--resume to run again (into another --out to keep it)")
    if not saved.setup.get("isolate"):
        raise ValueError(f"--resume: the run in {path} was not isolated; only isolated runs "
                         "(--isolate, the default with CUDA) can be resumed")
    return saved


def check_same(saved: SuiteResult, setup: dict, env: dict) -> None:
    """``ValueError`` naming what differs between ``saved`` and this run's setup and host."""
    now = json.loads(json.dumps(strict(setup), default=str))  # as results.json holds it
    keys = sorted(k for k in (set(now) | set(saved.setup)) - {"error"}  # a stop's reason
                  if now.get(k) != saved.setup.get(k))
    if keys:
        raise ValueError(f"--resume: this command differs from the stopped run in "
                         f"{', '.join(keys)}; resume with the same command and dataset")
    moved = host_changes(saved, SuiteResult(env, setup, None)) + [
        f"{k}: {saved.env.get(k)!r} -> {env.get(k)!r}" for k in GPU if saved.env.get(k) != env.get(k)]
    if moved:
        raise ValueError(f"--resume: the stopped run ran on another machine or software "
                         f"({'; '.join(moved)}); one table comes from one machine")


def done_units(saved: SuiteResult, units: list, labels: list[str]) -> tuple[int, dict, dict]:
    """``(N, repeats, meta)``: ``saved`` holds the first N ``units`` (isolate.Unit), keyed as
    ``isolate.run_all`` keeps them; ``ValueError`` if it is not such a prefix."""
    rows = {v.label: v for v in saved.variants}
    n = sum(len(v.repeats) for v in (*saved.variants, *([saved.ceiling] if saved.ceiling else [])))
    if set(rows) - set(labels) or n > len(units):
        raise ValueError("--resume: results.json holds rows or repeats its order does not have")
    reps: dict = {}
    meta: dict = {}
    for index, ceiling, row in [(i, False, rows.get(x)) for i, x in enumerate(labels)] + [
            (0, True, saved.ceiling)]:
        mine = sorted(u.repeat for u in units[:n] if u.ceiling == ceiling and (ceiling or u.index == index))
        if len(mine) != len(row.repeats if row else ()):
            raise ValueError(f"--resume: results.json is not the first {n} units of its order")
        if mine and row is not None:
            reps[(index, ceiling)] = dict(zip(mine, row.repeats, strict=True))
            if not ceiling:
                meta[index] = (row.h2d_bytes_per_sample, row.queue_batches)
    return n, reps, meta
