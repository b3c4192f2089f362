"""``python -m tools.microbench {decode,validate,feed,...} --data DIR``: the small measurements
behind design choices quoted in the README and docstrings (single thread, median of repeats).

* ``decode``: decode + RandomResizedCrop(224) + flip per image (``--mode eval``: decode +
  Resize(256) + CenterCrop(224)): PIL (``ImageFolder``'s decode), ``torchvision.io``, and the
  scaled decode (``TorchOptions.decoder="scaled"``); and ``eighth``, each file decoded at 1/8
  scale in the scaled decode's library and nothing else. The scaled decode reads the whole
  file, and the entropy-coded data costs the same at every scale, so no crop decoded that way
  runs faster than ``eighth``: ``bound_over_torchvision`` (torchvision's time over it) is the
  most the scaled decode can gain over torchvision's decoder per image on this host.
* ``baseline``: what ``pageable`` adds to the plain recipe's per-sample work: one ``pageable``
  dataset item (as its workers run it: read, check, seed, PIL decode, the recipe) against
  ``torchvision.datasets.ImageFolder``'s item with the same transforms, on the same files and
  with the same crops (the plain recipe seeded per sample with ``pageable``'s seeds, which it
  also pays for). ``same_output`` counts the samples whose two outputs are equal, checked
  before timing (a photo with an EXIF rotation differs: ``pageable`` turns it upright, as
  every backend does, and ``ImageFolder`` does not); ``seed_us`` and ``check_us`` time two
  of the additions alone.
* ``validate``: ``pipelines.sources.validate.check_image_bytes`` per file.
* ``feed``: DALI external-source feed cost per batch of JPEGs: labels as per-sample arrays vs
  one dense array, and copied vs ``no_copy`` buffers; ``serve_ms_per_batch``: the consumer
  thread's time in ``PlanSource``'s lane call per batch (``pipelines.dali.source`` NOTE
  [feeding cost]).
* ``listing``: ``pipelines.sources.root.list_dataset`` on a folder of ``--files`` empty ``.jpg`` files in
  ``--classes`` folders, made in a temp dir: the first listing (a walk, then cached) and the
  next (from the listing cache, ``pipelines.sources.cache``). One run each, not a median.
* ``shard-read``: reading every sample's image bytes of the tar shards ``--data`` once, one
  process, no decoding: ``webdataset.WebDataset`` streaming the shards in order, against our
  index reader (``pipelines.sources.shards``: one ``os.pread`` per sample) in shard order and in a
  loader's epoch-0 plan order; samples/s, median of ``--repeats``. Needs ``pip install
  webdataset`` for its row.
* ``cpu-scaling``: the host's decode capacity against the cores used: for each count P of
  ``--processes``, P processes, each bound to one of the first P usable cores, decode +
  RandomResizedCrop + flip the first ``--images`` files in a loop for ``--seconds``; total
  img/s, per process, and the per-process rate against the smallest P's. ``--decoder``:
  ``torchvision`` (``torchvision.io``, as a ``pinned`` worker decodes small photos), ``scaled``
  (``pinned``'s scaled decode, its choice for large photos) or ``eighth`` (each file at 1/8
  scale and nothing else: the most any DCT-scaled decode of the whole file gets from the host).
  Per-process rates that fall as P grows mean the cores are not independent (SMT siblings on
  the host, shared caches or memory bandwidth), so half of the cores is more than half of the
  host.
* ``host-probe``: the host CPU probe (``tools.hostprobe.probe_ms``, one core
  decoding a fixed JPEG with PIL) on one core shared with each count of ``--busy`` processes
  that spin there: median and range of ``--repeats`` probes per count, and the median against
  the first count's. It shows that the probe follows the share of a core the host gives a
  process; no data needed.
* ``early-exit``: per backend of ``--backends``, the seconds from ``iter()`` of an epoch to its
  first batch (on the device), after the previous epoch ran to its end and after it was left at
  its first batch (``break``); median of ``--repeats`` pairs, and every trial.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from compare import cli
from pipelines import dali_available


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """The median seconds of each of ``fns``, timed in turn, ``repeats`` rounds, the order
    reversed every other round: on a noisy host a slow spell falls on all of them alike, where
    timing one's repeats after another's gives it to whichever ran then."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(repeats):
        for k in (names if r % 2 == 0 else names[::-1]):
            t = time.perf_counter()
            fns[k]()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def decode(paths, repeats, mode="train"):
    from PIL import Image, ImageOps
    from torchvision.transforms import v2

    from pipelines.torch_backend.dataset import decode_rgb

    torch.set_num_threads(1)
    rrc = ([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()]
           if mode == "train" else [v2.Resize(256, antialias=True), v2.CenterCrop(224)])
    on_pil = v2.Compose(rrc + [v2.PILToTensor()])
    on_tensor = v2.Compose(rrc)

    def pil():
        for p in paths:
            with Image.open(p) as im:
                on_pil(ImageOps.exif_transpose(im).convert("RGB"))

    def tv():
        for p in paths:
            with open(p, "rb") as f:
                on_tensor(decode_rgb(f.read()))

    from pipelines.torch_backend.decode import jpeg_library, reduced_decode, scaled_crop

    crop, flip = on_pil.transforms[0], v2.Compose(on_pil.transforms[1:])

    def scaled_in(library=None):  # Decoder.SCALED: the crop (or resize) from the header, a
        def run():  # DCT-scaled decode, in this machine's library or the one named
            for p in paths:
                with open(p, "rb") as f:
                    img = scaled_crop(f.read(), crop, library=library)
                flip(img)
        return run

    def seeded(fn):  # every decoder draws the same crops in every round
        return lambda: (torch.manual_seed(0), fn())

    lib = jpeg_library()

    def eighth():  # the whole file at 1/8 scale: the floor of any DCT-scaled decode of it
        for p in paths:
            with open(p, "rb") as f:
                reduced_decode(f.read(), 8, library=lib)

    n = len(paths)
    runs = {"pil": seeded(pil), "torchvision": seeded(tv), "scaled": seeded(scaled_in()),
            "eighth": eighth}
    if lib != "pil":
        runs["scaled_pil"] = seeded(scaled_in("pil"))
    med = _interleaved(runs, repeats)
    return {"scaled_library": lib, **{f"{k}_ms_per_img": 1e3 * v / n for k, v in med.items()},
            "bound_over_torchvision": round(med["torchvision"] / med["eighth"], 3)}


