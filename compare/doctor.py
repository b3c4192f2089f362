"""``python -m compare doctor``: check this machine against a loader setup and advise.

Checks /dev/shm, workers against CPU cores, pinned memory, CUDA, DALI and the hardware JPEG
decoder. ``[FAIL]``: a setting no loader accepts; ``[WARN]``: advice; ``[OK]``/``[INFO]``: facts.

Exit status:
  0  nothing failed ([WARN] lines do not count, unless --strict)
  1  a failure: a [FAIL] line, or a malformed LOCAL_WORLD_SIZE; with --strict, any [WARN] too
  2  a usage error from the parser (an unknown option, a value that is not an int)
"""
from __future__ import annotations

import sys

from . import cli
from .env import nvidia_driver

Line = tuple[str, str, str]  # (status, topic, message)


def _mib(b: float) -> str:
    return f"{b / 2**20:,.0f} MiB"


def invalid(batch_size: int, workers: int, prefetch: int, image_size: int) -> list[Line]:
    """A ``FAIL`` line per setting that no loader accepts, in ``LoaderConfig``'s own words."""
    from pipelines import TorchOptions

    out: list[Line] = []
    for topic, kw in (("batch size", {"batch_size": batch_size}),
                      ("workers", {"num_workers": workers})):
        try:
            cli.loader_config(root=".", device="cpu", **kw)
        except ValueError as e:
            out.append(("FAIL", topic, str(e)))
    try:
        TorchOptions(prefetch_factor=prefetch)
    except ValueError as e:
        out.append(("FAIL", "prefetch", str(cli.option_error(e))))
    try:
        cli.augment(size=image_size)
    except ValueError as e:
        out.append(("FAIL", "image size", str(e)))
    return out


