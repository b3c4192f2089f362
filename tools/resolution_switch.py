"""``python -m tools.resolution_switch --data DIR``: what ``set_resolution`` costs at an epoch's
start on each backend (issue 43): the first batch of an epoch at the same size, after a switch
announced during the epoch before (``set_resolution(size, epoch=k)``), and after a switch set
just before the epoch's ``iter()`` (``set_resolution(size)``), after a warm-up epoch; the
median and range of each kind over ``--cycles`` cycles of 8 epochs, in which each kind of switch
goes once to each size and a same-size epoch follows each switch (so every kind is timed as
often at either size)."""
from __future__ import annotations

import argparse
import statistics
import time

from pipelines import AugmentSpec, LoaderConfig, available_backends, create_loader

KINDS = ("same", "ahead", "late")
LABELS = {"same": "same size", "ahead": "announced ahead", "late": "set at the epoch's start"}
CYCLE = ("same", "ahead", "same", "ahead", "same", "late", "same", "late")


def _schedule(cycles: int, small: int, big: int) -> list[tuple[str, int]]:
    """``(kind, size)`` of epochs 1, 2, ...: ``CYCLE`` over and over, the size changing at a
    switch."""
    out, size = [], small
    for kind in CYCLE * cycles:
        if kind != "same":
            size = big if size == small else small
        out.append((kind, size))
    return out


def measure(backend, cfg: LoaderConfig, cycles: int, big: int) -> dict[str, list[float]]:
    """Milliseconds from ``iter()`` to the first batch, per kind of epoch start."""
    plan = [("warm-up", cfg.augment.hw[0]), *_schedule(cycles, cfg.augment.hw[0], big)]
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
    p.add_argument("--cycles", type=int, default=3)
    a = p.parse_args(argv)
    for b in available_backends():
        cfg = LoaderConfig(root=a.data, batch_size=a.batch_size, device=a.device,
                           num_workers=a.workers, augment=AugmentSpec(size=64))
        times = measure(b, cfg, a.cycles, 96)
        med = {k: statistics.median(v) for k, v in times.items()}
        parts = [f"{LABELS[k]} {med[k]:6.1f} ms ({min(v):.1f}-{max(v):.1f})"
                 for k, v in times.items()]
        noisy = [k for k, v in times.items()
                 if statistics.stdev(v) >= 0.1 * statistics.fmean(v)]
        print(f"{b.value:9s} switch / same size: announced {med['ahead'] / med['same']:.2f}x, "
              f"at the epoch's start {med['late'] / med['same']:.2f}x; first batch: "
              + "; ".join(parts)
              + (f" [noisy: std dev >= 10% of the mean for {', '.join(noisy)}]" if noisy else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
