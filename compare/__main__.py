"""``python -m compare``: which backend keeps my GPU busy, and by how much?

Runs every backend on the same files, AugmentSpec, batch size, model, steps and warm-up and
writes a table, ``results.json``, PNG plots and ``summary.md`` to ``--out``.
Sub-commands: ``train`` (``python -m compare train --backend dali --data DIR --epochs 2``) and
``doctor`` (``python -m compare doctor``: /dev/shm, workers, pinned memory, CUDA, DALI).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from pipelines import AugmentSpec, Backend, LoaderConfig, available_backends
from pipelines.indexing import DatasetRootError

from .env import environment
from .models import parse_model
from .report import markdown, plots, table, warnings_for
from .results import SuiteResult
from .runner import PRESETS, Variant, make_step, parse_sweep, preset, run_ceiling, run_variant


def default_cache() -> Path:
    base = os.environ.get("GPU_FEED_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "gpu-feed")
    return Path(base)


def default_dataset(num_images: int, log) -> Path:
    from data_gen.generate import GenConfig, ensure_dataset

    out = default_cache() / f"default-{num_images}-seed0"
    log(f"dataset: {out} (generated once, then reused)")
    try:
        cfg = GenConfig(out=str(out), num_images=num_images, classes=min(100, num_images), seed=0)
        return ensure_dataset(cfg, elsewhere="set GPU_FEED_CACHE to another folder")
    except OSError as e:  # foreign files in the cache, or an unwritable one: run() reports
        raise ValueError(str(e)) from None  # ValueError as one line, not OSError


def load_transform(ref: str):
    """``"module:name"`` -> the Compose it names (or the Compose a zero-argument callable returns)."""
    import importlib

    mod, _, name = ref.partition(":")
    try:
        obj = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"--transform {ref!r} cannot be loaded ({e}); use MODULE:NAME") from None
    if callable(obj) and not hasattr(obj, "transforms"):
        obj = obj()
    if not hasattr(obj, "transforms"):
        raise ValueError(f"--transform {ref!r} is not a torchvision.transforms.v2.Compose")
    return obj


def parse_args(argv):
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(prog="python -m compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="ImageFolder root (default: generate one into the cache)")
    p.add_argument("--num-images", type=int, default=8000 if cuda else 1000,
                   help="size of the default generated dataset")
    p.add_argument("--backends", default=None,
                   help="comma list of dali,pinned,pageable (default: all available)")
    p.add_argument("--preset", choices=PRESETS, help="seeds: pageable, pin-only, pinned, dali")
    p.add_argument("--sweep", help="e.g. 'workers=0,4,8,16 pin=on,off' or 'hw=0,1.0 pipes=1,2'; "
                   "keys: workers prefetch streams pin pinmode hw pipes mmap prealloc")
    p.add_argument("--model", default="resnet50" if cuda else "tinycnn",
                   help="none, tinycnn, resnet18, resnet50, vit_b_16, vit_l_16 or synthetic:<ms>")
    p.add_argument("--batch-size", type=int, default=256 if cuda else 32)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--mode", choices=["train", "eval"], default="train")
    p.add_argument("--steps", type=int, default=50 if cuda else 5)
    p.add_argument("--warmup", type=int, default=10 if cuda else 2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=None, help="default: CPU cores - 2")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   default="bfloat16" if cuda else "float32")
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--out", default="runs/compare", help="output directory")
    p.add_argument("--no-ceiling", action="store_true", help="skip the model-only ceiling run")
    p.add_argument("--transform", metavar="MODULE:NAME",
                   help="your torchvision v2 Compose (e.g. compare.recipes:color_aug): the torch "
                        "backends run it as is, DALI runs its translation")
    return p.parse_args(argv)


def run(argv=None) -> int:
    a = parse_args(argv)
    log = lambda s: print(s, flush=True)  # noqa: E731
    try:
        parse_model(a.model)
        avail = available_backends()
        if a.backends:
            backs = [Backend.parse(b) for b in a.backends.split(",") if b]
            missing = [b.value for b in backs if b not in avail]
            if missing:
                raise ValueError(f"--backends {','.join(missing)} not installed here "
                                 "(pip install '.[dali]')")
        else:
            backs = avail
        if a.preset:
            variants = preset(a.preset, [b for b in backs])
        elif a.sweep:
            variants = parse_sweep(a.sweep, backs)
        else:
            variants = [Variant(b.value, b) for b in
                        sorted(backs, key=lambda b: [Backend.PAGEABLE, Backend.PINNED, Backend.DALI].index(b))]
        for k, v in {"steps": a.steps, "repeats": a.repeats, "batch-size": a.batch_size}.items():
            if v < 1:
                raise ValueError(f"--{k} {v} must be >= 1")
        if a.warmup < 0:
            raise ValueError(f"--warmup {a.warmup} must be >= 0")
        transform = load_transform(a.transform) if a.transform else None
        root = Path(a.data) if a.data else default_dataset(a.num_images, log)
        base = LoaderConfig(
            root=root, batch_size=a.batch_size,
            augment=AugmentSpec(mode=a.mode, size=a.image_size), num_workers=a.workers,
            dtype=a.dtype, channels_last=a.device.startswith("cuda"), device=a.device,
            last_batch="drop", seed=0, transform=transform,
        )
        if transform is not None and any(v.backend is Backend.DALI for v in variants):
            from pipelines.migrate import from_torchvision

            from_torchvision(transform)  # fail now, with the list of untranslatable transforms
        step = make_step(a.model, base, root)
    except (ValueError, ImportError, DatasetRootError) as e:
        print(f"compare: error: {e}", file=sys.stderr)
        return 2

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from data_gen.generate import read_manifest

    man = read_manifest(root)
    setup = {
        "data": str(root), "dataset": (man or {}).get("stats", {}), "model": a.model,
        "batch_size": a.batch_size, "steps": a.steps, "warmup": a.warmup, "repeats": a.repeats,
        "dtype": a.dtype, "channels_last": base.channels_last, "workers": base.num_workers,
        "prefetch": base.prefetch,
        "augment": repr(transform) if transform is not None else repr(base.augment), "device": a.device, "variants": [v.label for v in variants],
    }
    log(f"running {len(variants)} variants x {a.repeats} repeats, model {a.model}, "
        f"batch {a.batch_size}, {a.steps} steps (+{a.warmup} warm-up), workers {base.num_workers}")
    t0 = time.perf_counter()
    results = []
    captured: list = []
    for v in variants:
        want = None if (captured or a.no_ceiling or a.model == "none") else captured
        results.append(run_variant(v, base, step, steps=a.steps, warmup=a.warmup,
                                   repeats=a.repeats, log=log, capture=want))
    ceiling = None
    if captured:
        dev = captured[0][0].device
        ceiling = run_ceiling(captured[0], step, steps=a.steps, warmup=a.warmup,
                              repeats=a.repeats, device=dev, log=log)
    suite = SuiteResult(environment(), setup, ceiling, tuple(results))
    suite.dump(out / "results.json")
    (out / "summary.md").write_text(markdown(suite))
    pngs = plots(suite, out)
    print()
    print(table(suite))
    for w in warnings_for(suite):
        print(f"warning: {w}")
    print(f"\nwrote {out / 'results.json'}, {out / 'summary.md'}, "
          f"{', '.join(str(p) for p in pngs)} in {time.perf_counter() - t0:.0f}s")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "doctor":
        from .doctor import main as doctor_main

        return doctor_main(argv[1:])
    if argv and argv[0] == "train":
        from .train import main as train_main

        return train_main(argv[1:])
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
