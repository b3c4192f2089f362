"""A minimal training loop to copy: the backend is one flag, the loop never branches on it.

    python examples/train.py --backend dali --data DIR --epochs 2
    python examples/train.py --backend dali --data DIR --epochs 2 --checkpoint ck.pt [--resume]
    torchrun --nproc_per_node 2 examples/train.py --backend dali --data DIR --epochs 2

It depends on ``pipelines``, torch and torchvision only. On a GPU: AMP (bf16) and channels_last.
Under torchrun each rank trains on its shard (DDP) and rank 0 prints the job's images and img/s.
``--checkpoint`` saves the model, the optimiser and the loader's ``state_dict`` every
``--checkpoint-every`` steps and at each epoch's end (atomically); ``--resume`` continues from
it, mid-epoch included. ``python -m tools.resume_test`` kills this script with SIGKILL and
checks that the resumed run joins into the uninterrupted one. A usage error is one line, exit 2.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from pipelines import AugmentSpec, BadFileError, LoaderConfig, create_loader
from pipelines.placement import placement

PROG = "examples/train.py"
CHECKPOINT_KEYS = ("loader", "model", "optimizer")
FLAGS = {"batch_size": "--batch-size", "num_workers": "--workers", "root": "--data"}


def fail(msg: object, code: int = 2) -> int:
    print(f"{PROG}: error: {' '.join(str(msg).split(chr(10)))}", file=sys.stderr, flush=True)
    return code


def tinycnn(num_classes: int):
    """A small CNN for CPU runs (a ResNet-50 step on 2 cores takes seconds)."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 7, stride=4, padding=3), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes))


def build_model(name: str, num_classes: int):
    """``tinycnn``, ``none`` (no model: time the loader) or a torchvision classification model."""
    import torchvision.models as tvm

    if name == "none":
        return None
    if name == "tinycnn":
        return tinycnn(num_classes)
    if name not in tvm.list_models(module=tvm):
        raise ValueError(f"--model {name!r} is not tinycnn, none or a torchvision classification "
                         "model (torchvision.models.list_models())")
    return getattr(tvm, name)(weights=None, num_classes=num_classes)