def baseline(root: str, images: int, repeats: int) -> dict:
    from torchvision import datasets

    from pipelines import LoaderConfig, create_loader
    from pipelines.epoch_plan import sample_seed
    from pipelines.sources.validate import check_image_bytes

    torch.set_num_threads(1)
    cfg = LoaderConfig(root=root, batch_size=1, num_workers=0, device="cpu")
    loader = create_loader("pageable", cfg)
    try:
        ds = loader.dataset
        ref = datasets.ImageFolder(root, transform=cfg.resolved().augment.to_torchvision(
            normalize=True))
        where = {str(path): j for j, (path, _) in enumerate(ref.samples)}
        idx = [i for i in range(len(ds.paths)) if str(ds.paths[i]) in where][:images]
        if not idx:
            raise ValueError(f"--data {root}: no file that ImageFolder lists too")
        seeds = [sample_seed(cfg.seed, 0, i) for i in idx]
        gen = torch.random.default_generator

        def plain_item(i, s):
            gen.manual_seed(s)
            return ref[where[str(ds.paths[i])]][0]

        def same_as_plain(i, s) -> bool:
            item = ds[(0, i)]  # a file pageable cannot load is a Bad, not an image
            return isinstance(item[0], torch.Tensor) and torch.equal(item[0], plain_item(i, s))

        same = sum(same_as_plain(i, s) for i, s in zip(idx, seeds))
        datas = []
        for i in idx:
            with open(ds.paths[i], "rb") as f:
                datas.append(f.read())

        def ours():
            for i in idx:
                ds[(0, i)]

        def plain():
            for i, s in zip(idx, seeds):
                plain_item(i, s)

        def seeding():
            for i in idx:
                gen.manual_seed(sample_seed(cfg.seed, 0, i))

        def check():
            for d in datas:
                check_image_bytes(d)

        med = _interleaved({"pageable": ours, "imagefolder": plain, "seed": seeding,
                            "check": check}, repeats)
    finally:
        loader.close()
    n = len(idx)
    return {"images": n, "same_output": same,
            "pageable_ms_per_img": 1e3 * med["pageable"] / n,
            "imagefolder_ms_per_img": 1e3 * med["imagefolder"] / n,
            "pageable_over_imagefolder": round(med["pageable"] / med["imagefolder"], 3),
            "seed_us": 1e6 * med["seed"] / n, "check_us": 1e6 * med["check"] / n}


