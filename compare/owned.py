"""Which files in an output folder the suite wrote, so that it never replaces or deletes another's.

NOTE [files the suite owns]
A run writes only names that do not exist yet or hold a file of the kind the suite writes there
(``is_ours``: a compare results.json, a summary.md under the report's title, a matplotlib PNG, an
``error.log`` under ``ERROR_MARK``). Anything else, or a file the command reads, is refused before
any work (``check_out``): the one guard of the run and of ``plot``, ``report`` and ``scaling``.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

ERROR_MARK = "# the traceback of a failed `python -m compare` run (this line marks it as the suite's)"
SUMMARY_TITLE = "# gpu-feed comparison"
SCALING_TITLE = "# gpu-feed scaling"  # compare.scaling --out
# the files every run of the suite writes into --out (compare.report.plots: the PNGs)
SUITE_FILES = ("results.json", "summary.md", "throughput.png", "timeline.png")


def _head(path: Path, n: int = 4096) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def is_ours(path: Path, name: str | None = None) -> bool:
    """Whether ``path`` holds a file of the kind the suite writes under ``name`` (default: its
    own name; module NOTE)."""
    path = Path(path)
    if not path.is_file() or path.is_symlink():
        return False
    name = name or path.name
    if name == "results.json":
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError):
            return False
        return isinstance(d, dict) and {"schema", "env", "setup"} <= set(d)
    if name.endswith(".md"):
        return _head(path).startswith((SUMMARY_TITLE.encode(), SCALING_TITLE.encode()))
    if name.endswith(".png"):
        head = _head(path)
        return head.startswith(b"\x89PNG") and b"matplotlib" in head
    if name.endswith(".log"):
        return _head(path).startswith(ERROR_MARK.encode())
    return False


def check_out(out: Path, option: str = "--out", names: Iterable[str] = SUITE_FILES,
              reads: Iterable[Path] = (), kind: str | None = None) -> None:
    """Refuse (a ``ValueError`` naming ``option``) when a file the command would write in ``out``
    is one it reads, or exists and is not the suite's file of its name (of ``kind``'s when given:
    ``report --out`` writes a summary, never over a results.json)."""
    read = [r for r in reads if os.path.exists(r)]
    for p in (Path(out) / n for n in names):
        if p.exists() and any(os.path.samefile(p, r) for r in read):
            why = "a file this command reads"
        elif (p.exists() or p.is_symlink()) and not is_ours(p, kind):
            why = "a file the suite did not write"
            why = "a results file of the suite" if is_ours(p, "results.json") else why
        else:
            continue
        raise ValueError(f"{option}: {str(p)!r} is {why} and would be replaced; choose another {option}")


def error_log(out: Path) -> Path:
    """``error.log``, or the first free ``error-N.log`` when that holds another's file."""
    out = Path(out)
    p = out / "error.log"
    k = 1
    while (p.exists() or p.is_symlink()) and not is_ours(p):
        p = out / f"error-{k}.log"
        k += 1
    return p


def write_error_log(out: Path, text: str) -> Path:
    """Write ``text`` (a traceback) to ``error_log(out)`` under ``ERROR_MARK``; its path."""
    p = error_log(out)
    p.write_text(f"{ERROR_MARK}\n{text}")
    return p


def drop_stale_error_log(out: Path) -> Path | None:
    """Delete ``out/error.log`` when an earlier failed run of the suite wrote it."""
    p = Path(out) / "error.log"
    if is_ours(p):
        p.unlink(missing_ok=True)
        return p
    return None
