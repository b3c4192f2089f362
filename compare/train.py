"""``python -m compare train --backend {dali,pinned,pageable} --data DIR --epochs N``

A real, minimal training loop that users can copy: the backend is one flag, the loop never
branches on it. Under ``torchrun --nproc_per_node N`` it is DDP: each rank trains on its shard
on ``cuda:LOCAL_RANK`` and rank 0 prints the job's images and img/s (``compare.ddp``).
AMP (bf16) and channels_last on a GPU; loss and throughput printed per epoch.

``--checkpoint PATH`` saves the model, the optimiser and the loader's ``state_dict`` every
``--checkpoint-every`` steps and at each epoch's end (written atomically); its folder must
exist and lie outside ``--data`` (checked before training). ``--resume`` starts from it,
mid-epoch included; an empty or foreign file, or a checkpoint of another model, is refused in
one line before training. ``--resume-test`` proves that: it trains once uninterrupted, then
again with a real ``SIGKILL`` in the middle of the second epoch, restarts from the last checkpoint,
and checks that the (epoch, batch, dataset indices) sequence joined across the kill equals the
uninterrupted one (exit 1 with the first difference otherwise).
The suite times exactly this ``TrainStep``. Arguments are checked before any work
(``compare.cli``: one line naming the option, exit 2); an epoch that yields no image, or a bad
file under ``--on-bad-file error``, stops the run with one line and exit status 1.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from . import cli
from .progress import bar

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
    p.add_argument("--checkpoint", default=None,
                   help="save model, optimiser and loader state here (see --checkpoint-every)")
    p.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints")
    p.add_argument("--resume", action="store_true", help="start from --checkpoint if it exists")
    p.add_argument("--resume-test", action="store_true",
                   help="kill a run mid-epoch (SIGKILL), resume it, compare with an "
                        "uninterrupted run (module doc)")
    p.add_argument("--log-batches", default=None, help=argparse.SUPPRESS)
    p.add_argument("--kill-after-steps", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    try:
        cli.check_dist_env()  # RANK and WORLD_SIZE come as a pair, before any work
    except ValueError as e:
        return cli.fail(PROG, e)
    if a.resume_test:
        from .resume_test import run_test

        given = argv if argv is not None else sys.argv[1:]  # python -m compare.train ...
        return run_test(a, [x for x in given if x != "--resume-test"], PROG)
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


CHECKPOINT_KEYS = ("loader", "model", "optimizer")


def check_checkpoint_path(path: str, data: str) -> None:
    """``--checkpoint``: a file whose folder exists and can be written, outside ``--data``;
    checked before any work, not at the first save.

    Raises:
        ValueError: naming ``--checkpoint``.
    """
    p = os.path.abspath(path)
    folder = os.path.dirname(p)
    if os.path.isdir(p):
        raise ValueError(f"--checkpoint {path!r} is a folder; give a file path, e.g. "
                         f"{os.path.join(path, 'checkpoint.pt')}")
    if not os.path.isdir(folder):
        raise ValueError(f"--checkpoint {path!r}: its folder {folder} does not exist; create it "
                         "or choose another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"--checkpoint {path!r}: its folder {folder} cannot be written; choose "
                         "another path")
    cli.outside_data(path, data, "--checkpoint")


def restore(path: str, device, loader, step) -> None:
    """Load the checkpoint at ``path`` into ``step`` (model, optimiser) and ``loader``.

    Everything is checked before the loader is touched: an empty file, one that is not a
    ``compare train`` checkpoint, or one of another model raises one ``ValueError`` that says
    which.
    """
    import torch

    if os.path.getsize(path) == 0:
        raise ValueError("the file is empty (a checkpoint is written whole or not at all: was it "
                         "made by something else?); delete it or drop --resume")
    try:
        ck = torch.load(path, map_location=device, weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file: one line
        raise ValueError(f"not a checkpoint torch can read ({type(e).__name__}: {e}); "
                         "give a file that compare train wrote") from None
    if not isinstance(ck, dict) or any(k not in ck for k in CHECKPOINT_KEYS):
        got = sorted(map(str, ck)) if isinstance(ck, dict) else type(ck).__name__
        raise ValueError(f"not a compare train checkpoint (it holds {got}, not "
                         f"{', '.join(CHECKPOINT_KEYS)}); give a file that compare train wrote")
    has, saved = step.module is not None, ck["model"] is not None
    if has != saved:
        raise ValueError("a checkpoint of another model: it was saved "
                         f"{'without' if not saved else 'with'} a model's weights and this run "
                         f"{'has' if has else 'has no'} model; use the --model it was saved with")
    if has:  # (a refused load ends the run: nothing half-loaded is used)
        try:
            step.module.load_state_dict(ck["model"])
            step.opt.load_state_dict(ck["optimizer"])
        except Exception as e:  # noqa: BLE001 - size mismatch, missing keys: one line
            why = " ".join(str(e).split())
            raise ValueError(f"a checkpoint of another model ({type(e).__name__}: "
                             f"{why[:300]}); use the --model it was saved with") from None
    try:
        loader.load_state_dict(ck["loader"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"its loader state does not fit this run: {e}") from None


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
            debug_indices=a.log_batches is not None,
        )
        cli.at_least("--checkpoint-every", a.checkpoint_every, 1)
        if a.resume and not a.checkpoint:
            raise ValueError("--resume needs --checkpoint PATH")
        if a.checkpoint:
            check_checkpoint_path(a.checkpoint, a.data)
        paths, classes = cli.list_dataset(a.data, on_bad_file=a.on_bad_file)
        cli.check_batches(len(paths), cfg)
        step = TrainStep(model, cfg.resolved().torch_device, num_classes=max(2, len(classes)),
                         amp_dtype=torch.bfloat16 if cuda else None, channels_last=cuda, lr=a.lr,
                         wrap=(lambda m: ddp.wrap(m, job)) if job.group else None)
        loader = create_loader(a.backend, cfg)
    except (ValueError, TypeError, ImportError) as e:
        return cli.fail(PROG, e)
    start, resumed = 0, False
    # every rank keeps its own loader state (DALI's random state differs per rank)
    ck_path = a.checkpoint and (a.checkpoint if job.rank == 0 else f"{a.checkpoint}.rank{job.rank}")
    if a.resume and os.path.exists(ck_path):
        try:
            restore(ck_path, cfg.resolved().torch_device, loader, step)
        except ValueError as e:
            loader.close()
            return cli.fail(PROG, f"--resume --checkpoint {ck_path}: {e}")
        start, resumed = loader.epoch, True
        at = loader.state_dict()["batches"]
        say(f"resumed from {ck_path} at epoch {start}, batch {at}", flush=True)
    log = open(a.log_batches, "a") if a.log_batches else None
    if log is not None and resumed:  # where it resumed, for --resume-test (compare.resume_test)
        log.write(f"# resumed {start} {at}\n")
        log.flush()
    steps = 0

    def save() -> None:
        state = {"loader": loader.state_dict(),
                 "model": step.module.state_dict() if step.module is not None else None,
                 "optimizer": step.opt.state_dict() if step.module is not None else None}
        tmp = f"{ck_path}.{os.getpid()}.tmp"
        torch.save(state, tmp)
        os.replace(tmp, ck_path)  # a kill mid-write leaves the last checkpoint whole

    with loader:
        for epoch in range(start, a.epochs):
            loader.set_epoch(epoch)  # keeps a resumed position within this epoch
            t0 = time.perf_counter()
            total, n, seen = 0.0, 0, 0
            progress = bar(len(loader), f"epoch {epoch}", "step") if job.main else None
            try:
                for images, labels in loader:
                    progress and progress.update(1)
                    loss = step(images, labels)
                    if loss is not None:
                        total += loss.float()  # stays on the device: no sync per step
                        n += 1
                    seen += len(labels)
                    steps += 1
                    if log is not None:
                        e, k = loader.position
                        log.write(f"{e} {k - 1} {','.join(map(str, loader.last_batch_indices))}\n")
                        log.flush()
                    if a.kill_after_steps is not None and steps >= a.kill_after_steps:
                        os.kill(os.getpid(), signal.SIGKILL)  # the resume test's pre-emption
                    if a.checkpoint and steps % a.checkpoint_every == 0:
                        save()
            except BadFileError as e:  # the data, not a bug: one line
                return cli.fail(PROG, f"epoch {epoch}: {e}", 1)
            finally:
                progress and progress.close()
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            seen = sum(job.gather(seen))  # the job's images (one rank: this one's)
            if not seen and resumed and epoch == start:  # saved at this epoch's very end
                continue
            if not seen:  # e.g. every file of the epoch skipped as bad
                bad = len(getattr(getattr(loader, "stats", None), "epoch_bad", ()))
                why = f" ({bad} bad files skipped)" if bad else ""
                return cli.fail(PROG, f"epoch {epoch} yielded no image{why}: no loss to "
                                f"report; check --data {a.data}", 1)
            if a.checkpoint:
                save()
            mean = f"{(total / n).item():.4f}" if n else "-"
            ranks = f", {job.world} ranks" if job.group else ""
            who = " (rank 0)" if job.group else ""
            say(f"epoch {epoch}: loss {mean}{who}  {seen} images in {dt:.1f}s "
                f"({seen / dt:.0f} img/s, backend={a.backend}{ranks})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
