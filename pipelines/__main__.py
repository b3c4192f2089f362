"""``python -m pipelines [--data DIR]``: list the backends usable here and smoke-test each one."""
from __future__ import annotations

import argparse
import sys
import time

import torch

from pipelines import AugmentSpec, Backend, LoaderConfig, available_backends, create_loader


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines", description=__doc__)
    p.add_argument("--data", help="ImageFolder root to read one batch from with each backend")
    p.add_argument("--batch-size", type=int, default=32)
    a = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    avail = available_backends()
    for b in Backend:
        print(f"{b.value:9s} {'available' if b in avail else 'not installed (pip install .[dali])'}")
    if not a.data:
        return 0
    cfg = LoaderConfig(root=a.data, batch_size=a.batch_size, device=device,
                       augment=AugmentSpec(size=224), num_workers=2)
    for b in avail:
        t = time.perf_counter()
        try:
            with create_loader(b, cfg) as loader:
                x, y = next(iter(loader))
        except Exception as e:  # report and go on to the next backend
            print(f"{b.value:9s} FAILED: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        print(f"{b.value:9s} batch {tuple(x.shape)} {x.dtype} on {x.device}, labels {tuple(y.shape)}"
              f" in {time.perf_counter() - t:.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
