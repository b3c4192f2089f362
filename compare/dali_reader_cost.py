"""``python -m compare.dali_reader_cost --data DIR``: why the DALI backend uses an external source.

DALI's own file reader can follow our per-epoch permutation only if it is rebuilt with the
epoch's file list (its ``random_shuffle`` is a bounded buffer, not a permutation). This measures
what that costs per epoch, against the external source that follows the plan with no rebuild:
the time from "new epoch" to the first batch, for both, with the same graph.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch


def main(argv=None) -> int:
    from nvidia.dali import fn, pipeline_def
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    from pipelines import AugmentSpec, LoaderConfig, create_loader
    from pipelines.dali.graph import augment
    from pipelines.indexing import epoch_batches, list_samples
    from pipelines.migrate import spec_ops

    p = argparse.ArgumentParser(prog="python -m compare.dali_reader_cost", description=__doc__)
    p.add_argument("--data", required=True)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    gpu = torch.cuda.is_available()
    cfg = LoaderConfig(root=a.data, batch_size=a.batch_size, device="cuda" if gpu else "cpu",
                       num_workers=a.threads, augment=AugmentSpec(size=224))
    paths, labels, _ = list_samples(a.data)

    def reader_first_batch(epoch: int) -> float:
        order = [int(i) for b in epoch_batches(len(paths), batch_size=a.batch_size, seed=0,
                                                 epoch=epoch, shuffle=True, policy=cfg.last_batch)
                 for i in b]
        t = time.perf_counter()

        @pipeline_def(batch_size=a.batch_size, num_threads=a.threads,
                      device_id=0 if gpu else None, prefetch_queue_depth=2)
        def g():
            jpegs, lab = fn.readers.file(files=[paths[i] for i in order],
                                         labels=[int(labels[i]) for i in order],
                                         random_shuffle=False, name="r")
            return augment(jpegs, spec_ops(cfg.augment), cfg, gpu), lab

        it = DALIGenericIterator(g(), ["x", "y"], reader_name="r")
        next(it)
        if gpu:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t
        del it
        return dt

    def source_first_batches() -> list:
        out = []
        with create_loader("dali", cfg) as ld:
            for e in range(a.epochs + 1):
                ld.set_epoch(e)
                t = time.perf_counter()
                it = iter(ld)
                next(it)
                if gpu:
                    torch.cuda.synchronize()
                out.append(time.perf_counter() - t)
                for _ in it:
                    pass
        return out[1:]  # the first epoch includes the one-off build

    rebuild = [reader_first_batch(e) for e in range(a.epochs)]
    source = source_first_batches()
    res = {"reader_rebuild_s": {"median": statistics.median(rebuild), "all": rebuild},
           "external_source_s": {"median": statistics.median(source), "all": source},
           "batch_size": a.batch_size, "device": cfg.device, "images": len(paths)}
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