def check(batch_size: int, workers: int, prefetch: int, image_size: int,
          shm_free: int | None, cores: int, cuda: dict, dali: str | None,
          local_ranks: int = 1) -> list[Line]:
    """The report's lines, a pure function of the facts (``invalid`` settings: only those).
    ``local_ranks`` share the cores, /dev/shm and pinned memory."""
    from pipelines import TorchOptions
    from pipelines.torch_backend.shm import HEADROOM as SHM_HEADROOM
    from pipelines.torch_backend.shm import fit_to_shm, shm_need

    bad = invalid(batch_size, workers, prefetch, image_size)
    if bad:
        return bad
    out: list[Line] = []
    px = 3 * image_size ** 2
    f32, u8 = batch_size * px * 4, batch_size * px
    lr = max(1, local_ranks)
    mine = max(1, cores // lr)  # this rank's share of the cores
    if lr > 1:
        out.append(("INFO", "torchrun", f"{lr} ranks on this host share {cores} cores, "
                    f"/dev/shm and pinned memory: each gets {mine} cores and "
                    f"{_mib(shm_free / lr) if shm_free is not None else 'its share of /dev/shm'}"
                    "; the figures below are per rank"))
        shm_free = None if shm_free is None else shm_free // lr
    if workers > mine:
        per = f" (this rank's share of {cores})" if lr > 1 else ""
        out.append(("WARN", "workers", f"num_workers={workers} but {mine} CPU cores{per}: "
                    f"workers fight each other and the main process; use <= {max(1, mine - 2)}"))
    else:
        per = f" per rank ({cores} shared by {lr} ranks)" if lr > 1 else ""
        out.append(("OK", "workers", f"num_workers={workers} on {mine} CPU cores{per}"))
    if shm_free is None:
        out.append(("INFO", "/dev/shm", "no /dev/shm here (not Linux): nothing to check"))
    else:
        for name, bb in (("pageable (float32)", f32), ("pinned (uint8)", u8)):
            need = shm_need(workers, prefetch, bb)
            if need <= SHM_HEADROOM * shm_free:
                out.append(("OK", "/dev/shm", f"{name}: needs ~{_mib(need)} of {_mib(shm_free)} free"))
            else:
                w, p, _ = fit_to_shm(workers, prefetch, bb, shm_free)
                out.append(("WARN", "/dev/shm",
                            f"{name}: needs ~{_mib(need)} but only {_mib(shm_free)} free; the "
                            f"loader will fall back to num_workers={w}, prefetch={p}. Enlarge it "
                            "(docker run --shm-size=8g) to keep all workers"))
    depth = TorchOptions().queue_depth
    pinned = (depth + workers * prefetch + 1) * u8
    host = f"; {lr} ranks: ~{_mib(lr * pinned)} on this host" if lr > 1 else ""
    out.append(("INFO", "pinned memory", f"the pinned backend holds up to ~{_mib(pinned)} of "
                f"page-locked host memory ({workers} workers x prefetch {prefetch} uint8 batches "
                f"+ the device queue of {depth}){host}"))
    if not cuda.get("available"):
        out.append(("WARN", "CUDA", "no CUDA device: pinned runs as a plain CPU loader and DALI "
                    "uses its CPU operators; GPU numbers need a GPU"))
    else:
        out.append(("OK", "CUDA", f"{cuda['name']} (sm_{cuda['cc'][0]}{cuda['cc'][1]}), driver "
                    f"{cuda.get('driver') or '?'}, torch CUDA {cuda.get('runtime')}"))
        from pipelines.device import HW_JPEG_DECODERS

        hw = HW_JPEG_DECODERS.get(tuple(cuda["cc"]))
        if hw:
            out.append(("OK", "JPEG hardware decoder", f"yes ({hw} class). DALI's default share is 0 "
                        "(0.5 on large photos); hw_decoder_load=None tunes it and the pipelines "
                        "on your loop (the suite's summary prints the tuner's choice)"))
        else:
            out.append(("INFO", "JPEG hardware decoder", "none on this GPU: DALI decodes with "
                        "nvJPEG's CUDA path (hw_decoder_load has no effect)"))
    if dali:
        out.append(("OK", "DALI", f"nvidia-dali {dali}"))
    else:
        out.append(("WARN", "DALI", "not installed: pip install 'gpu-feed[dali]' (CUDA 12 "
                    "drivers) or 'gpu-feed[dali-cu13]' (CUDA 13)"))
    return out


def facts() -> tuple[int, dict, str | None]:
    import torch

    from pipelines.config import usable_cores

    cores = usable_cores()
    cuda = {"available": torch.cuda.is_available()}
    if cuda["available"]:
        p = torch.cuda.get_device_properties(0)
        cuda.update(name=p.name, cc=(p.major, p.minor), runtime=torch.version.cuda)
        cuda["driver"] = nvidia_driver()
    dali = None
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("nvidia-dali-cuda120", "nvidia-dali-cuda130"):
        try:
            dali = f"{version(dist)} ({dist})"
            break
        except PackageNotFoundError:
            continue
    return cores or 1, cuda, dali


def main(argv=None) -> int:
    """Print the report; the exit status is in the module docstring."""
    p = cli.Parser(prog="python -m compare doctor", description=__doc__)
    p.add_argument("--batch-size", type=int, default=None,
                   help="samples per batch (default: python -m compare's, 256 with CUDA, 32 without)")
    p.add_argument("--workers", type=int, default=None, help="default: cores - 2 (all on 2 or fewer)")
    p.add_argument("--prefetch", type=int, default=2,
                   help="DataLoader batches per worker (TorchOptions.prefetch_factor)")
    p.add_argument("--image-size", type=int, default=224, help="output side in pixels")
    p.add_argument("--local-ranks", type=int, default=None,
                   help="ranks per host, as torchrun's --nproc_per_node (default: "
                        "LOCAL_WORLD_SIZE when run under torchrun, else 1)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 on any [WARN] line too, not only on a [FAIL]")
    a = p.parse_args(argv)
    try:
        cli.check_dist_env()  # RANK and WORLD_SIZE come as a pair
    except ValueError as e:
        return cli.fail("python -m compare doctor", e)
    cores, cuda, dali = facts()
    from pipelines.config import default_workers
    from pipelines.placement import local_world_size
    from pipelines.torch_backend.shm import shm_free_bytes

    try:
        lr = max(a.local_ranks or 0, 0) or local_world_size()
    except ValueError as e:  # a malformed LOCAL_WORLD_SIZE
        return cli.fail("python -m compare doctor", e, code=1)
    workers = a.workers if a.workers is not None else default_workers(cores, lr)
    if a.batch_size is None:  # the suite's own default on this machine (compare.args.AUTO)
        from .args import AUTO

        a.batch_size = AUTO["batch_size"][0 if cuda["available"] else 1]
    lines = check(a.batch_size, workers, a.prefetch, a.image_size, shm_free_bytes(), cores, cuda,
                  dali, local_ranks=lr)
    ranks = f", {lr} ranks on this host" if lr > 1 else ""
    print(f"gpu-feed doctor: batch {a.batch_size}, {a.image_size}px, workers {workers} per rank, "
          f"prefetch {a.prefetch}{ranks}")
    for status, topic, msg in lines:
        print(f"[{status:4s}] {topic:22s} {msg}")
    statuses = {s for s, _, _ in lines}
    return 1 if "FAIL" in statuses or (a.strict and "WARN" in statuses) else 0


if __name__ == "__main__":
    sys.exit(main())
