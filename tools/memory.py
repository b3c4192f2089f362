"""``python -m tools.memory``: host and GPU memory of each backend over many epochs.

Per epoch: host RSS (this process and its workers), torch's allocated and reserved CUDA memory,
and NVML's device memory in use (DALI's pools too). ``memory.json`` is rewritten after each
backend, so a late failure keeps the finished ones.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import TYPE_CHECKING

from compare import cli, owned

if TYPE_CHECKING:
    from pipelines import LoaderConfig


def host_rss_mib() -> float:
    """RSS of this process and its children (DataLoader workers), in MiB."""
    pids = [os.getpid()]
    try:
        pids += [int(p) for p in open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read().split()]
    except OSError:
        pass
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
    return total / 2**20


def nvml_used_mib() -> float | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        import torch

        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return pynvml.nvmlDeviceGetMemoryInfo(h).used / 2**20
    except Exception:
        return None


def track(backend: str, cfg: LoaderConfig, epochs: int) -> list[dict]:
    import torch

    from pipelines import create_loader

    rows = []
    cuda = torch.cuda.is_available() and cfg.wants_cuda
    from compare.progress import bar

    with create_loader(backend, cfg) as loader:
        for e in range(epochs):
            loader.set_epoch(e)
            t = time.perf_counter()
            n = 0
            progress = bar(len(loader), f"{backend} epoch {e}", "batch")
            for _, y in loader:
                n += len(y)
                progress.update(1)
            progress.close()
            if cuda:
                torch.cuda.synchronize()
            row = {"epoch": e, "images": n, "seconds": round(time.perf_counter() - t, 3),
                   "host_rss_mib": round(host_rss_mib(), 1)}
            if cuda:
                row.update(torch_allocated_mib=round(torch.cuda.memory_allocated() / 2**20, 1),
                           torch_reserved_mib=round(torch.cuda.memory_reserved() / 2**20, 1),
                           nvml_used_mib=nvml_used_mib())
            rows.append(row)
            print(json.dumps({"backend": backend, **row}), flush=True)
    return rows


def summarize(rows: list[dict]) -> dict:
    """From the second epoch on: first, last, min, max and the least-squares slope in MiB per
    epoch (a leak is a steady positive slope)."""
    out = {}
    for k in ("host_rss_mib", "torch_reserved_mib", "nvml_used_mib"):
        pts = [(r["epoch"], r[k]) for r in rows[1:] if r.get(k) is not None]
        if not pts:
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in pts) / var if var else 0.0
        out[k] = {"epoch1": ys[0], "last": ys[-1], "min": min(ys), "max": max(ys),
                  "growth": round(ys[-1] - ys[0], 1), "slope_per_epoch": round(slope, 3)}
    return out


PROG = "python -m tools.memory"


def main(argv=None) -> int:
    p = cli.Parser(prog=PROG, description=__doc__)
    p.add_argument("--data", required=True, help="ImageFolder root")
    p.add_argument("--backends", default="dali", help="comma list of dali,pinned,pageable")
    p.add_argument("--epochs", type=int, default=20, help="epochs per backend")
    p.add_argument("--batch-size", type=int, default=256, help="samples per batch")
    p.add_argument("--workers", type=int, default=None, help="default: CPU cores - 2")
    p.add_argument("--out", required=True, help="output directory for memory.json")
    a = p.parse_args(argv)
    try:
        cli.check_dist_env()  # RANK and WORLD_SIZE come as a pair, before any work
    except ValueError as e:
        return cli.fail(PROG, e)
    import torch  # after parsing: --help and usage errors return at once

    from pipelines import AugmentSpec

    cuda = torch.cuda.is_available()
    try:  # every argument, before the first epoch (compare.cli)
        backends = cli.parse_backends(a.backends, note=cli.note(PROG))
        cli.at_least("--epochs", a.epochs, 1)
        cfg = cli.loader_config(root=a.data, batch_size=a.batch_size,
                                augment=AugmentSpec(size=224), num_workers=a.workers,
                                device="cuda" if cuda else "cpu",
                                dtype="bfloat16" if cuda else "float32", channels_last=cuda)
        paths, _ = cli.list_dataset(a.data)
        cli.check_batches(len(paths), cfg)
        cli.outside_data(a.out, a.data, "--out")
        out = cli.writable_dir(a.out, "--out") / "memory.json"
    except (ValueError, TypeError) as e:
        return cli.fail(PROG, e)
    result = {}
    for b in backends:
        try:
            rows = track(b.value, cfg, a.epochs)
        except Exception as e:  # noqa: BLE001 - one line; the traceback goes to error.log
            log = owned.write_error_log(out.parent, traceback.format_exc())  # never another's
            kept = f"{out} holds {', '.join(result)}" if result else "nothing was written"
            return cli.fail(PROG, f"backend {b.value} failed: {type(e).__name__}: {e}; {kept}; "
                            f"traceback in {log}", 1)
        result[b.value] = {"epochs": rows, "summary": summarize(rows)}
        out.write_text(json.dumps(result, indent=1))  # after each backend: a late error loses none
    for b, r in result.items():
        print(b, json.dumps(r["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
