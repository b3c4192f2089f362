"""``python -m compare.dali_reader_cost --data DIR``: why the DALI backend uses an external source.

DALI's own file reader can follow our per-epoch permutation only if it is rebuilt with the
epoch's file list (its ``random_shuffle`` is a bounded buffer, not a permutation). This measures,
with the same graph, threads and ``hw_decoder_load``:

* the time from "new epoch" to the first batch: a rebuilt reader vs the external source (which
  follows the plan with no rebuild);
* the steady loader-only rate over ``--steps`` batches of an epoch: DALI's C++ reader vs our
  Python external source (file reads in a thread pool, header checks, ``no_copy`` feed). If the
  source capped the rate, the reader would be faster here.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch


def _sync(gpu: bool) -> None:
    if gpu:
        torch.cuda.synchronize()


def _timed(it, steps: int, gpu: bool):
    """(seconds to the first batch, images/s over the next ``steps`` batches)."""
    t = time.perf_counter()
    next(it)
    _sync(gpu)
    first = time.perf_counter() - t
    n, t = 0, time.perf_counter()
    for _ in range(steps):
        out = next(it)
        n += len(out[0]["y"] if isinstance(out, list) else out[1])
    _sync(gpu)
    return first, n / (time.perf_counter() - t)


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
    p.add_argument("--threads", type=int, default=2, help="DALI num_threads for both")
    p.add_argument("--steps", type=int, default=4, help="timed batches per epoch after the first")
    p.add_argument("--hw", type=float, default=0.0, help="hw_decoder_load for both")
    p.add_argument("--mmap", action="store_true", help="both read files by mapping them")
    a = p.parse_args(argv)
    gpu = torch.cuda.is_available()
    cfg = LoaderConfig(root=a.data, batch_size=a.batch_size, device="cuda" if gpu else "cpu",
                       num_workers=a.threads, augment=AugmentSpec(size=224), last_batch="drop",
                       dali_hw_decoder_load=a.hw, dali_use_mmap=a.mmap)
    paths, labels, _ = list_samples(a.data)
    if a.steps + 1 > len(paths) // a.batch_size:
        p.error(f"--steps {a.steps} needs more than {a.steps + 1} batches per epoch; "
                f"the data has {len(paths) // a.batch_size}")

    def reader_epoch(epoch: int):
        order = [int(i) for b in epoch_batches(len(paths), batch_size=a.batch_size, seed=0,
                                                 epoch=epoch, shuffle=True, policy=cfg.last_batch)
                 for i in b]
        t = time.perf_counter()

        @pipeline_def(batch_size=a.batch_size, num_threads=a.threads,
                      device_id=0 if gpu else None, prefetch_queue_depth=cfg.prefetch)
        def g():
            jpegs, lab = fn.readers.file(files=[paths[i] for i in order],
                                         labels=[int(labels[i]) for i in order],
                                         random_shuffle=False, name="r",
                                         dont_use_mmap=not cfg.dali_use_mmap)
            return augment(jpegs, spec_ops(cfg.augment), cfg, gpu), lab

        it = DALIGenericIterator(g(), ["x", "y"], reader_name="r")
        build = time.perf_counter() - t
        first, rate = _timed(it, a.steps, gpu)
        del it
        return build + first, rate

    def source_epochs():
        out = []
        with create_loader("dali", cfg) as ld:
            for e in range(a.epochs + 1):
                ld.set_epoch(e)
                it = iter(ld)
                out.append(_timed(it, a.steps, gpu))
                for _ in it:
                    pass
        return out[1:]  # the first epoch includes the one-off build

    reader = [reader_epoch(e) for e in range(a.epochs)]
    source = source_epochs()
    med = lambda xs: statistics.median(xs)  # noqa: E731
    res = {
        "first_batch_s": {"reader_rebuild": med([r[0] for r in reader]),
                          "external_source": med([s[0] for s in source])},
        "loader_only_img_per_s": {"reader": med([r[1] for r in reader]),
                                  "external_source": med([s[1] for s in source])},
        "all": {"reader": reader, "external_source": source},
        "batch_size": a.batch_size, "threads": a.threads, "steps": a.steps, "hw": a.hw,
        "mmap": a.mmap, "device": cfg.device, "images": len(paths),
    }
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