def validate(paths, repeats):
    from pipelines.sources.validate import check_image_bytes

    blobs = [open(p, "rb").read() for p in paths]
    dt = _median(lambda: [check_image_bytes(b) for b in blobs], repeats)
    return {"us_per_file": 1e6 * dt / len(blobs)}


def feed(paths, repeats, batch=256, iters=60):
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.base_iterator import LastBatchPolicy
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    blobs = [np.fromfile(p, dtype=np.uint8) for p in (paths * batch)[:batch]]
    labels = np.arange(batch, dtype=np.int64)

    def one(mode):
        def src(info):
            if info.iteration >= iters:
                raise StopIteration
            if mode == "lists":
                return list(blobs), [labels[i:i + 1] for i in range(batch)], \
                    [labels[i:i + 1] for i in range(batch)]
            return list(blobs), np.stack([labels, labels], 1)

        @pipeline_def(batch_size=batch, num_threads=2, device_id=None, prefetch_queue_depth=2)
        def g():
            if mode == "lists":
                j, a, b = fn.external_source(source=src, num_outputs=3, batch=True, batch_info=True,
                                             dtype=[types.UINT8, types.INT64, types.INT64])
            else:
                j, m = fn.external_source(source=src, num_outputs=2, batch=True, batch_info=True,
                                          dtype=[types.UINT8, types.INT64],
                                          no_copy=mode == "dense_no_copy")
                a, b = m[0:1], m[1:2]
            return j.shape(), a, b

        def run():
            it = DALIGenericIterator(g(), ["s", "a", "b"], size=-1, prepare_first_batch=False,
                                     last_batch_policy=LastBatchPolicy.PARTIAL)
            for _ in it:
                pass

        return 1e3 * _median(run, repeats) / iters

    res = {f"{m}_ms_per_batch": one(m) for m in ("lists", "dense", "dense_no_copy")}
    res["serve_ms_per_batch"] = serve(paths, repeats, batch, iters)
    return res


def serve(paths, repeats, batch=256, iters=60, step_s=0.01):
    """The consumer thread's share of the feed: one ``PlanSource`` lane call (DALI's external
    source callback, run inside ``next()``) per batch of ``batch`` files, the read-ahead pool
    given ``step_s`` (a consumer's step) to finish first, after a first epoch (every file
    checked). Milliseconds per batch, median over the calls of ``repeats`` epochs."""
    from types import SimpleNamespace

    from pipelines.dali.source import PlanSource
    from pipelines.transforms.draws import DrawPlan, Step

    many = [paths[i % len(paths)] for i in range(batch * iters)]
    order = np.arange(len(many))
    src = PlanSource(many, np.arange(len(many), dtype=np.int64) % 1000,
                     lambda e: np.split(np.random.default_rng(e).permutation(order), iters),
                     readahead=3, threads=2, keep_alive=4)
    src.draw(DrawPlan((Step("window"), Step("coin"))), 0)  # a crop window and a flip
    lane, times = src.lane(0), []
    try:
        for e in range(repeats + 1):
            src.start_epoch(e)
            for i in range(iters):
                time.sleep(step_s)
                t0 = time.perf_counter()
                lane(SimpleNamespace(iteration=i))
                if e:  # the first epoch checks every file
                    times.append(time.perf_counter() - t0)
    finally:
        src.close()
    return 1e3 * statistics.median(times)


PROG = "python -m tools.microbench"


