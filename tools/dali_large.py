"""``python -m tools.dali_large --data DIR --configs JSON``: ``dali`` loader-only images/s per
set of ``DaliOptions`` (issue 45: large photos). Each config is a JSON object of ``DaliOptions``
fields, plus optional ``"workers"`` and ``"decoder"`` (extra keywords for DALI's decoder, such
as ``hybrid_huffman_threshold``). Each runs 1 + ``--epochs`` epochs in one loader; the first is
dropped, and the line gives the median and every timed epoch's rate, the process's CPU seconds
per second over the timed epochs (``cpu_per_s``: DALI's threads run in this process) and the
wall-clock span of those epochs (``span``, Unix seconds, to match a GPU monitor's log). One JSON
line per config.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import torch

import pipelines.dali.graph as graph
from pipelines import LoaderConfig, create_loader
from pipelines.options import DaliOptions


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.dali_large", description=__doc__)
    p.add_argument("--data", required=True)
    p.add_argument("--configs", default="[{}]", help="a JSON list of objects (module doc)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--device", default="cuda")
    a = p.parse_args(argv)
    base = graph.decoder_kwargs
    try:
        for c in json.loads(a.configs):
            c = dict(c)
            extra, workers = c.pop("decoder", {}), c.pop("workers", a.workers)
            graph.decoder_kwargs = lambda o, g, _e=extra: {**base(o, g), **_e} if base(o, g) else {}
            cfg = LoaderConfig(root=a.data, batch_size=a.batch_size, device=a.device,
                               num_workers=workers)
            rates, cpu, span = [], 0.0, []
            with create_loader("dali", cfg, options=DaliOptions(**c)) as ld:
                for epoch in range(1 + a.epochs):
                    if cfg.device.startswith("cuda"):
                        torch.cuda.synchronize()
                    if epoch == 1:
                        span, cpu = [time.time()], _cpu_s()
                    t, n = time.perf_counter(), 0
                    for x, _ in ld:
                        n += x.shape[0]
                    if cfg.device.startswith("cuda"):
                        torch.cuda.synchronize()
                    if epoch:
                        rates.append(n / (time.perf_counter() - t))
                span.append(time.time())
                cpu = (_cpu_s() - cpu) / (span[1] - span[0]) if len(span) == 2 else 0.0
                lanes = ld.options.pipelines
            print(json.dumps({"options": c, "decoder": extra, "workers": workers, "pipelines": lanes,
                              "median": round(statistics.median(rates), 1),
                              "rates": [round(r, 1) for r in rates], "cpu_per_s": round(cpu, 2),
                              "span": [round(x, 3) for x in span]}), flush=True)
    finally:
        graph.decoder_kwargs = base  # restored also when a config fails
    return 0


def _cpu_s() -> float:
    """This process's CPU seconds so far, every thread's, user and system."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


if __name__ == "__main__":
    raise SystemExit(main())
