"""``python -m tools.resolution_switch --data DIR``: what ``set_resolution`` costs at an epoch's
start on each backend (issue 43): the first batch of an epoch at the same size, after a switch
announced during the epoch before (``set_resolution(size, epoch=k)``), and after a switch set
just before the epoch's ``iter()`` (``set_resolution(size)``), after a warm-up epoch; the
median and range of ``--repeats`` of each (the kinds take turns, sizes alternate at a switch)."""
from __future__ import annotations

import argparse
import statistics
import time

from pipelines import AugmentSpec, LoaderConfig, available_backends, create_loader

KINDS = ("same", "ahead", "late")
LABELS = {"same": "same size", "ahead": "announced ahead", "late": "set at the epoch's start"}


def _schedule(repeats: int, small: int, big: int) -> list[tuple[str, int]]:
    """``(kind, size)`` of epochs 1, 2, ...: the kinds in turn, the size changing at a switch."""
    out, size = [], small
    for e in range(len(KINDS) * repeats):
        kind = KINDS[e % len(KINDS)]
        if kind != "same":
            size = big if size == small else small
        out.append((kind, size))
    return out


def measure(backend, cfg: LoaderConfig, repeats: int, big: int) -> dict[str, list[float]]:
    """Milliseconds from ``iter()`` to the first batch, per kind of epoch start."""
    plan = [("warm-up", cfg.augment.hw[0]), *_schedule(repeats, cfg.augment.hw[0], big)]
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    with create_loader(backend, cfg) as ld:
        for epoch, (kind, size) in enumerate(plan):
            if kind == "late":
                ld.set_resolution(size)
            ld.set_epoch(epoch)
            t = time.perf_counter()
            it = iter(ld)
            x, _ = next(it)
            ms = (time.perf_counter() - t) * 1e3
            if epoch + 1 < len(plan) and plan[epoch + 1][0] == "ahead":
                ld.set_resolution(plan[epoch + 1][1], epoch=epoch + 1)
            if x.shape[-1] != size:
                raise AssertionError(f"{backend.value}: epoch {epoch} is {tuple(x.shape)}, "
                                     f"not {size}")
            if kind in times:
                times[kind].append(ms)
            for _ in it:
                pass
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.resolution_switch", description=__doc__)
    p.add_argument("--data", required=True)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    for b in available_backends():
        cfg = LoaderConfig(root=a.data, batch_size=a.batch_size, device=a.device,
                           num_workers=a.workers, augment=AugmentSpec(size=64))
        times = measure(b, cfg, a.repeats, 96)
        parts = [f"{LABELS[k]} {statistics.median(v):6.1f} ms ({min(v):.1f}-{max(v):.1f})"
                 for k, v in times.items()]
        print(f"{b.value:9s} first batch: " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
