"""``python -m compare [run options] | train | doctor | fuzz``: the suite's entry point.

It parses the run's options without importing torch (``compare.args``, whose docstring is the
``--help`` text), then hands over to ``compare.suite``; sub-commands go to their own modules.
"""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "doctor":
        from .doctor import main as doctor_main

        return doctor_main(argv[1:])
    if argv and argv[0] == "train":
        from .train import main as train_main

        return train_main(argv[1:])
    if argv and argv[0] == "fuzz":
        from .fuzz import main as fuzz_main

        return fuzz_main(argv[1:])
    from .args import parse_args

    a = parse_args(argv)  # --help and usage errors end here, before torch is imported
    from .suite import run

    return run(a)


if __name__ == "__main__":
    sys.exit(main())
