"""``python -m tools.stream_memory --data DIR``: resident memory over one epoch of remote shards.

Serves the tar shards of ``DIR`` (a ``data_gen --format wds`` folder) from ``python -m
http.server`` on 127.0.0.1, in a process of its own, and reads one epoch of them, loader-only,
with each backend; every ``--every`` batches it sums the RSS of this process and its children
(the DataLoader workers; not the server) with psutil. Per backend: the RSS at the first sample,
its maximum, at the end, and the least-squares slope in MiB per GB of shards read, from the
second sample on. Issue 44: the RSS must stay flat, bounded by the spool, not grow with the
shards read (pipelines/sources/spool.py, NOTE [spool])."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def tree_rss_mib(skip: set[int]) -> float:
    """RSS of this process and its children, the pids in ``skip`` left out, in MiB."""
    import psutil

    me = psutil.Process()
    total = 0
    for p in [me, *me.children(recursive=True)]:
        if p.pid in skip:
            continue
        try:
            total += p.memory_info().rss
        except psutil.Error:  # a worker that just exited
            pass
    return total / 2**20


def slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ``ys`` against ``xs`` (0 for fewer than two points)."""
    if len(xs) < 2:
        return 0.0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0


def serve(folder: Path) -> tuple[subprocess.Popen, str]:
    """``python -m http.server`` on a free loopback port, serving ``folder``; ready."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                            "127.0.0.1", "--directory", str(folder)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):  # bounded: 10 s
        try:
            urllib.request.urlopen(url + "/", timeout=1).close()  # noqa: S310 - loopback
            return srv, url
        except OSError:
            time.sleep(0.1)
    srv.kill()
    raise RuntimeError(f"the loopback server on port {port} did not start")


def run(backend: str, root: str, a, skip: set[int], shard_bytes: int) -> dict:
    from pipelines import AugmentSpec, LoaderConfig, create_loader

    cfg = LoaderConfig(root=root, batch_size=a.batch_size, device="cpu", num_workers=a.workers,
                       augment=AugmentSpec(size=a.size), seed=0, shuffle_window=a.shuffle_window)
    curve: list[tuple[int, float, float]] = []  # (batch, GB read, RSS MiB)
    t = time.perf_counter()
    with create_loader(backend, cfg) as ld:
        per_sample, n = shard_bytes / len(ld.paths), 0
        for b, (_, y) in enumerate(ld, 1):
            n += len(y)
            if b % a.every == 0 or b == len(ld):
                curve.append((b, n * per_sample / 1e9, tree_rss_mib(skip)))
    seconds = time.perf_counter() - t
    gb, rss = [c[1] for c in curve[1:]], [c[2] for c in curve[1:]]
    return {"backend": backend, "samples": n, "batches": len(ld), "seconds": round(seconds, 1),
            "rss_start_mib": round(curve[0][2], 1), "rss_max_mib": round(max(c[2] for c in curve), 1),
            "rss_end_mib": round(curve[-1][2], 1),
            "slope_mib_per_gb": round(slope(gb, rss), 1),
            "curve": [[b, round(g, 3), round(r, 1)] for b, g, r in curve]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.stream_memory", description=__doc__)
    p.add_argument("--data", required=True, help="a folder of tar shards (data_gen --format wds)")
    p.add_argument("--backends", default="pinned,pageable")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--size", type=int, default=64, help="output side (AugmentSpec(size=...))")
    p.add_argument("--every", type=int, default=2, help="sample the RSS every N batches")
    p.add_argument("--shuffle-window", type=int, default=96,
                   help="LoaderConfig.shuffle_window: a few shards, so the epoch streams")
    p.add_argument("--out", help="also write the report to this file")
    a = p.parse_args(argv)
    folder = Path(a.data)
    shards = sorted(f.name for f in folder.glob("shard-*.tar"))
    if not shards:
        p.error(f"--data {a.data!r}: no shard-*.tar files")
    total = sum((folder / s).stat().st_size for s in shards)
    manifest = json.loads((folder / "manifest.json").read_text()) if (
        folder / "manifest.json").is_file() else {}
    first, last = shards[0][6:-4], shards[-1][6:-4]
    lines = [f"# python -m tools.stream_memory {shlex.join(sys.argv[1:] if argv is None else argv)}",
             f"# data: {len(shards)} shards, {total / 1e9:.2f} GB"
             + (f", data_gen args {json.dumps(manifest['args'], sort_keys=True)}"
                if "args" in manifest else ""),
             "# served by python -m http.server on 127.0.0.1 (its own process, not counted); "
             "RSS = this process + its children (psutil), MiB; slope from the 2nd sample on"]
    with tempfile.TemporaryDirectory(prefix="stream-memory-cache-") as cache:
        os.environ["GPU_FEED_LISTING_CACHE"] = cache  # a fresh index: nothing of the user's
        srv, url = serve(folder)
        try:
            root = f"{url}/shard-{{{first}..{last}}}.tar"
            for backend in a.backends.split(","):
                r = run(backend, root, a, {srv.pid}, total)
                lines.append(json.dumps({k: v for k, v in r.items() if k != "curve"}))
                lines.append(json.dumps({"backend": backend,
                                         "curve [batch, GB read, RSS MiB]": r["curve"]}))
                print(lines[-2], flush=True)
        finally:
            srv.terminate()
            srv.wait(10)
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
