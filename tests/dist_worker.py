"""One rank of the multi-process checks (``tests/test_distributed.py``), run under torchrun.

    torchrun --nproc_per_node N tests/dist_worker.py --root R --same S --out DIR --device cpu

Each rank writes ``DIR/rank{RANK}.json`` with what it saw; the test compares the ranks. The
process group is ``gloo`` on purpose, and ``torch.cuda.set_device`` is never called: a loader
must find ``cuda:LOCAL_RANK`` by itself.

Recorded, per backend:

* ``pre_env``: a loader built *before* ``init_process_group`` (from torchrun's environment),
  iterated after it: its len and indices;
* ``pre_single_error``: the error of a loader built before ``init_process_group`` with
  torchrun's ``RANK``/``WORLD_SIZE`` hidden (it resolves to one process), iterated after it;
* ``runs[policy]``: len, batches yielded and indices of epochs 0 and 1, and the batch device,
  for ``last_batch`` in (default, partial, pad, drop);
* ``aug``: a fingerprint of the first batch of a dataset of identical images (``--same``):
  ranks read different copies, so equal fingerprints mean equal random crops and flips;
* ``resume``: whether a loader restored from rank 0's state saved after 2 batches of epoch 1
  yielded exactly (indices and pixels) the rest of an uninterrupted epoch 1 on this rank; and
  whether epoch 1 was exact after only ``set_epoch(1)``, and after a ``next()`` past the end
  of epoch 0.

And once (``shared``), with ``pipelines.loader.open_source`` made to fail on every rank but 0
(``pipelines.distributed`` NOTE [listing once]): for the folder and, with ``--shards``, for tar
shards (every backend), the listing size, len and epoch-0 indices of a loader built after
``init_process_group``; and the error every rank gets when rank 0 cannot list the root.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from pipelines import AugmentSpec, LoaderConfig, available_backends, create_loader

POLICIES = (None, "partial", "pad", "drop")


def cfg(root, device, **kw) -> LoaderConfig:
    base = dict(root=root, batch_size=4, device=device, num_workers=0, debug_indices=True,
                augment=AugmentSpec(size=32), seed=5)
    base.update(kw)
    return LoaderConfig(**base)


def epoch(loader, e: int):
    loader.set_epoch(e)
    n, devs, idx = 0, set(), []
    for x, _ in loader:
        n += 1
        devs.add(str(x.device))
    idx = loader.last_indices.tolist() if loader.last_indices is not None else []
    return {"batches": n, "indices": idx, "devices": sorted(devs)}


def fingerprint(loader) -> str:
    x, _ = next(iter(loader))
    return hashlib.sha1(x.float().cpu().numpy().tobytes()).hexdigest()


def resumed_exactly(backend: str, c: LoaderConfig) -> dict:
    """Resume epoch 1 from rank 0's state (every rank loads it, as Lightning and Accelerate
    do), from ``set_epoch(1)`` alone on a fresh loader, and after a ``next()`` past the end of
    epoch 0; each against this rank's uninterrupted run."""
    with create_loader(backend, c) as ref:
        ref.set_epoch(0)
        list(ref)
        ref.set_epoch(1)
        want = [(x.cpu().clone(), y.cpu().clone()) for x, y in ref]

    def same(got, ref):
        return len(got) == len(ref) and all(torch.equal(xa, xb) and torch.equal(ya, yb)
                                            for (xa, ya), (xb, yb) in zip(ref, got))

    with create_loader(backend, c) as ld:
        ld.set_epoch(0)
        list(ld)
        ld.set_epoch(1)
        it = iter(ld)
        for _ in range(2):
            next(it)
        state = [json.loads(json.dumps(ld.state_dict()))]
        it.close()
    if dist.is_initialized():
        dist.broadcast_object_list(state, src=0)  # rank 0's state, on every rank
    with create_loader(backend, c) as ld:
        ld.load_state_dict(state[0])
        got = [(x.cpu().clone(), y.cpu().clone()) for x, y in ld]
    with create_loader(backend, c) as ld:
        ld.set_epoch(1)
        boundary = same([(x.cpu().clone(), y.cpu().clone()) for x, y in ld], want)
    with create_loader(backend, c) as ld:
        ld.set_epoch(0)
        it = iter(ld)
        list(it)
        next(it, None)  # past the end
        ld.set_epoch(1)
        past = same([(x.cpu().clone(), y.cpu().clone()) for x, y in ld], want)
    return {"exact": same(got, want[2:]), "batches": len(got), "len": len(want),
            "boundary": boundary, "past_end": past}


def shared_listing(a, backs, rank: int) -> dict:
    import pipelines.loader as pl

    real = pl.open_source

    def refuse(*_a, **_k):
        raise AssertionError(f"rank {rank} listed the dataset itself")

    if rank != 0:
        pl.open_source = refuse
    try:
        rec = {}
        roots = [("folder", a.root)] + ([("shards", a.shards)] if a.shards else [])
        for name, root in roots:
            for b in backs:
                with create_loader(b, cfg(root, a.device)) as ld:
                    rec[f"{name}/{b}"] = {"n": len(ld.paths), "len": len(ld), **epoch(ld, 0)}
        try:
            create_loader(backs[0], cfg(os.path.join(a.root, "no-such-folder"), a.device))
            rec["error"] = None
        except ValueError as e:
            rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        pl.open_source = real
    return rec


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--same", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--backends", default=None)
    p.add_argument("--shards", default=None)
    a = p.parse_args()
    backs = a.backends.split(",") if a.backends else [b.value for b in available_backends()]
    rank = int(os.environ["RANK"])
    out = {"rank": rank, "local_rank": int(os.environ["LOCAL_RANK"]),
           "world": int(os.environ["WORLD_SIZE"]), "backends": {}}

    # before init_process_group: one from the environment, one with RANK/WORLD_SIZE hidden
    pre, single = {}, {}
    for b in backs:
        pre[b] = create_loader(b, cfg(a.root, a.device))
        hidden = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE")}
        try:
            single[b] = create_loader(b, cfg(a.root, a.device))
        finally:
            os.environ.update(hidden)
    dist.init_process_group("gloo")
    for b in backs:
        rec = out["backends"][b] = {"runs": {}}
        with pre[b] as ld:
            rec["pre_env"] = {"len": len(ld), "placement": ld.placement.source,
                              **epoch(ld, 0)}
        with single[b] as ld:
            try:
                epoch(ld, 0)
                rec["pre_single_error"] = None
            except RuntimeError as e:
                rec["pre_single_error"] = str(e)
        for pol in POLICIES:
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                ld = create_loader(b, cfg(a.root, a.device, last_batch=pol))
            with ld:
                rec["runs"][str(pol)] = {
                    "len": len(ld), "device": ld.config.device,
                    "policy": ld.config.last_batch.value, "placement": ld.placement.source,
                    "warnings": [str(x.message) for x in w if "DDP" in str(x.message)],
                    "epochs": [epoch(ld, e) for e in (0, 1)],
                }
        with create_loader(b, cfg(a.same, a.device, shuffle=False)) as ld:
            rec["aug"] = fingerprint(ld)
        rec["resume"] = resumed_exactly(b, cfg(a.root, a.device))
    out["shared"] = shared_listing(a, backs, rank)
    Path(a.out, f"rank{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