def listing(files: int, classes: int) -> dict:
    import os
    import tempfile

    from pipelines.sources.root import list_dataset

    with tempfile.TemporaryDirectory(prefix="gpu-feed-listing-") as tmp:
        root = os.path.join(tmp, "data")
        t0 = time.perf_counter()
        for c in range(classes):
            os.makedirs(os.path.join(root, f"c{c:05d}"))
        for i in range(files):
            open(os.path.join(root, f"c{i % classes:05d}", f"{i:08d}.jpg"), "wb").close()
        old = time.time() - 60  # a dataset nobody is writing (not "racy": pipelines.sources.cache)
        for d in [root] + [os.path.join(root, f"c{c:05d}") for c in range(classes)]:
            os.utime(d, (old, old))
        made = time.perf_counter() - t0
        os.environ["GPU_FEED_LISTING_CACHE"] = os.path.join(tmp, "cache")
        t0 = time.perf_counter()
        n1 = len(list_dataset(root)[0])
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        n2 = len(list_dataset(root)[0])
        cached = time.perf_counter() - t0
        assert n1 == n2 == files
        size = sum(f.stat().st_size for f in os.scandir(os.environ["GPU_FEED_LISTING_CACHE"]))
    return {"files": files, "classes": classes, "make_s": round(made, 1),
            "first_listing_s": round(first, 2), "cached_listing_s": round(cached, 2),
            "cache_mib": round(size / 2**20, 1)}


def shard_read(data: str, repeats: int) -> dict:
    from pipelines import LastBatchPolicy
    from pipelines.epoch_plan import epoch_batches
    from pipelines.sources.root import open_source

    src = open_source(data)
    n = len(src.names)
    plan = np.concatenate(epoch_batches(n, batch_size=256, seed=0, epoch=0, shuffle=True,
                                        policy=LastBatchPolicy.PARTIAL, groups=src.groups))

    def ours(order):
        def run():
            total = 0
            for i in order.tolist():
                total += len(src.read(i))
            return total
        return run

    rows = {"index, shard order": ours(np.arange(n)), "index, plan order": ours(plan)}
    try:
        import webdataset as wds

        from pipelines.sources.shards import shard_paths

        urls = shard_paths(data)

        def stream():
            total = 0
            for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
                total += sum(len(v) for k, v in sample.items() if isinstance(v, bytes))
            return total
        rows["webdataset, streamed"] = stream
    except ImportError:
        pass
    out = {"samples": n}
    for name, fn in rows.items():
        fn()  # warm the page cache and the index
        out[name] = round(n / _median(fn, repeats))
    return out


def _decode_for(cpu: int, paths, seconds: float, start, out, decoder: str = "torchvision") -> None:
    import os

    from torchvision.transforms import v2

    from pipelines.torch_backend.dataset import decode_rgb
    from pipelines.torch_backend.decode import reduced_decode, scaled_crop

    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    crop, flip = v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()
    one = {"torchvision": lambda b: flip(crop(decode_rgb(b))),
           "scaled": lambda b: flip(scaled_crop(b, crop) or crop(decode_rgb(b))),
           "eighth": lambda b: reduced_decode(b, 8)}[decoder]
    blobs = []
    for p in paths:
        with open(p, "rb") as f:
            blobs.append(f.read())
    start.wait()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        one(blobs[n % len(blobs)])
        n += 1
    out.put(n / (time.perf_counter() - t0))


def cpu_scaling(paths, processes, seconds: float, decoder: str = "torchvision") -> dict:
    import multiprocessing as mp
    import os

    cores = sorted(os.sched_getaffinity(0))
    too_many = [p for p in processes if p > len(cores)]
    if too_many:
        raise ValueError(f"--processes {too_many} exceed the {len(cores)} usable cores")
    ctx = mp.get_context("spawn")
    rows = []
    for count in processes:
        start, out = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_decode_for, args=(cores[i], paths, seconds, start, out, decoder))
                 for i in range(count)]
        for pr in procs:
            pr.start()
        time.sleep(2.0)  # every process has read its files
        start.set()
        rates = [out.get(timeout=seconds + 120) for _ in procs]
        for pr in procs:
            pr.join()
        rows.append({"processes": count, "img_per_s": round(sum(rates), 1),
                     "per_process": round(statistics.fmean(rates), 1),
                     "per_process_min_max": [round(min(rates), 1), round(max(rates), 1)]})
    base = rows[0]["per_process"]
    for r in rows:
        r["per_process_vs_first"] = round(r["per_process"] / base, 3)
    return {"decoder": decoder, "cores": cores, "rows": rows}


def _spin(stop, cpu: int) -> None:
    import os

    os.sched_setaffinity(0, {cpu})
    while not stop.is_set():
        for _ in range(10_000):
            pass


