"""``python -m compare [run] | doctor | diff | scaling | plot | report``: each command
is a module imported only when asked for (``run`` parses its options without torch).
"""
from __future__ import annotations

import importlib
import sys

# command -> (module, one-line summary); ``run`` is the default when no command is given
COMMANDS = {
    "run": ("compare.suite", "time every backend on the same files and model (the default)"),
    "doctor": ("compare.doctor", "check /dev/shm, workers, pinned memory, CUDA and DALI here"),
    "diff": ("compare.diff", "compare two results.json: faster, slower or no difference"),
    "scaling": ("compare.scaling", "a run with more ranks against one with fewer: efficiency"),
    "plot": ("compare.plot", "redraw the PNGs of a results.json"),
    "report": ("compare.report", "write the summary of a results.json again"),
}
# former commands, now in the repository's examples/ and tools/ (not installed; issue 42)
MOVED = {"fuzz": "python -m tools.fuzz", "microbench": "python -m tools.microbench",
         "train": "python examples/train.py", "memory": "python -m tools.memory"}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in MOVED:
        print(f"python -m compare: error: {argv[0]} is no longer a command; from a clone of the "
              f"repository: {MOVED[argv[0]]}", file=sys.stderr)
        return 2
    if argv and argv[0] in COMMANDS and argv[0] != "run":
        return importlib.import_module(COMMANDS[argv[0]][0]).main(argv[1:])
    if argv and argv[0] == "run":
        argv = argv[1:]
    from .args import parse_args

    a = parse_args(argv)  # --help and usage errors end here, before torch is imported
    from .suite import run

    return run(a)


if __name__ == "__main__":
    sys.exit(main())
