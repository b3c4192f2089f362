"""``python -m tools.fuzz``: mutate valid JPEG/PNG files and check that every loader copes.

Exit status 0 when every invariant holds, 1 on an invariant failure, 2 on bad usage (one line).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .child import worker
from .corpus import MARK
from .report import summary
from .suite import run_suite


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        raise _UsageError(message)


def _parse(argv) -> argparse.Namespace:
    p = _Parser(prog="python -m tools.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=300, help="mutated files (default 300)")
    p.add_argument("--seed", type=int, default=0, help="corpus seed (default 0)")
    p.add_argument("--out", required=True, help="output folder (corpus/ and fuzz.json)")
    p.add_argument("--backends", default=None, help="comma list of pageable,pinned,dali "
                   "(default: all available)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds per backend and policy before it counts as a hang (default 600)")
    p.add_argument("--jobs", type=int, default=2, help="backend runs at once (default 2)")
    p.add_argument("--max-crashes", type=int, default=100,
                   help="crashing files pinned down per run before the search stops (default 100)")
    p.add_argument("-v", "--verbose", action="store_true", help="print every disagreement")
    a = p.parse_args(argv)
    if not 1 <= a.cases <= 100_000:
        raise _UsageError(f"--cases {a.cases} must be in [1, 100000]")
    if not 0 <= a.seed < 2**32:
        raise _UsageError(f"--seed {a.seed} must be in [0, 2**32)")
    if not 0 < a.timeout < float("inf"):
        raise _UsageError(f"--timeout {a.timeout:g} must be > 0 seconds")
    if a.jobs < 1:
        raise _UsageError(f"--jobs {a.jobs} must be >= 1")
    if a.max_crashes < 0:
        raise _UsageError(f"--max-crashes {a.max_crashes} must be >= 0")
    from pipelines import Backend, available_backends  # after parsing: --help stays fast

    order = ["pageable", "pinned", "dali"]
    avail = sorted((b.value for b in available_backends()), key=order.index)
    if a.backends is None:
        a.backends = avail
    else:
        names = [s.strip().lower() for s in a.backends.split(",") if s.strip()]
        try:
            names = [Backend.parse(s).value for s in names]
        except ValueError as e:
            raise _UsageError(f"--backends: {e}") from None
        if not names or len(set(names)) != len(names):
            raise _UsageError(f"--backends {a.backends!r} must list distinct backends")
        missing = [s for s in names if s not in avail]
        if missing:
            raise _UsageError(f"--backends {','.join(missing)} not installed here "
                              "(pip install '.[dali]')")
        a.backends = names
    out = Path(a.out)
    if out.exists() and not out.is_dir():
        raise _UsageError(f"--out {a.out!r} is a file, not a folder")
    corpus = out / "corpus"
    if corpus.is_dir() and any(corpus.iterdir()) and not (corpus / MARK).exists():
        raise _UsageError(f"--out {a.out!r}: {corpus} holds files that are not a fuzz corpus")
    return a


def main(argv=None) -> int:
    """``python -m tools.fuzz``: 0 when every invariant holds, 1 on a failure, 2 on bad usage."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"] and len(argv) == 2:
        return worker(argv[1])
    try:
        a = _parse(argv)
        from compare.cli import check_dist_env

        check_dist_env()  # RANK and WORLD_SIZE come as a pair, before any work
    except (_UsageError, ValueError) as e:
        print(f"fuzz: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help
        return int(e.code or 0)
    log = lambda s: print(s, flush=True)  # noqa: E731
    try:
        result = run_suite(a.out, a.cases, a.seed, a.backends, a.timeout, a.jobs, log,
                           max_crashes=a.max_crashes)
    except KeyboardInterrupt:
        print("fuzz: interrupted", file=sys.stderr)
        return 130
    except (OSError, ValueError) as e:  # an unwritable --out, a corpus folder that is not ours
        print(f"fuzz: error: {e}", file=sys.stderr)
        return 2
    print(summary(result, verbose=a.verbose))
    print(f"wrote {Path(a.out) / 'fuzz.json'}")
    return 1 if result["invariant_failures"] else 0