def host_probe(busy, repeats: int) -> dict:
    import multiprocessing as mp
    import os

    from tools.hostprobe import probe_ms

    ctx = mp.get_context("spawn")
    probe_ms()  # the probe's JPEG is made once, outside the timing
    mask = os.sched_getaffinity(0)
    cpu = min(mask)
    rows = []
    os.sched_setaffinity(0, {cpu})  # the probe and the spinners share one core
    try:
        for count in busy:
            stop = ctx.Event()
            procs = [ctx.Process(target=_spin, args=(stop, cpu), daemon=True)
                     for _ in range(count)]
            for pr in procs:
                pr.start()
            time.sleep(2.0 if count else 0.0)  # every spinner has started and spins
            try:
                ms = [probe_ms() for _ in range(repeats)]
            finally:
                stop.set()
                for pr in procs:
                    pr.join(timeout=30)
            rows.append({"busy_processes": count, "probe_ms": round(statistics.median(ms), 3),
                         "min_max": [round(min(ms), 3), round(max(ms), 3)]})
    finally:
        os.sched_setaffinity(0, mask)
    for r in rows:
        r["vs_first"] = round(r["probe_ms"] / rows[0]["probe_ms"], 3)
    return {"core": cpu, "rows": rows}


def early_exit(data: str, backends, batch_size: int, trials: int, device: str) -> dict:
    from pipelines import LoaderConfig, create_loader

    out = {}
    for b in backends:
        cfg = LoaderConfig(root=data, batch_size=batch_size, device=device)
        with create_loader(b, cfg) as ld:
            def first(epoch):
                ld.set_epoch(epoch)
                t0 = time.perf_counter()
                it = iter(ld)
                x, _ = next(it)
                if x.is_cuda:
                    torch.cuda.synchronize(x.device)
                return it, time.perf_counter() - t0

            it, cold = first(0)
            for _ in it:  # a whole first epoch: warm-up
                pass
            full, broken = [], []
            e = 0
            for _ in range(trials):
                it, dt = first(e := e + 1)  # after a whole epoch
                full.append(dt)
                it.close()                  # left at its first batch
                it, dt = first(e := e + 1)  # after the early exit
                broken.append(dt)
                for _ in it:                # to its end, so the next pair starts alike
                    pass
        out[b] = {"first_epoch_s": round(cold, 3),
                  "after_whole_epoch_s": round(statistics.median(full), 3),
                  "after_break_at_batch_1_s": round(statistics.median(broken), 3),
                  "trials_after_whole_epoch_s": [round(t, 3) for t in full],
                  "trials_after_break_s": [round(t, 3) for t in broken]}
    return out


