"""Which files in an output folder the suite wrote, so that it never replaces or deletes another's.

NOTE [files the suite owns]
A run writes only names that do not exist yet or hold a file of the kind the suite writes there
(``is_ours``: a compare results.json, a summary.md under the report's title, a matplotlib PNG, an
``error.log`` under ``ERROR_MARK``). Anything else is refused before any work (``check_out``).
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

ERROR_MARK = "# the traceback of a failed `python -m compare` run (this line marks it as the suite's)"
SUMMARY_TITLE = "# gpu-feed comparison"
# the files every run of the suite writes into --out (compare.report.plots: the PNGs)
SUITE_FILES = ("results.json", "summary.md", "throughput.png", "timeline.png")


def _head(path: Path, n: int = 4096) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def is_ours(path: Path) -> bool:
    """Whether ``path`` holds a file of the kind the suite writes under its name (module NOTE)."""
    path = Path(path)
    if not path.is_file() or path.is_symlink():
        return False
    name = path.name
    if name == "results.json":
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError):
            return False
        return isinstance(d, dict) and {"schema", "env", "setup"} <= set(d)
    if name.endswith(".md"):
        return _head(path).startswith(SUMMARY_TITLE.encode())
    if name.endswith(".png"):
        head = _head(path)
        return head.startswith(b"\x89PNG") and b"matplotlib" in head
    if name.endswith(".log"):
        return _head(path).startswith(ERROR_MARK.encode())
    return False


def foreign(out: Path, names: Iterable[str] = SUITE_FILES) -> list[str]:
    """The ``names`` in ``out`` that exist and are not the suite's (``is_ours``)."""
    out = Path(out)
    return [n for n in names if (out / n).exists() or (out / n).is_symlink() if not is_ours(out / n)]


def check_out(out: Path, option: str = "--out", names: Iterable[str] = SUITE_FILES) -> None:
    """Refuse ``out`` (a ``ValueError`` naming ``option``) when a file the run would write there
    is not the suite's."""
    theirs = foreign(out, names)
    if theirs:
        raise ValueError(f"{option} {str(out)!r} holds {', '.join(theirs)}, which the suite did "
                         f"not write and would replace; choose another {option} or move "
                         f"{'them' if len(theirs) > 1 else 'it'}")


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
