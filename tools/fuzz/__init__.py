"""Mutation fuzzer for the image loaders: ``python -m tools.fuzz`` from the repository root.

Example:
    python -m tools.fuzz --cases 300 --seed 0 --out runs/fuzz

Modules, in the order a run uses them: ``mutations`` (one change to a valid JPEG or PNG),
``corpus`` (the mutated files of a seed), ``epoch`` (one loader epoch in a forked process
group), ``driver`` (one backend under one policy until every file has its verdict), ``child``
(that driver in a child process), ``report`` (verdicts, agreement, the summary), ``suite``
(all of it, into ``fuzz.json``) and ``cli`` (``main``).

NOTE [fuzz invariants]
Each backend runs under each ``BadFilePolicy`` in a child process of its own session
(``python -m tools.fuzz --worker SPEC``, killed as a whole after ``--timeout``), with
``shuffle=False``, ``batch_size=8``, CPU decoding, two workers (threads for DALI) and
``debug_indices=True``. The child runs every loader epoch in a forked process of its own group,
so a segfault or a hang ends that epoch only, and what it leaves behind is seen:

* ``skip``: one epoch. Every file is either yielded (``loader.last_indices``) or named once in
  ``loader.stats["bad"]``, never both, never neither.
* ``error``: every ``BadFileError`` names a file of the root (its ``path`` and its message). The
  search goes on until each bad file is found: the batches yielded before the error are decoded,
  the named file is bad, and a fresh loader reads the rest (a root of hard links to the files
  from the failing batch on, in the same order). The named file lies in the batch after the
  yielded ones (not yielded, not raised early), the named set equals the ``skip`` set, and no
  sample is replaced under ``error`` (``last_indices`` of a clean run is ``0..n-1``).
* Under neither policy may an epoch crash, hang, raise anything else, or leave a child process
  or a ``dali-read`` thread alive after ``close()`` (nor a process in its group after it exits).

A crash or hang is pinned to a file by bisection (``skip`` epochs over halves of the files that
can have been in flight), recorded as that file's ``crash`` verdict with the exception, and the
search goes on without it, up to ``--max-crashes`` files.

* One verdict per file: every backend decodes the file, or every backend calls it bad, under
  ``skip`` and ``error`` alike (``pipelines.sources.validate`` NOTE [one verdict]).

Any breach is an invariant failure (exit code 1), reported with the file's case and mutation:
the reproducer. Disagreements are also listed in ``fuzz.json``, grouped by which backends
differ and why, with the agreement rate.
"""
from .child import POLICIES, run_backend
from .cli import main
from .corpus import CLASSES, GOOD_FILES, case_bytes, make_corpus
from .driver import WINDOW, Driver
from .epoch import BATCH_SIZE
from .mutations import MUTATIONS, mutate, mutate_kind
from .report import evaluate, summary
from .suite import run_suite

__all__ = ["BATCH_SIZE", "CLASSES", "GOOD_FILES", "MUTATIONS", "POLICIES", "WINDOW", "Driver",
           "case_bytes", "evaluate", "main", "make_corpus", "mutate", "mutate_kind",
           "run_backend", "run_suite", "summary"]
