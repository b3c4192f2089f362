"""Exploratory DALI loader-only probe: bare pipelines built outside the loader (not project code).

Usage, from the repository root on a GPU host:
    python docs/results/h200/dali-io-probe/probe.py DATA_DIR OUT.json [name,name,...]
Each variant is one graph (the project's ``augment``) fed by an external source of paths read by
``fn.io.file.read`` (``es``), of JPEG bytes held in RAM (``bytes``), or by DALI's file reader
(``reader``); ``project`` is the loader itself. Loader-only images/s over 3 x 40 batches after 10
warm-up, and the process's CPU use in cores.
"""
import json, os, statistics, sys, time
import numpy as np, torch
from nvidia.dali import fn, pipeline_def, types
from nvidia.dali.plugin.pytorch import DALIGenericIterator
from pipelines import LoaderConfig, create_loader
from pipelines.dali import graph as G
from pipelines.indexing import list_samples
from pipelines.migrate import spec_ops

root, out = sys.argv[1], sys.argv[2]
only = sys.argv[3].split(",") if len(sys.argv) > 3 else None
paths, labels, _ = list_samples(root)
enc = [np.frombuffer(p.encode(), np.uint8) for p in paths]
BS = 256
order = np.random.default_rng(0).permutation(len(paths))
NB = len(order) // BS
BYTES = None
if not only or any("bytes" in o for o in only):
    BYTES = [np.fromfile(p, dtype=np.uint8) for p in paths]


def cfg_of(v):
    return LoaderConfig(root=root, batch_size=BS, device="cuda", num_workers=v["threads"],
                        dtype="bfloat16", channels_last=True, last_batch="drop",
                        dali_hw_decoder_load=v["hw"], prefetch=v.get("prefetch", 2) if isinstance(v.get("prefetch", 2), int) else 2)


def make(v, shard, nshard):
    cfg = cfg_of(v)
    extra = {k2: v[k] for k, k2 in (("affine", "affine"), ("huff", "hybrid_huffman_threshold")) if k in v}
    orig = G.decoder_kwargs
    G.decoder_kwargs = lambda c, g: {**orig(c, g), **extra}

    feed = BYTES if v.get("bytes") else enc

    def src(info):
        b = (info.iteration * nshard + shard) % NB
        rows = order[b * BS:(b + 1) * BS]
        return [feed[i] for i in rows], np.stack([labels[rows], rows], 1).astype(np.int64)

    @pipeline_def(batch_size=BS, num_threads=v["threads"], device_id=0,
                  prefetch_queue_depth=v.get("prefetch", 2), seed=shard + 1, **v.get("pipe", {}))
    def g():
        if v.get("reader"):
            jpegs, meta = fn.readers.file(files=[paths[i] for i in order], dont_use_mmap=v.get("nommap", False),
                                          labels=[int(labels[i]) for i in order],
                                          random_shuffle=False, name="r", shard_id=shard,
                                          num_shards=nshard)
        else:
            p, meta = fn.external_source(source=src, num_outputs=2, batch=True, batch_info=True,
                                         dtype=[types.UINT8, types.INT64], ndim=[1, 1])
            if v.get("bytes"):
                jpegs = p
            else:
                jpegs = fn.io.file.read(p, dont_use_mmap=v.get("nommap", False))
        images = G.augment(jpegs, spec_ops(cfg.augment), cfg, True)
        return images, meta.gpu()
    try:
        return g()
    finally:
        G.decoder_kwargs = orig


def measure(nxt, per_step, warm=10, steps=40, reps=3):
    for _ in range(warm):
        nxt()
    rates, cpus = [], []
    for _ in range(reps):
        torch.cuda.synchronize(); t = time.perf_counter(); c = os.times()
        for _ in range(steps):
            nxt()
        torch.cuda.synchronize(); dt = time.perf_counter() - t; c2 = os.times()
        rates.append(steps * per_step / dt)
        cpus.append(((c2.user - c.user) + (c2.system - c.system)) / dt)
    return rates, cpus


def run_variant(v):
    n = v.get("npipes", 1)
    if v.get("project"):
        ld = create_loader("dali", cfg_of(v))
        state = {"it": iter(ld)}

        def nxt():
            try:
                return next(state["it"])
            except StopIteration:
                state["it"] = iter(ld); return next(state["it"])
        r = measure(nxt, BS)
        ld.close()
        return r
    pipes = [make(v, s, n) for s in range(n)]
    its = [DALIGenericIterator([p], ["x", "y"], size=-1, auto_reset=True,
                               reader_name="r" if v.get("reader") else None) for p in pipes]

    def nxt():
        outs = []
        for it in its:
            try:
                outs += next(it)
            except StopIteration:
                outs += next(it)
        for d in outs:
            x = d["x"].permute(0, 3, 1, 2).to(torch.bfloat16, memory_format=torch.preserve_format)
        return x
    r = measure(nxt, BS * n)
    return r


V = [
    dict(name="project t14 hw1", threads=14, hw=1.0, project=True),
    dict(name="es t14 hw1", threads=14, hw=1.0),
    dict(name="es t14 hw1 nommap", threads=14, hw=1.0, nommap=True),
    dict(name="es t8 hw1 nommap", threads=8, hw=1.0, nommap=True),
    dict(name="es t14 hw0.8 nommap", threads=14, hw=0.8, nommap=True),
    dict(name="bytes t14 hw1", threads=14, hw=1.0, bytes=True),
    dict(name="bytes t8 hw1", threads=8, hw=1.0, bytes=True),
    dict(name="reader t14 hw1", threads=14, hw=1.0, reader=True),
    dict(name="reader t14 hw1 nommap", threads=14, hw=1.0, reader=True, nommap=True),
    dict(name="es 2pipes t7 hw1 nommap", threads=7, hw=1.0, npipes=2, nommap=True),
    dict(name="es 2pipes t7 hw1", threads=7, hw=1.0, npipes=2),
    dict(name="es 2pipes t8 hw0.8 nommap", threads=8, hw=0.8, npipes=2, nommap=True),
    dict(name="bytes 2pipes t7 hw1", threads=7, hw=1.0, npipes=2, bytes=True),
    dict(name="reader 2pipes t7 hw1", threads=7, hw=1.0, npipes=2, reader=True),
]
res = {}
for v in V:
    if only and v["name"] not in only:
        continue
    t = time.perf_counter()
    try:
        rates, cpus = run_variant(v)
        res[v["name"]] = dict(median=statistics.median(rates), rates=rates, cpu_cores=statistics.median(cpus))
        print(f"{v['name']:28s} {statistics.median(rates):8.0f} img/s  [{min(rates):.0f}-{max(rates):.0f}]  cpu {statistics.median(cpus):.1f} cores  ({time.perf_counter()-t:.0f}s)", flush=True)
    except Exception as e:  # noqa
        res[v["name"]] = dict(error=repr(e)[:300])
        print(v["name"], "ERROR", repr(e)[:300], flush=True)
    json.dump(res, open(out, "w"), indent=1)
