"""Issue 55, class 4: positions and masks stay exact when samples are skipped
(``pipelines.loader`` NOTE [positions]).

A state counts plan positions consumed, not batches handed out, so a resumed run after a dropped
all-bad batch joins the uninterrupted one exactly; ``Batch.valid`` is ``True`` once per good
sample (padded rows and rows that stand in for a bad file are ``False``), also after a dropped
batch; on every backend, and on DALI with two pipelines (lanes), whose batches must still come
in the plan's order.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from data_gen.generate import GenConfig, generate
from pipelines import AugmentSpec, LoaderConfig
from tests.utils import make

CASES = [("dali", {}), ("dali", {"pipelines": 2}), ("pinned", {}), ("pageable", {})]
IDS = ["dali", "dali-2-lanes", "pinned", "pageable"]


def _cfg(root, **kw):
    base = dict(root=root, batch_size=3, device="cpu", num_workers=0, debug_indices=True,
                augment=AugmentSpec(size=8), seed=7, rank=0, world_size=2, last_batch="pad",
                on_bad_file="skip")
    base.update(kw)
    return LoaderConfig(**base)


def _open(backend, cfg, options):
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
        cfg = cfg.replace(num_workers=2)
    return make(backend, cfg, **options)


@pytest.fixture(scope="module")
def bad_root(tmp_path_factory):
    """17 images; in epoch 0 of rank 0 (batch 3, pad over 2 ranks: 3 batches) batch 0 is
    wholly bad, batch 1 has one bad file, and so has the padded last batch."""
    root = tmp_path_factory.mktemp("positions")
    generate(GenConfig(out=str(root), num_images=17, classes=2, seed=3, width_range=(24, 40),
                       workers=1), progress=False)
    with make("pageable", _cfg(root)) as ld:
        plan, paths = ld.plan(0), list(ld.paths)
    assert len(plan) == 3
    bad = set(plan[0].tolist()) | {int(plan[1][1]), int(plan[2][0])}
    for i in bad:
        with open(paths[i], "wb") as f:
            f.write(b"not an image" * 8)
    return root, plan, bad


def _run(loader):
    """``(indices, valid, position after)`` of each batch of the next epoch."""
    out = []
    for b in loader:
        out.append((b.indices.tolist(), b.valid.tolist(), loader.position[1]))
    return out


@pytest.mark.parametrize("backend,options", CASES, ids=IDS)
def test_positions_and_valid_masks_stay_exact_across_dropped_batches(backend, options, bad_root):
    root, plan, bad = bad_root
    with _open(backend, _cfg(root), options) as ld:
        _, valid = ld._plan_valid(0)
        got = _run(ld)
        # batch 0 was dropped: the first batch handed over is plan position 1
        assert [p for *_, p in got] == [2, 3], backend
        assert ld.state_dict()["batches"] == len(ld) == 3
        for (idx, ok, after) in got:
            want, pad = plan[after - 1].tolist(), valid[after - 1].tolist()
            for row, (i, v) in enumerate(zip(idx, ok)):
                stand_in = want[row] in bad
                assert i not in bad and (i == want[row]) != stand_in, (backend, idx, want)
                assert v == (pad[row] and not stand_in), (backend, after, idx, ok)
        # the valid rows are every good sample of this rank's share once
        share = {int(i) for b, v in zip(plan, valid) for i, ok in zip(b, v) if ok} - bad
        rows = [i for idx, ok, _ in got for i, v in zip(idx, ok) if v]
        assert sorted(rows) == sorted(share), backend
        assert ld.stats["dropped_batches"] == 1


@pytest.mark.parametrize("backend,options", CASES, ids=IDS)
def test_a_resumed_run_after_a_dropped_batch_joins_the_uninterrupted_one(backend, options,
                                                                        bad_root):
    root = bad_root[0]
    with _open(backend, _cfg(root), options) as ld:
        ref, states = [], [ld.state_dict()]
        for b in ld:
            ref.append((b.images.clone(), b.indices.tolist(), b.valid.tolist()))
            states.append(ld.state_dict())
        assert [s["batches"] for s in states] == [0, 2, 3], backend
        for k, state in enumerate(states):
            ld.load_state_dict(state)
            rest = [(b.images.clone(), b.indices.tolist(), b.valid.tolist()) for b in ld]
            assert [r[1:] for r in rest] == [r[1:] for r in ref[k:]], (backend, k)
            assert all(torch.equal(a[0], b[0]) for a, b in zip(rest, ref[k:])), (backend, k)


def test_the_valid_mask_follows_the_plan_not_the_batch_count():
    from pipelines.loader import _valid_rows

    planned = ([np.array([4, 5, 6]), np.array([7, 8, 4])],
               [np.array([True, True, True]), np.array([True, True, False])])
    assert _valid_rows(planned, 0, [4, 5, 6]) is None
    assert _valid_rows(planned, 0, [4, 6, 6]).tolist() == [True, False, True]
    assert _valid_rows(planned, 1, [7, 8, 4]).tolist() == [True, True, False]


def test_a_trailing_dropped_batch_counts_after_the_batches_a_prefetcher_holds(tmp_path,
                                                                              monkeypatch):
    """``pinned`` on a GPU prefetches: it drains the CPU batches ahead of the consumer. The
    epoch's trailing wholly-bad batch is a position consumed after every batch before it is
    handed over, not when the prefetcher reaches the end (it was counted first, and the next
    batch then stood at the wrong plan position)."""
    from pipelines.torch_backend.pinned import PinnedLoader

    generate(GenConfig(out=str(tmp_path), num_images=9, classes=2, seed=3, width_range=(24, 40),
                       workers=1), progress=False)
    cfg = _cfg(tmp_path, world_size=1, last_batch="partial")
    with make("pageable", cfg) as ld:
        plan, paths = ld.plan(0), list(ld.paths)
    assert [len(b) for b in plan] == [3, 3, 3]
    for i in plan[-1].tolist():  # the last batch is wholly bad
        with open(paths[i], "wb") as f:
            f.write(b"not an image" * 8)
    drained = PinnedLoader._batches

    def ahead(self, cpu_batches):  # as the CUDA prefetcher: read every CPU batch first
        yield from drained(self, iter(list(cpu_batches)))

    monkeypatch.setattr(PinnedLoader, "_batches", ahead)
    with make("pinned", cfg) as ld:
        got = _run(ld)
        assert [g[0] for g in got] == [plan[0].tolist(), plan[1].tolist()]
        assert [g[2] for g in got] == [1, 2]  # positions as each batch is handed over
        assert ld.position == (0, 3) and ld.stats["bad_files"] == 3