def main(argv=None) -> int:
    p = cli.Parser(prog=PROG, description=__doc__,
                   formatter_class=cli.HelpFormatter)
    p.add_argument("what", choices=["decode", "baseline", "validate", "feed", "listing",
                                    "early-exit", "shard-read", "cpu-scaling", "host-probe"])
    p.add_argument("--data", help="an ImageFolder root")
    p.add_argument("--images", type=int, default=300)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--files", type=int, default=1_000_000, help="listing: files to make")
    p.add_argument("--classes", type=int, default=1000, help="listing: class folders")
    p.add_argument("--backends", default="dali", help="early-exit: backends, comma-separated")
    p.add_argument("--batch-size", type=int, default=256, help="early-exit: batch size")
    p.add_argument("--device", default="cuda", help="early-exit: device")
    p.add_argument("--processes", default="1,2", help="cpu-scaling: process counts, e.g. 8,16,32")
    p.add_argument("--busy", default="0,1,2,4",
                   help="host-probe: counts of spinning processes beside the probe")
    p.add_argument("--seconds", type=float, default=5.0, help="cpu-scaling: seconds per count")
    p.add_argument("--decoder", choices=["torchvision", "scaled", "eighth"], default="torchvision",
                   help="cpu-scaling: what each process runs per image (module doc)")
    p.add_argument("--mode", choices=["train", "eval"], default="train",
                   help="decode: RandomResizedCrop(224) + flip (train) or Resize(256) + "
                        "CenterCrop(224) (eval)")
    a = p.parse_args(argv)
    try:
        cli.check_dist_env()  # RANK and WORLD_SIZE come as a pair, before any work
    except ValueError as e:
        return cli.fail(PROG, e)
    if a.what == "cpu-scaling":
        try:
            procs = [int(x) for x in a.processes.split(",") if x.strip()]
            if not procs or min(procs) < 1:
                raise ValueError(f"--processes {a.processes!r} must be counts >= 1, e.g. 8,16,32")
            if not a.seconds > 0:
                raise ValueError(f"--seconds {a.seconds} must be > 0")
            if not a.data:
                raise ValueError("--data DIR is needed by cpu-scaling")
            paths = cli.list_dataset(a.data)[0][: a.images]
            res = cpu_scaling(paths, procs, a.seconds, a.decoder)
        except ValueError as e:
            return cli.fail(PROG, e)
        print(json.dumps({"what": "cpu-scaling", "images": len(paths), "seconds": a.seconds,
                          **res}, indent=1))
        return 0
    if a.what == "host-probe":
        try:
            busy = [int(x) for x in a.busy.split(",") if x.strip()]
            if not busy or min(busy) < 0:
                raise ValueError(f"--busy {a.busy!r} must be counts >= 0, e.g. 0,1,2,4")
            cli.at_least("--repeats", a.repeats, 1)
        except ValueError as e:
            return cli.fail(PROG, e)
        print(json.dumps({"what": "host-probe", "repeats": a.repeats,
                          **host_probe(busy, a.repeats)}, indent=1))
        return 0
    if a.what == "early-exit":
        try:
            cli.at_least("--repeats", a.repeats, 1)
            cli.at_least("--batch-size", a.batch_size, 1)
            if not a.data:
                raise ValueError("--data DIR is needed by early-exit")
            backs = [b for b in a.backends.split(",") if b]
            bad = [b for b in backs if b not in ("dali", "pinned", "pageable")]
            if bad or not backs:
                raise ValueError(f"--backends {a.backends!r}: choose among dali, pinned, pageable")
        except ValueError as e:
            return cli.fail(PROG, e)
        res = early_exit(a.data, backs, a.batch_size, a.repeats, a.device)
        print(json.dumps({"what": "early-exit", "data": a.data, "batch_size": a.batch_size,
                          "repeats": a.repeats, "backends": res}, indent=1))
        return 0
    if a.what == "shard-read":
        try:
            cli.at_least("--repeats", a.repeats, 1)
            if not a.data:
                raise ValueError("--data SHARDS is needed by shard-read")
            res = shard_read(a.data, a.repeats)
        except ValueError as e:
            return cli.fail(PROG, e)
        print(json.dumps({"what": "shard-read", "data": a.data, "repeats": a.repeats,
                          "samples_per_s": res}, indent=1))
        return 0
    if a.what == "listing":
        try:
            cli.at_least("--files", a.files, 1)
            cli.at_least("--classes", a.classes, 1)
        except ValueError as e:
            return cli.fail(PROG, e)
        print(json.dumps({"what": "listing", **listing(a.files, a.classes)}, indent=1))
        return 0
    try:  # every argument, before any measurement (compare.cli)
        cli.at_least("--images", a.images, 1)
        cli.at_least("--repeats", a.repeats, 1)
        if a.what == "feed" and not dali_available():
            raise ValueError("feed needs nvidia-dali: pip install 'gpu-feed[dali]'")
        if not a.data:
            raise ValueError(f"--data DIR is needed by {a.what}")
        paths = cli.list_dataset(a.data)[0][: a.images] if a.data else []
    except ValueError as e:
        return cli.fail(PROG, e)
    if a.what == "decode":
        res = decode(paths, a.repeats, a.mode)
    elif a.what == "baseline":
        try:
            res = baseline(a.data, a.images, a.repeats)
        except ValueError as e:
            return cli.fail(PROG, e)
    else:
        res = {"validate": validate, "feed": feed}[a.what](paths, a.repeats)
    print(json.dumps({"what": a.what, **({"mode": a.mode} if a.what == "decode" else {}),
                      **({"images": len(paths)} if paths else {}),
                      "repeats": a.repeats,
                      **{k: round(v, 3) if isinstance(v, float) else v
                         for k, v in res.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
