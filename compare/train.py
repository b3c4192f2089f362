"""``python -m compare train --backend {dali,pinned,pageable} --data DIR --epochs N``

A real, minimal training loop that users can copy: the backend is one flag, the loop never
branches on it. AMP (bf16) and channels_last on a GPU; loss and throughput printed per epoch.
The suite times exactly this ``TrainStep``.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from pipelines import AugmentSpec, Backend, LoaderConfig, create_loader

from .models import TrainStep, parse_model
from .runner import num_classes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m compare train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", required=True, choices=[b.value for b in Backend])
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--model", default=None, help="default: resnet50 on a GPU, tinycnn on the CPU")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    try:
        model = parse_model(a.model or ("resnet50" if cuda else "tinycnn"))
        cfg = LoaderConfig(
            root=a.data, batch_size=a.batch_size or (256 if cuda else 32),
            augment=AugmentSpec(size=224), num_workers=a.workers, seed=a.seed,
            device="cuda" if cuda else "cpu", dtype="bfloat16" if cuda else "float32",
            channels_last=cuda, last_batch="drop",
        )
        step = TrainStep(model, cfg.torch_device, num_classes=max(2, num_classes(a.data)),
                         amp_dtype=torch.bfloat16 if cuda else None, channels_last=cuda, lr=a.lr)
        loader = create_loader(a.backend, cfg)
    except (ValueError, ImportError) as e:
        print(f"compare train: error: {e}", file=sys.stderr)
        return 2
    with loader:
        for epoch in range(a.epochs):
            loader.set_epoch(epoch)
            t0 = time.perf_counter()
            total, n, seen = 0.0, 0, 0
            for images, labels in loader:
                loss = step(images, labels)
                if loss is not None:
                    total += loss.float()  # stays on the device: no sync per step
                    n += 1
                seen += len(labels)
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            mean = (total / max(n, 1)).item() if n else float("nan")
            print(f"epoch {epoch}: loss {mean:.4f}  {seen} images in {dt:.1f}s "
                  f"({seen / dt:.0f} img/s, backend={a.backend})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
