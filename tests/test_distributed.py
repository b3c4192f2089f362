"""Several processes under torchrun (gloo): shards, equal steps, placement and seeds.

Each check launches ``tests/dist_worker.py`` under ``python -m torch.distributed.run`` and
compares what the ranks recorded (see the worker's docstring). On the CPU this runs in CI; the
``cuda`` tests run the same worker on two GPUs.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("dist_worker.py")
REPO = WORKER.parent.parent
N = 37  # files in tiny_root
BATCH = 4


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def _cmd(launch, args):
    return [sys.executable, "-m", "torch.distributed.run", *launch, str(WORKER), *args]


def _check(procs, out: Path, ranks: int):
    for p in procs:
        try:
            p.wait(timeout=600)
        except subprocess.TimeoutExpired:
            p.kill()
    logs = "\n".join(p.stdout.read()[-3000:] for p in procs)
    assert all(p.returncode == 0 for p in procs), logs
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def torchrun(nproc: int, root, same, out: Path, device: str = "cpu", backends=None,
             shards=None):
    """``nproc`` ranks on one node; returns each rank's record."""
    args = ["--root", str(root), "--same", str(same), "--out", str(out), "--device", device]
    if backends:
        args += ["--backends", backends]
    if shards:
        args += ["--shards", str(shards)]
    launch = ["--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1",
              "--master_port", str(_port())]
    p = subprocess.Popen(_cmd(launch, args), env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, cwd=REPO)
    return _check([p], out, nproc)


