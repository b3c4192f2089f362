"""``python -m tools.resolution_switch --data DIR``: what ``set_resolution`` costs at an epoch's
start on each backend (issue 43): the first batch of an epoch at the same size against one right
after a switch, after a warm-up epoch; the median and range of 5 of each (sizes alternate)."""
from __future__ import annotations

import argparse
import statistics
import time

from pipelines import AugmentSpec, LoaderConfig, available_backends, create_loader


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.resolution_switch", description=__doc__)
    p.add_argument("--data", required=True)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    for b in available_backends():
        cfg = LoaderConfig(root=a.data, batch_size=a.batch_size, device=a.device,
                           num_workers=a.workers, augment=AugmentSpec(size=64))
        times: dict[bool, list[float]] = {False: [], True: []}
        with create_loader(b, cfg) as ld:
            for _ in ld:  # the warm-up epoch
                pass
            size = 64
            for epoch in range(1, 11):
                switch = epoch % 2 == 0
                if switch:
                    size = 96 if size == 64 else 64
                    ld.set_resolution(size)
                ld.set_epoch(epoch)
                t = time.perf_counter()
                it = iter(ld)
                x, _ = next(it)
                times[switch].append((time.perf_counter() - t) * 1e3)
                if x.shape[-1] != size:
                    raise AssertionError(f"{b.value}: epoch {epoch} is {tuple(x.shape)}, not {size}")
                for _ in it:
                    pass
        same, after = times[False], times[True]
        print(f"{b.value:9s} first batch at the same size {statistics.median(same):7.1f} ms "
              f"({min(same):.1f}-{max(same):.1f}); after set_resolution "
              f"{statistics.median(after):7.1f} ms ({min(after):.1f}-{max(after):.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
