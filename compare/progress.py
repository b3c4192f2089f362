"""Progress bars (tqdm on stderr) only when stdout is a terminal; ``GPU_FEED_PROGRESS=0|1``
turns them off or on."""
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
    """Whether bars are drawn (the rule of ``data_gen.generate.progress_shown``)."""
    from data_gen.generate import progress_shown

    return progress_shown()


def bar(total: int, desc: str, unit: str = "it"):
    """A tqdm bar of ``total`` ``unit`` (module doc), or a quiet stand-in."""
    if not shown():
        return _Quiet()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, leave=False)
