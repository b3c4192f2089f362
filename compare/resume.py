"""``--resume``: finish an isolated run that stopped early (a time limit, a lost machine).

NOTE [resume]: units run in a seeded order and ``results.json`` is rewritten after each one,
so a stopped run holds exactly the first N units of its ``setup["order"]``. ``--resume`` with
the same command runs the others, in the same order, into the same file. It refuses a file
whose setup (options, dataset, order) or host and software differ: one table comes from one
machine and one command. See docs/benchmarking.md ("Resuming a run").
"""
from __future__ import annotations

import json
from pathlib import Path

from .diff import host_changes
from .results import Repeat, SuiteResult, strict

# the GPU facts that are not in diff.HOST (a resumed table must come from one GPU too)
GPU = ("gpu", "gpu_memory_gib", "cudnn", "simplejpeg")
# setup keys a stopped run adds that the resumed one does not have yet
ADDED = ("error",)


def load_partial(out: Path) -> SuiteResult:
    """The stopped run in ``out``; ``ValueError`` naming ``--resume`` when there is none."""
    path = Path(out) / "results.json"
    if not path.is_file():
        raise ValueError(f"--resume: {path} does not exist, so no isolated run stopped there "
                         "(only those can be resumed: --isolate, the default with CUDA); run "
                         "without --resume to start")
    try:
        saved = SuiteResult.load(path)
    except (ValueError, KeyError, TypeError) as e:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"--resume: {path} is not a results.json of this version ({e})") from None
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
    keys = sorted(k for k in (set(now) | set(saved.setup)) - set(ADDED)
                  if now.get(k) != saved.setup.get(k))
    if keys:
        raise ValueError(f"--resume: this command differs from the stopped run in "
                         f"{', '.join(keys)}; resume with the same command and dataset")
    here = SuiteResult(env, setup, None)
    moved = host_changes(saved, here) + [f"{k}: {saved.env.get(k)!r} -> {env.get(k)!r}"
                                         for k in GPU if saved.env.get(k) != env.get(k)]
    if moved:
        raise ValueError(f"--resume: the stopped run ran on another machine or software "
                         f"({'; '.join(moved)}); one table comes from one machine")


def done_units(saved: SuiteResult, units: list, labels: list[str]
               ) -> tuple[int, dict[tuple[int, bool], dict[int, Repeat]],
                          dict[int, tuple[float | None, int | None]]]:
    """``(N, repeats, meta)``: the first N ``units`` (isolate.Unit) are done in ``saved``,
    their repeats keyed as ``isolate.run_all`` keeps them; ``ValueError`` if ``saved`` is not
    such a prefix."""
    rows = {v.label: v for v in saved.variants}
    n = sum(len(v.repeats) for v in saved.variants)
    n += len(saved.ceiling.repeats) if saved.ceiling else 0
    if set(rows) - set(labels) or n > len(units):
        raise ValueError("--resume: results.json holds rows or repeats its order does not have")
    reps: dict[tuple[int, bool], dict[int, Repeat]] = {}
    meta: dict[int, tuple[float | None, int | None]] = {}
    keys = [(i, False, rows.get(label)) for i, label in enumerate(labels)]
    for index, ceiling, row in keys + [(0, True, saved.ceiling)]:
        mine = sorted(u.repeat for u in units[:n] if u.ceiling == ceiling and
                      (ceiling or u.index == index))
        have = row.repeats if row is not None else ()
        if len(mine) != len(have):
            raise ValueError(f"--resume: results.json is not the first {n} units of its order")
        if mine:
            reps[(index, ceiling)] = dict(zip(mine, have, strict=True))
            if not ceiling and row is not None:
                meta[index] = (row.h2d_bytes_per_sample, row.queue_batches)
    return n, reps, meta
