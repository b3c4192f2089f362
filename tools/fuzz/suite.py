"""``run_suite``: the corpus, every backend under every policy, the verdicts in ``fuzz.json``."""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from compare.env import environment

from .child import POLICIES, kill_live, run_backend
from .corpus import make_corpus
from .report import evaluate


def run_suite(out: str | os.PathLike, cases: int, seed: int, backends: Sequence[str],
              timeout: float = 600.0, jobs: int = 2, log: Callable[[str], None] = lambda s: None,
              epoch_timeout: float = 30.0, max_crashes: int = 100) -> dict:
    """Build the corpus under ``out/corpus``, run every backend x policy, write ``out/fuzz.json``.

    Returns:
        The result: ``{"cases", "seed", "backends", "seconds", "environment", "runs", "records",
        "agreement", "disagreements", "good_rejected", "invariant_failures"}``.
    """
    out = Path(out)
    t0 = time.perf_counter()
    records = make_corpus(out / "corpus", cases, seed)
    log(f"corpus: {len(records)} files in {out / 'corpus'} ({time.perf_counter() - t0:.1f} s)")
    tasks = [(b, p) for p in ("error", "skip") for b in backends]  # the long searches first

    def one(t):
        r = run_backend(t[0], out / "corpus", t[1], timeout, epoch_timeout, max_crashes)
        log(f"{t[0]}/{t[1]}: {len(r['decoded'])} decoded, {len(r['bad'])} bad, "
            f"{len(r.get('crash', {}))} crash, {r.get('epochs', 0)} epochs, {r['seconds']:.1f} s"
            + (f", {len(r['failures'])} FAILURES" if r["failures"] else ""))
        return r

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        try:
            runs = list(pool.map(one, tasks))
        except BaseException:  # Ctrl-C: stop the children (their own sessions miss the signal)
            kill_live()
            raise
    runs.sort(key=lambda r: (list(backends).index(r["backend"]), POLICIES.index(r["policy"])))
    result = {"cases": cases, "seed": seed, "backends": list(backends),
              "seconds": round(time.perf_counter() - t0, 2), "environment": environment(),
              "timeout": timeout, "runs": runs, **evaluate(records, runs)}
    (out / "fuzz.json").write_text(json.dumps(result, indent=1))
    return result
