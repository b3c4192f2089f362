"""Progress bars for long steps (tqdm), shown only when stdout is a terminal.

``bar(total, desc, unit)`` returns a ``tqdm`` bar on stderr, or a no-op with the same
``update``/``close`` when stdout is not a TTY (a log file, CI, a pipe), so logs keep only the
lines the commands print. ``GPU_FEED_PROGRESS=0`` turns bars off, ``=1`` forces them on.
"""
from __future__ import annotations


class _Quiet:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def shown() -> bool:
    """Whether bars are drawn: ``GPU_FEED_PROGRESS`` when set, else stdout is a terminal (the
    rule data_gen's bars follow too: ``data_gen.generate.progress_shown``)."""
    from data_gen.generate import progress_shown

    return progress_shown()


def bar(total: int, desc: str, unit: str = "it"):
    """A tqdm bar of ``total`` ``unit`` (module doc), or a quiet stand-in."""
    if not shown():
        return _Quiet()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, leave=False)
