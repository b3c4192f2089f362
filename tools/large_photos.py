"""``python -m tools.large_photos --data DIR``: the crop-first decoders side by side on large
photos (issue 45): loader-only ``pinned``, batch 64, one line per decoder with the median and
range of its repeats, candidates alternating (each repeat runs them in a rotated order). A
candidate whose package is missing here is reported and skipped (the loader would run it as
``scaled``).

``--per-image``: instead, each decoder's crop alone (decode, crop and resize of
``RandomResizedCrop(224)``, the same draws), per image in one process, candidates alternating
image by image, in CPU time (``time.process_time``: steadier than the wall clock on a shared
machine): the median, 10th-90th percentile and the speed-up over the first candidate.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from pipelines import AugmentSpec, LoaderConfig, create_loader
from pipelines.config import Decoder
from pipelines.options import TorchOptions
from pipelines.torch_backend import region
from pipelines.torch_backend.decode import scaled_crop

CANDIDATES = ("scaled", "vips", "region", "torchvision")


def _usable(names) -> list[str]:
    out = []
    for n in names:
        d = Decoder(n)
        if d in region.PACKAGES and not region.available(d):
            print(f"{n:12s} skipped: {region.PACKAGES[d]} is not installed "
                  "(pip install 'gpu-feed[region]')")
            continue
        out.append(n)
    return out


def _rate(decoder: str, a) -> float:
    """Images per second of one loader-only run: ``a.batches`` batches after ``a.warmup``."""
    cfg = LoaderConfig(root=a.data, batch_size=a.batch_size, device=a.device,
                       num_workers=a.workers, augment=AugmentSpec(size=224), seed=0)
    cuda = torch.device(a.device).type == "cuda"
    with create_loader("pinned", cfg, TorchOptions(decoder=Decoder(decoder))) as ld:
        it = iter(_forever(ld))
        for _ in range(a.warmup):
            next(it)
        if cuda:
            torch.cuda.synchronize()
        t, n = time.perf_counter(), 0
        for _ in range(a.batches):
            x, _ = next(it)
            n += len(x)
        if cuda:
            torch.cuda.synchronize()
        return n / (time.perf_counter() - t)


def _forever(ld):
    epoch = 0
    while True:
        ld.set_epoch(epoch)
        yield from ld
        epoch += 1


def loader_only(a) -> None:
    names = _usable(a.decoders)
    rates: dict[str, list[float]] = {n: [] for n in names}
    for r in range(a.repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            rates[n].append(_rate(n, a))
    for n in names:
        v = rates[n]
        spread = (max(v) - min(v)) / statistics.median(v)
        print(f"{n:12s} {statistics.median(v):8.1f} img/s  ({min(v):.1f}-{max(v):.1f}, "
              f"{a.repeats} repeats of {a.batches} batches of {a.batch_size}, {a.workers} workers)"
              + ("  spread over 10%: noisy" if spread > 0.1 else ""))


def per_image(a) -> None:
    from torchvision.transforms import v2

    torch.set_num_threads(1)
    crops = {"scaled": scaled_crop, **{d.value: f for d, f in region.CROPS.items()}}
    names = [n for n in _usable(a.decoders) if n in crops]
    paths = sorted(p for p in Path(a.data).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    blobs = [p.read_bytes() for p in paths[: a.images]]
    t = v2.RandomResizedCrop(224, antialias=True)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(a.repeats):
        for i, data in enumerate(blobs):
            k = (i + r) % len(names)
            for n in names[k:] + names[:k]:
                torch.manual_seed(1000 * r + i)  # every candidate draws the same crop
                s = time.process_time()
                if crops[n](data, t) is None:
                    raise SystemExit(f"{paths[i]}: {n} cannot take it (not an upright JPEG)")
                times[n].append(time.process_time() - s)
    base = np.array(times[names[0]])
    for n in names:
        v = np.array(times[n])
        print(f"{n:12s} {1e3 * np.median(v):7.2f} ms/image (p10 {1e3 * np.percentile(v, 10):.2f}, "
              f"p90 {1e3 * np.percentile(v, 90):.2f}); over {names[0]}: {base.sum() / v.sum():.3f}x "
              f"in total, per image median {np.median(base / v):.3f}x "
              f"({len(blobs)} images x {a.repeats})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.large_photos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a dataset root (ImageFolder, list or shards)")
    p.add_argument("--decoders", default=",".join(CANDIDATES),
                   help=f"comma-separated Decoder values (default: {','.join(CANDIDATES)})")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--warmup", type=int, default=10, help="batches before the clock starts")
    p.add_argument("--batches", type=int, default=40, help="timed batches per repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--per-image", action="store_true",
                   help="time each decoder's crop alone, per image (module docstring)")
    p.add_argument("--images", type=int, default=100, help="--per-image: files used")
    a = p.parse_args(argv)
    a.decoders = [d.strip() for d in a.decoders.split(",") if d.strip()]
    bad = [d for d in a.decoders if d not in {x.value for x in Decoder}]
    if bad:
        p.error(f"--decoders {','.join(bad)}: not a decoder ({', '.join(x.value for x in Decoder)})")
    (per_image if a.per_image else loader_only)(a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
