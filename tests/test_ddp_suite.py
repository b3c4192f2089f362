"""The suite, ``examples/train.py`` and ``compare scaling`` as a torchrun job (gloo on the CPU)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from compare import ddp, doctor, scaling
from compare.results import Repeat, SuiteResult, VariantResult

REPO = Path(__file__).resolve().parent.parent


def _torchrun(nproc: int, args, tmp: Path, timeout=600, target=("-m", "compare")):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", GPU_FEED_CACHE=str(tmp / "cache"))
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
         "--master_addr", "127.0.0.1", "--master_port", str(port), *target, *args],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _rep(x, ranks=()):
    return Repeat(x, 2 * x, 1.0, 2.0, 10.0, waits_ms=(1.0,), ranks=ranks)


def test_merge_sums_throughput_and_keeps_each_rank():
    a = VariantResult("v", "pinned", {}, 100.0, (_rep(10.0), _rep(12.0)))
    b = VariantResult("v", "pinned", {}, 300.0, (_rep(30.0), _rep(32.0)))
    m = ddp.merge([a, b])
    assert [r.samples_per_s for r in m.repeats] == [40.0, 44.0]
    assert [r.loader_only_per_s for r in m.repeats] == [80.0, 88.0]
    assert m.h2d_bytes_per_sample == 200.0 and m.world == 2
    assert m.rank_median(1, "samples_per_s") == 31.0 and m.rank_median(0, "idle_pct") == 10.0
    assert m.repeats[0].waits_ms == (1.0, 1.0)
    assert ddp.merge([a]) is a


def _suite(world, values, ceiling):
    reps = lambda xs: tuple(_rep(x) for x in xs)  # noqa: E731
    setup = {"world_size": world, "model": "resnet50", "batch_size": 256, "nodes": 1,
             "workers": 14, "data": "d", "dtype": "bfloat16", "augment": "a", "device": "cuda"}
    return SuiteResult({"gpu": "H200"}, setup, VariantResult("ceiling", "none", {}, 0.0,
                                                             reps(ceiling)),
                       tuple(VariantResult(k, k, {}, 1.0, reps(v)) for k, v in values.items()))


def test_scaling_efficiency_and_refusals(tmp_path, capsys):
    one = _suite(1, {"dali": [100, 102, 98]}, [110, 110, 110])
    many = _suite(2, {"dali": [196, 198, 194]}, [216, 220, 218])
    one.dump(tmp_path / "one.json")
    many.dump(tmp_path / "many.json")
    body = scaling.rows(one, many)
    assert body[1][:4] == ["dali", "100.0", "196.0", "98.0"]
    assert body[1][4].startswith("1.96x [1.90, 2.02]") and body[1][5].startswith("98.0 [")
    assert scaling.main([str(tmp_path / "one.json"), str(tmp_path / "many.json"),
                         "--out", str(tmp_path / "s.md")]) == 0
    assert "| dali | 100.0 | 196.0 | 98.0 |" in (tmp_path / "s.md").read_text()
    assert scaling.main([str(tmp_path / "many.json"), str(tmp_path / "one.json")]) == 2
    assert "MANY must have more" in capsys.readouterr().err
    other = _suite(2, {"dali": [1, 1, 1]}, [1, 1, 1])
    other.setup["model"] = "resnet18"
    other.dump(tmp_path / "other.json")
    assert scaling.main([str(tmp_path / "one.json"), str(tmp_path / "other.json")]) == 2
    assert "model: 'resnet50' -> 'resnet18'" in capsys.readouterr().err


def test_doctor_divides_the_host_among_local_ranks():
    lines = doctor.check(256, 14, 2, 224, 64 << 30, 32, {"available": False}, None,
                         local_ranks=2)
    text = "\n".join(f"[{s}] {t} {m}" for s, t, m in lines)
    assert "2 ranks on this host share 32 cores" in text and "each gets 16 cores" in text
    assert "num_workers=14 on 16 CPU cores per rank" in text
    assert "of 32,768 MiB free" in text  # the rank's half of /dev/shm
    lines = doctor.check(256, 20, 2, 224, 64 << 30, 32, {"available": False}, None,
                         local_ranks=2)
    assert any(s == "WARN" and "use <= 14" in m for s, t, m in lines if t == "workers")


def test_the_suite_under_torchrun_reports_once_from_rank_0(tiny_root, tmp_path):
    out = tmp_path / "out"
    r = _torchrun(2, ["--data", str(tiny_root), "--device", "cpu", "--model", "tinycnn",
                      "--backends", "pageable,dali", "--batch-size", "4", "--steps", "2",
                      "--warmup", "1", "--repeats", "2", "--workers", "1", "--out", str(out)],
                  tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("running 2 variants") == 1  # rank 0 alone prints
    assert "on each of 2 ranks (DDP)" in r.stdout and "per rank (medians" in r.stdout
    res = SuiteResult.load(out / "results.json")
    assert res.complete and res.setup["world_size"] == 2 and res.setup["nodes"] == 1
    for v in res.variants + (res.ceiling,):
        assert v.world == 2
        for rep in v.repeats:
            assert rep.samples_per_s == pytest.approx(
                sum(x["samples_per_s"] for x in rep.ranks))
    assert "**Per rank**" in (out / "summary.md").read_text()
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".json") == ["results.json"]
    json.loads((out / "results.json").read_text())


def test_pinned_ranks_settle_together_under_torchrun(tiny_root, tmp_path):
    """NOTE [settling] in compare.runner: ranks that settled for different numbers of DDP
    steps would hang in the step's all-reduce; the job agrees instead."""
    out = tmp_path / "out"
    r = _torchrun(2, ["--data", str(tiny_root), "--device", "cpu", "--model", "tinycnn",
                      "--backends", "pinned", "--batch-size", "4", "--steps", "2",
                      "--warmup", "1", "--repeats", "1", "--workers", "2", "--no-ceiling",
                      "--out", str(out)], tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (rep,) = SuiteResult.load(out / "results.json").variants[0].repeats
    assert isinstance(rep.settle_batches, int) and rep.settle_batches >= 6
    assert isinstance(rep.settled, bool)


def test_example_train_under_torchrun_prints_the_job_once(tiny_root, tmp_path):
    r = _torchrun(2, ["--backend", "pinned", "--data", str(tiny_root), "--batch-size", "4",
                      "--workers", "1", "--epochs", "2"], tmp_path,
                  target=[str(REPO / "examples" / "train.py")])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [x for x in r.stdout.splitlines() if x.startswith("epoch ")]
    # 37 files, 2 ranks, drop: 18 per rank -> 4 batches of 4 each -> 32 images per epoch
    assert len(lines) == 2 and all("32 images" in x and "2 ranks" in x for x in lines), lines