def two_nodes(root, same, out: Path, device: str = "cpu"):
    """Two simulated nodes of one process each on this host: RANK differs, LOCAL_RANK is 0."""
    port = _port()
    args = ["--root", str(root), "--same", str(same), "--out", str(out), "--device", device]
    procs = [subprocess.Popen(
        _cmd(["--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(k),
              "--master_addr", "127.0.0.1", "--master_port", str(port)], args),
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
        for k in (0, 1)]
    return _check(procs, out, 2)


@pytest.fixture(scope="module")
def same_root(tmp_path_factory, tiny_root):
    """12 copies of one JPEG in 2 classes: ranks read different files with equal pixels."""
    root = tmp_path_factory.mktemp("same")
    src = sorted(tiny_root.glob("class_0000/*.jpg"))[0]
    for k in range(12):
        d = root / f"c{k % 2}"
        d.mkdir(exist_ok=True)
        shutil.copy(src, d / f"{k:02d}.jpg")
    return root


@pytest.fixture(scope="module")
def shard_root(wds):
    """``tiny_root``'s images as 5 tar shards (conftest)."""
    return wds


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def ranks(request, tiny_root, same_root, shard_root, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"dist{request.param}")
    return torchrun(request.param, tiny_root, same_root, out, shards=shard_root)


def _union(recs, backend, policy, epoch):
    return [i for r in recs
            for i in r["backends"][backend]["runs"][policy]["epochs"][epoch]["indices"]]


def _backends(recs):
    return list(recs[0]["backends"])


def test_every_sample_once_across_ranks_under_each_policy(ranks):
    w = len(ranks)
    for b in _backends(ranks):
        for e in (0, 1):
            part = _union(ranks, b, "partial", e)
            assert sorted(part) == list(range(N)), (b, e)
            for pol in ("None", "pad"):
                got = _union(ranks, b, pol, e)
                steps = ranks[0]["backends"][b]["runs"][pol]["len"]
                assert set(got) == set(range(N)) and len(got) == w * steps * BATCH, (b, pol)
                extra = Counter(got) - Counter(range(N))
                assert sum(extra.values()) == len(got) - N  # only the padding repeats
            drop = _union(ranks, b, "drop", e)
            steps = ranks[0]["backends"][b]["runs"]["drop"]["len"]
            assert len(drop) == len(set(drop)) == w * steps * BATCH, (b, e)
        assert _union(ranks, b, "None", 0) != _union(ranks, b, "None", 1)  # reshuffled


def test_every_rank_has_the_same_len_and_yields_it_by_default(ranks):
    for b in _backends(ranks):
        runs = [r["backends"][b]["runs"]["None"] for r in ranks]
        assert {r["policy"] for r in runs} == {"pad"}
        assert len({r["len"] for r in runs}) == 1
        for r in runs:
            assert [e["batches"] for e in r["epochs"]] == [r["len"]] * 2
            assert r["placement"] == "torch.distributed"
        for pol in ("pad", "drop"):
            assert len({r["backends"][b]["runs"][pol]["len"] for r in ranks}) == 1


def test_explicit_partial_warns_of_the_hang_exactly_when_steps_differ(ranks):
    for b in _backends(ranks):
        runs = [r["backends"][b]["runs"]["partial"] for r in ranks]
        unequal = len({r["len"] for r in runs}) > 1
        assert unequal == (len(ranks) == 3)  # 37 files, batch 4: 4/3/3 batches, 5/5 on 2
        for r in runs:
            assert bool(r["warnings"]) == unequal
            assert all("wait forever in all-reduce" in m for m in r["warnings"])


def test_a_loader_built_before_init_process_group_shards_from_torchrun_env(ranks):
    for b in _backends(ranks):
        pre = [r["backends"][b]["pre_env"] for r in ranks]
        assert {p["placement"] for p in pre} == {"environment"}
        assert len({p["len"] for p in pre}) == 1
        got = [i for p in pre for i in p["indices"]]
        assert set(got) == set(range(N)) and len(got) == len(ranks) * pre[0]["len"] * BATCH


def test_a_single_process_loader_iterated_in_a_job_raises_one_clear_error(ranks):
    for b in _backends(ranks):
        for r in ranks:
            msg = r["backends"][b]["pre_single_error"]
            assert msg and "built as rank 0 of 1" in msg, (b, msg)
            assert f"rank {r['rank']} of {len(ranks)}" in msg and "init_process_group" in msg


def test_augmentation_differs_across_ranks(ranks):
    for b in _backends(ranks):
        prints = [r["backends"][b]["aug"] for r in ranks]
        assert len(set(prints)) == len(ranks), (b, prints)


def test_each_rank_resumes_exactly_from_rank0s_state(ranks):
    for b in _backends(ranks):
        for r in ranks:
            res = r["backends"][b]["resume"]
            assert res["exact"] and res["batches"] == res["len"] - 2, (b, r["rank"], res)
            assert res["boundary"] and res["past_end"], (b, r["rank"], res)


def test_rank0_lists_and_the_others_receive_its_listing(ranks):
    w = len(ranks)
    keys = [k for k in ranks[0]["shared"] if "/" in k]
    assert any(k.startswith("shards/") for k in keys) and any(k.startswith("folder/") for k in keys)
    for k in keys:  # ranks > 0 could not list: they built their loaders from rank 0's listing
        recs = [r["shared"][k] for r in ranks]
        assert all(r["n"] == N for r in recs), k
        assert len({r["len"] for r in recs}) == 1, k
        got = [i for r in recs for i in r["indices"]]
        assert set(got) == set(range(N)) and len(got) == w * recs[0]["len"] * BATCH, k
    errors = {r["shared"]["error"] for r in ranks}  # rank 0's error, raised on every rank
    assert len(errors) == 1 and "no-such-folder" in errors.pop()


def test_two_simulated_nodes_shard_and_place_correctly(tiny_root, same_root, tmp_path):
    recs = two_nodes(tiny_root, same_root, tmp_path)
    assert [r["rank"] for r in recs] == [0, 1] and {r["local_rank"] for r in recs} == {0}
    for b in _backends(recs):
        for e in (0, 1):
            assert sorted(_union(recs, b, "partial", e)) == list(range(N))
        assert len({r["backends"][b]["runs"]["None"]["len"] for r in recs}) == 1
        assert len({r["backends"][b]["aug"] for r in recs}) == 2
        assert {r["backends"][b]["runs"]["None"]["device"] for r in recs} == {"cpu"}


def _two_gpus():
    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


@pytest.mark.cuda
@pytest.mark.skipif(not _two_gpus(), reason="needs 2 GPUs")
def test_two_gpus_each_rank_on_its_local_gpu(tiny_root, same_root, tmp_path):
    recs = torchrun(2, tiny_root, same_root, tmp_path, device="cuda")
    for b in _backends(recs):
        for r in recs:
            run = r["backends"][b]["runs"]["None"]
            want = f"cuda:{r['local_rank']}"
            assert run["device"] == want
            assert {d for e in run["epochs"] for d in e["devices"]} == {want}, (b, run)
        assert sorted(_union(recs, b, "partial", 0)) == list(range(N))
        assert len({r["backends"][b]["aug"] for r in recs}) == 2


@pytest.mark.cuda
def test_two_simulated_nodes_on_gpu_use_cuda_local_rank(tiny_root, same_root, tmp_path):
    recs = two_nodes(tiny_root, same_root, tmp_path, device="cuda")
    for b in _backends(recs):
        for r in recs:
            run = r["backends"][b]["runs"]["None"]
            assert run["device"] == "cuda:0"
            assert {d for e in run["epochs"] for d in e["devices"]} == {"cuda:0"}
        assert sorted(_union(recs, b, "partial", 0)) == list(range(N))
        assert len({r["backends"][b]["aug"] for r in recs}) == 2
