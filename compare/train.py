"""``python -m compare train --backend {dali,pinned,pageable} --data DIR --epochs N``

A real, minimal training loop that users can copy: the backend is one flag, the loop never
branches on it. Under ``torchrun --nproc_per_node N`` it is DDP: each rank trains on its shard
on ``cuda:LOCAL_RANK`` and rank 0 prints the job's images and img/s (``compare.ddp``).
AMP (bf16) and channels_last on a GPU; loss and throughput printed per epoch.
The suite times exactly this ``TrainStep``. Arguments are checked before any work
(``compare.cli``: one line naming the option, exit 2); an epoch that yields no image, or a bad
file under ``--on-bad-file error``, stops the run with one line and exit status 1.
"""
from __future__ import annotations

import sys
import time

from . import cli


PROG = "python -m compare train"


def main(argv=None) -> int:
    p = cli.Parser(prog=PROG, description=__doc__,
                   formatter_class=cli.HelpFormatter)
    p.add_argument("--backend", required=True, choices=cli.BACKENDS, help="the loader")
    p.add_argument("--data", required=True, help="ImageFolder root")
    p.add_argument("--epochs", type=int, default=1, help="epochs to train")
    p.add_argument("--model", default=None, help="default: resnet50 on a GPU, tinycnn on the CPU")
    p.add_argument("--batch-size", type=int, default=None, help="default: 256 on a GPU, 32 on the CPU")
    p.add_argument("--workers", type=int, default=None, help="default: CPU cores - 2")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    p.add_argument("--seed", type=int, default=0, help="order and augmentation seed")
    p.add_argument("--on-bad-file", choices=["error", "skip"], default="error",
                   help="a file that is not a decodable image: stop with its name (error) or "
                        "replace it within its batch and count it (skip)")
    a = p.parse_args(argv)
    import torch  # after parsing: --help and usage errors return at once

    from . import ddp

    cuda = torch.cuda.is_available()
    try:
        job = ddp.start("cuda" if cuda else "cpu")
    except (ValueError, RuntimeError) as e:
        return cli.fail(PROG, f"cannot join the torchrun job: {e}")
    try:
        return _train(a, job, cuda)
    finally:
        job.finish()


def _train(a, job, cuda: bool) -> int:
    import torch

    from pipelines import AugmentSpec, BadFileError, create_loader

    from . import ddp
    from .models import TrainStep, parse_model

    say = print if job.main else (lambda *x, **k: None)
    try:  # every argument, before any work (compare.cli)
        cli.at_least("--epochs", a.epochs, 1)
        cli.positive("--lr", a.lr)
        try:
            model = parse_model(a.model or ("resnet50" if cuda else "tinycnn"))
        except ValueError as e:
            raise ValueError(f"--model: {e}") from None
        cfg = cli.loader_config(
            root=a.data, batch_size=(256 if cuda else 32) if a.batch_size is None else a.batch_size,
            augment=AugmentSpec(size=224), num_workers=a.workers, seed=a.seed,
            device="cuda" if cuda else "cpu", dtype="bfloat16" if cuda else "float32",
            channels_last=cuda, last_batch="drop", on_bad_file=a.on_bad_file,
        )
        paths, classes = cli.list_dataset(a.data)
        cli.check_batches(len(paths), cfg)
        step = TrainStep(model, cfg.resolved().torch_device, num_classes=max(2, len(classes)),
                         amp_dtype=torch.bfloat16 if cuda else None, channels_last=cuda, lr=a.lr,
                         wrap=(lambda m: ddp.wrap(m, job)) if job.group else None)
        loader = create_loader(a.backend, cfg)
    except (ValueError, TypeError, ImportError) as e:
        return cli.fail(PROG, e)
    with loader:
        for epoch in range(a.epochs):
            loader.set_epoch(epoch)
            t0 = time.perf_counter()
            total, n, seen = 0.0, 0, 0
            try:
                for images, labels in loader:
                    loss = step(images, labels)
                    if loss is not None:
                        total += loss.float()  # stays on the device: no sync per step
                        n += 1
                    seen += len(labels)
            except BadFileError as e:  # the data, not a bug: one line
                return cli.fail(PROG, f"epoch {epoch}: {e}", 1)
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            seen = sum(job.gather(seen))  # the job's images (one rank: this one's)
            if not seen:  # e.g. every file of the epoch skipped as bad
                bad = len(getattr(getattr(loader, "stats", None), "epoch_bad", ()))
                why = f" ({bad} bad files skipped)" if bad else ""
                return cli.fail(PROG, f"epoch {epoch} yielded no image{why}: no loss to "
                                f"report; check --data {a.data}", 1)
            mean = f"{(total / n).item():.4f}" if n else "-"
            ranks = f", {job.world} ranks" if job.group else ""
            who = " (rank 0)" if job.group else ""
            say(f"epoch {epoch}: loss {mean}{who}  {seen} images in {dt:.1f}s "
                f"({seen / dt:.0f} img/s, backend={a.backend}{ranks})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