def check_checkpoint_path(path: str, data: str) -> None:
    """A file whose folder exists and can be written, outside ``--data`` (before any work)."""
    p = os.path.abspath(path)
    folder = os.path.dirname(p)
    if os.path.isdir(p):
        raise ValueError(f"--checkpoint {path!r} is a folder; give a file path, e.g. "
                         f"{os.path.join(path, 'checkpoint.pt')}")
    if not os.path.isdir(folder):
        raise ValueError(f"--checkpoint {path!r}: its folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"--checkpoint {path!r}: its folder {folder} cannot be written")
    data_dir = os.path.realpath(data) if os.path.isdir(data) else None
    real = os.path.realpath(p)
    if data_dir and (real == data_dir or real.startswith(data_dir + os.sep)):
        raise ValueError(f"--checkpoint {path!r} is inside --data {data!r}: it would become part "
                         "of the dataset; choose a path outside it")


def restore(path: str, device, loader, model, opt) -> None:
    """Load the checkpoint into ``model``, ``opt`` and ``loader``; every check comes before the
    loader is touched, and a refusal is one ``ValueError``."""
    if os.path.getsize(path) == 0:
        raise ValueError("the file is empty (was it made by something else?); delete it or "
                         "drop --resume")
    try:
        ck = torch.load(path, map_location=device, weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file: one line
        raise ValueError(f"not a checkpoint torch can read ({type(e).__name__}: {e})") from None
    if not isinstance(ck, dict) or any(k not in ck for k in CHECKPOINT_KEYS):
        got = sorted(map(str, ck)) if isinstance(ck, dict) else type(ck).__name__
        raise ValueError(f"not an examples/train.py checkpoint (it holds {got}, not "
                         f"{', '.join(CHECKPOINT_KEYS)})")
    if (model is None) != (ck["model"] is None):
        raise ValueError("a checkpoint of another model (one has weights, the other none); use "
                         "the --model it was saved with")
    if model is not None:
        try:
            model.load_state_dict(ck["model"])
            opt.load_state_dict(ck["optimizer"])
        except Exception as e:  # noqa: BLE001 - size mismatch, missing keys: one line
            raise ValueError(f"a checkpoint of another model ({type(e).__name__}: "
                             f"{' '.join(str(e).split())[:300]}); use the --model it was saved "
                             "with") from None
    try:
        loader.load_state_dict(ck["loader"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"its loader state does not fit this run: {e}") from None


def parse(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", required=True, choices=["pageable", "pinned", "dali"])
    p.add_argument("--data", required=True, help="ImageFolder root, file list or tar shards")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--model", default=None, help="default: resnet50 on a GPU, tinycnn on the CPU")
    p.add_argument("--batch-size", type=int, default=None, help="default: 256 GPU, 32 CPU")
    p.add_argument("--workers", type=int, default=None, help="default: cores - 2 (all on 2 or fewer)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    p.add_argument("--seed", type=int, default=0, help="order and augmentation seed")
    p.add_argument("--on-bad-file", choices=["error", "skip"], default="error")
    p.add_argument("--checkpoint", default=None, help="save model, optimiser and loader here")
    p.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints")
    p.add_argument("--resume", action="store_true", help="start from --checkpoint if it exists")
    p.add_argument("--log-batches", default=None, help=argparse.SUPPRESS)  # tools.resume_test
    p.add_argument("--kill-after-steps", type=int, default=None, help=argparse.SUPPRESS)
    p.error = lambda m: p.exit(2, f"{PROG}: error: {m}\n")  # one line, not the usage block
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse(argv)
    if a.epochs < 1:
        return fail(f"--epochs {a.epochs} must be >= 1")
    if not 0 < a.lr < float("inf"):
        return fail(f"--lr {a.lr} must be a number > 0")
    if a.checkpoint_every < 1:
        return fail(f"--checkpoint-every {a.checkpoint_every} must be >= 1")
    if a.resume and not a.checkpoint:
        return fail("--resume needs --checkpoint PATH")
    try:
        where = placement()  # RANK and WORLD_SIZE come as a pair (torchrun sets both)
        if a.checkpoint:
            check_checkpoint_path(a.checkpoint, a.data)
    except ValueError as e:
        return fail(e)
    cuda = torch.cuda.is_available()
    ddp = where.world_size > 1
    if ddp and not dist.is_initialized():
        if cuda:
            torch.cuda.set_device(where.local_rank or 0)
        dist.init_process_group("nccl" if cuda else "gloo")
    try:
        return train(a, cuda, ddp)
    finally:
        if ddp and dist.is_initialized():
            dist.destroy_process_group()


def train(a, cuda: bool, ddp: bool) -> int:
    rank, world = (dist.get_rank(), dist.get_world_size()) if ddp else (0, 1)
    say = print if rank == 0 else (lambda *x, **k: None)
    try:
        cfg = LoaderConfig(
            root=a.data, batch_size=(256 if cuda else 32) if a.batch_size is None else a.batch_size,
            augment=AugmentSpec(size=224), num_workers=a.workers, seed=a.seed,
            device="cuda" if cuda else "cpu", dtype="bfloat16" if cuda else "float32",
            channels_last=cuda, on_bad_file=a.on_bad_file,
            last_batch="drop",  # full batches only: an epoch counts fewer images than the set
            debug_indices=a.log_batches is not None)
        loader = create_loader(a.backend, cfg)
    except (ValueError, TypeError, ImportError) as e:  # the library's message, e.g.
        name = str(e).split("=")[0]  # "batch_size=0 must be ..." -> "--batch-size: batch_size=0"
        return fail(f"{FLAGS[name]}: {e}" if name in FLAGS else e)
    device = cfg.resolved().torch_device
    try:
        model = build_model(a.model or ("resnet50" if cuda else "tinycnn"),
                            max(2, len(loader.classes)))
    except ValueError as e:
        loader.close()
        return fail(e)
    opt = None
    if model is not None:
        model = model.to(device)
        if cuda:
            model = model.to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=1e-4)
    net = model
    if ddp and model is not None:
        net = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    loss_fn = nn.CrossEntropyLoss()

    # every rank keeps its own loader state (DALI's random state differs per rank)
    ck_path = a.checkpoint and (a.checkpoint if rank == 0 else f"{a.checkpoint}.rank{rank}")
    start, resumed = 0, False
    if a.resume and os.path.exists(ck_path):
        try:
            restore(ck_path, device, loader, model, opt)
        except ValueError as e:
            loader.close()
            return fail(f"--resume --checkpoint {ck_path}: {e}")
        start, resumed = loader.epoch, True
        at = loader.state_dict()["batches"]
        say(f"resumed from {ck_path} at epoch {start}, batch {at}", flush=True)
    log = open(a.log_batches, "a") if a.log_batches else None
    if log is not None and resumed:  # where it resumed (tools.resume_test reads it)
        log.write(f"# resumed {start} {at}\n")
        log.flush()

    def save() -> None:
        state = {"loader": loader.state_dict(),
                 "model": model.state_dict() if model is not None else None,
                 "optimizer": opt.state_dict() if opt is not None else None}
        tmp = f"{ck_path}.{os.getpid()}.tmp"
        torch.save(state, tmp)
        os.replace(tmp, ck_path)  # a kill mid-write leaves the last checkpoint whole

    steps = 0
    with loader:
        for epoch in range(start, a.epochs):
            loader.set_epoch(epoch)  # keeps a resumed position within this epoch
            t0 = time.perf_counter()
            total, n, seen = torch.zeros((), device=device), 0, 0
            try:
                for images, labels in loader:
                    if net is not None:
                        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                            loss = loss_fn(net(images if cuda else images.float()), labels)
                        opt.zero_grad(set_to_none=True)
                        loss.backward()
                        opt.step()
                        total += loss.detach().float()  # stays on the device: no sync per step
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
                return fail(f"epoch {epoch}: {e}", 1)
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if ddp:  # the job's images
                t = torch.tensor([seen], device=device)
                dist.all_reduce(t)
                seen = int(t.item())
            if not seen and resumed and epoch == start:  # saved at this epoch's very end
                continue
            if not seen:  # e.g. every file of the epoch skipped as bad
                bad = len(getattr(getattr(loader, "stats", None), "epoch_bad", ()))
                why = f" ({bad} bad files skipped)" if bad else ""
                return fail(f"epoch {epoch} yielded no image{why}: no loss to report; check "
                            f"--data {a.data}", 1)
            if a.checkpoint:
                save()
            mean = f"{(total / n).item():.4f}" if n else "-"
            ranks = f", {world} ranks" if ddp else ""
            say(f"epoch {epoch}: loss {mean}{' (rank 0)' if ddp else ''}  {seen} images in "
                f"{dt:.1f}s ({seen / dt:.0f} img/s, backend={a.backend}{ranks})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
