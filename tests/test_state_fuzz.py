"""A state fuzzer (issue 40, class 3): mutated resume states on every backend.

Each backend's loader is built once (rank 0 of 2 on a small tar-shard set, so the shuffle
window and the rank are part of the plan) and every mutated state is loaded into it. Each call
ends in one of two ways and nothing else:

* a ``ValueError`` whose message names the mutated field; the loader is unchanged: its
  ``state_dict()`` is the one before, and (checked every ``CHECK_EVERY`` refusals and at the
  end) its next epoch yields exactly the batches an uninterrupted run yields from the pending
  position;
* an accepted state, after which the next epoch yields exactly what an uninterrupted run yields
  from the state's position: the same samples, labels and pixels, on every backend (a state is
  the position only: ``pipelines.transforms.draws`` NOTE [one plan]).

The mutations: every field dropped, or replaced by ``None``, strings, bytes, lists, dicts,
floats, NaN, bools, negative, huge and neighbouring ints; an unknown field; the whole state
replaced; and the states of loaders of other configs (seed, batch size, world size, shuffle
window, augmentation, rank, dataset, and the other backends).

Issue 55 adds dropped batches and skipped files: on a root with bad files, every state an
uninterrupted run takes over many epochs (``SKIP_CASES`` per backend) resumes into exactly the
batches that run yields after it (indices, ``valid`` masks, pixels), and each epoch's valid rows
are the rank's good samples once (``pipelines.loader`` NOTE [positions]).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from data_gen.generate import GenConfig, generate
from pipelines import AugmentSpec, LoaderConfig
from tests.utils import make, state_after

BACKENDS = ["dali", "pinned", "pageable"]
CHECK_EVERY = 10  # refusals between two checks that the next epoch is still exact
MISSING = object()
VALUES = [None, "x", "", b"\x00", [], [1], {}, {"a": 1}, 1.5, float("nan"), True, False, -1,
          2**64, 10**30, 0]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    shards = tmp_path_factory.mktemp("fuzz_shards")
    generate(GenConfig(out=str(shards), num_images=16, classes=2, seed=5, width_range=(24, 40),
                       layout="wds", shard_size=4, workers=1), progress=False)
    folder = tmp_path_factory.mktemp("fuzz_folder")
    generate(GenConfig(out=str(folder), num_images=16, classes=2, seed=5, width_range=(24, 40),
                       workers=1), progress=False)
    return shards, folder


def _cfg(root, **kw):
    base = dict(root=root, batch_size=3, device="cpu", num_workers=0, debug_indices=True,
                augment=AugmentSpec(size=8), seed=11, rank=0, world_size=2, shuffle_window=3)
    base.update(kw)
    return LoaderConfig(**base)


def _open(backend, cfg):
    return make(backend, cfg) if backend != "dali" else make(backend, cfg.replace(num_workers=1))


def _read(loader) -> list[tuple[torch.Tensor, torch.Tensor, list[int]]]:
    return [(x.clone(), y.clone(), loader.last_batch_indices.tolist()) for x, y in loader]


class Harness:
    """One backend's loader under test, its uninterrupted references, and the checks."""

    def __init__(self, backend: str, data):
        shards, folder = data
        self.backend = backend
        self.cfg = _cfg(shards)
        # the uninterrupted run: states taken on the way, batches kept
        self.ref = _open(backend, self.cfg)
        self.ref_batches: dict[int, list] = {}
        self.bases: list[dict[str, Any]] = []
        for epoch, k in ((0, 1), (1, 2)):
            self.ref.set_epoch(epoch)
            it, got = iter(self.ref), []
            for i, (x, y) in enumerate(it):
                got.append((x.clone(), y.clone(), self.ref.last_batch_indices.tolist()))
                if i + 1 == k:
                    self.bases.append(self.ref.state_dict())
            self.ref_batches[epoch] = got
        self.loader = _open(backend, self.cfg)
        self.others = self._other_states(shards, folder)

    def _other_states(self, shards, folder) -> list[tuple[str, dict[str, Any], tuple[str, ...]]]:
        """``(what, state, names a refusal may give)`` from loaders of other configs."""
        b = self.backend
        out = []
        for what, cfg, names in (
                ("seed", _cfg(shards, seed=12), ("seed",)),
                ("batch_size", _cfg(shards, batch_size=2), ("batch_size",)),
                ("world_size", _cfg(shards, world_size=3), ("world_size",)),
                ("one process", _cfg(shards, rank=None, world_size=1), ("world_size",)),
                ("shuffle_window", _cfg(shards, shuffle_window=5), ("shuffle_window",)),
                ("rank", _cfg(shards, rank=1), ("rank",)),
                ("dataset", _cfg(folder), ("dataset",)),
                ("shuffle", _cfg(shards, shuffle=False), ("shuffle",)),
                ("last_batch", _cfg(shards, last_batch="drop"), ("last_batch",))):
            with _open(b, cfg) as other:
                out.append((what, state_after(other, 1, 0), names))
        for other in BACKENDS:
            if other != b:
                with _open(other, self.cfg) as ld:
                    out.append((other, state_after(ld, 1, 0), ()))
        return out

    # -- the checks --------------------------------------------------------------------------
    def expected(self, epoch: int, start: int):
        """The batches an uninterrupted run yields from ``(epoch, start)``: indices and labels,
        and their pixels."""
        plan = self.loader.plan(epoch)[start:]
        labels = np.asarray(self.loader.labels)
        if epoch not in self.ref_batches:
            self.ref.set_epoch(epoch)
            self.ref_batches[epoch] = _read(self.ref)
        pixels = [x for x, _, _ in self.ref_batches[epoch][start:]]
        return [(p.tolist(), labels[p].tolist()) for p in plan], pixels

    def check_next_epoch(self) -> None:
        state = self.loader.state_dict()
        want, pixels = self.expected(state["epoch"], state["batches"])
        got = _read(self.loader)
        assert [(i, y.tolist()) for _, y, i in got] == want, self.backend
        if pixels is not None:
            assert len(pixels) == len(got)
            assert all(torch.equal(a, x) for a, (x, _, _) in zip(pixels, got)), self.backend

    def reset(self, base: dict[str, Any]) -> None:
        self.loader.load_state_dict(base)
        assert self.loader.state_dict() == base

    def close(self) -> None:
        self.loader.close()
        self.ref.close()


def _mutations(base: dict[str, Any], backend: str):
    """``(label, state or MISSING-free mutated state, names a refusal may give)``."""
    out = []

    def variants(value):
        vs = list(VALUES)
        if isinstance(value, int) and not isinstance(value, bool):
            vs += [value + 1, value - 1, np.int64(value), float(value), str(value)]
        elif isinstance(value, str):
            vs += [value[:-1], value.upper(), value.encode()]
        elif isinstance(value, bool):
            vs += [not value, int(value)]
        return vs

    for k, v in base.items():
        out.append((f"drop {k}", {kk: vv for kk, vv in base.items() if kk != k}, (k,)))
        for new in variants(v):
            out.append((f"{k}={new!r}", {**base, k: new}, (k,)))
    out.append(("unknown field", {**base, "dali_v2": 1}, ("dali_v2",)))
    for whole in (None, [], "state", 0, list(base.items()), {}):
        out.append((f"state={whole!r}"[:40], whole, ("state", "version")))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_mutated_state_is_refused_by_name_or_resumes_exactly(backend, data):
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    h = Harness(backend, data)
    try:
        cases = []
        for base in h.bases:
            cases += [(base, *m) for m in _mutations(base, backend)]
        cases += [(h.bases[0], f"swap {what}", st, names) for what, st, names in h.others]
        assert len(cases) >= 200, len(cases)
        base = None
        refused = accepted = 0
        for at, label, state, names in cases:
            if base is not at:
                h.reset(at)
                base = at
            before = h.loader.state_dict()
            try:
                h.loader.load_state_dict(state)
            except ValueError as e:
                msg = str(e)
                assert any(n in msg for n in names), (backend, label, msg)
                assert "\n" not in msg, (backend, label, msg)
                assert h.loader.state_dict() == before, (backend, label)
                refused += 1
                if refused % CHECK_EVERY == 0:
                    h.check_next_epoch()
                    h.reset(at)
                continue
            accepted += 1
            h.check_next_epoch()
            h.reset(at)
        h.check_next_epoch()  # the last refusal changed nothing either
        print(f"{backend}: {len(cases)} states, {refused} refused, {accepted} resumed")
        assert refused > 150 and accepted >= 1, (refused, accepted)
    finally:
        h.close()


def test_the_mutations_cover_the_promised_kinds():
    base = {"version": 1, "epoch": 0, "batches": 1, "seed": 3, "listing": "ab"}
    labels = [m[0] for m in _mutations(base, "pinned")]
    for kind in ("drop seed", "seed=None", "seed='x'", "seed=b'\\x00'", "seed=[]", "seed={}",
                 "seed=1.5", "seed=True", "seed=-1", f"seed={2**64}", "state=None"):
        assert kind in labels, kind


# -- issue 55, class 4: dropped batches and skipped files -----------------------------------------
SKIP_CASES = 200  # resumed states per backend


@pytest.fixture(scope="module")
def bad_data(tmp_path_factory):
    """20 small images, 8 of them bad: with batches of 2 over 2 ranks, wholly bad batches (dropped),
    batches with one stand-in row, and padded rows vary from epoch to epoch."""
    root = tmp_path_factory.mktemp("fuzz_bad")
    generate(GenConfig(out=str(root), num_images=20, classes=2, seed=9, width_range=(16, 24),
                       workers=1), progress=False)
    files = sorted(root.rglob("*.jpg"))
    rng = np.random.default_rng(0)
    for k in rng.choice(len(files), 8, replace=False).tolist():
        files[k].write_bytes(b"not an image" * 4)
    return root


@pytest.mark.parametrize("backend", BACKENDS)
def test_resumes_after_dropped_batches_and_skipped_files_join_exactly(backend, bad_data):
    """Every state an uninterrupted run takes (after each batch, over enough epochs for
    ``SKIP_CASES`` states) resumes into exactly the batches it yields after it: indices,
    valid masks and pixels; and the valid rows of each epoch are each good sample of the
    rank's share once (``pipelines.loader`` NOTE [positions])."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    cfg = _cfg(bad_data, batch_size=2, on_bad_file="skip",
               last_batch="pad", seed=4)
    loader = _open(backend, cfg)
    try:
        bad = {i for i, p in enumerate(loader.paths) if open(p, "rb").read(3) == b"not"}
        cases = dropped = 0
        epoch = 0
        while cases < SKIP_CASES:
            loader.set_epoch(epoch)
            states, ref = [loader.state_dict()], []
            for b in loader:
                ref.append((b.images.clone(), b.indices.tolist(), b.valid.tolist()))
                states.append(loader.state_dict())
            # the valid rows are the good samples of this rank's share, once
            batches, valid = loader._plan_valid(epoch)
            share = sorted({int(i) for bb, v in zip(batches, valid) for i, ok in zip(bb, v)
                            if ok} - bad)
            rows = sorted(i for _, idx, ok in ref for i, v in zip(idx, ok) if v)
            assert rows == share, (backend, epoch)
            assert loader.state_dict()["batches"] == len(loader), (backend, epoch)
            states.append(loader.state_dict())  # after trailing dropped batches too
            dropped += len(loader) - len(ref)
            for k, state in enumerate(states):
                k = min(k, len(ref))  # the end states resume into nothing
                loader.load_state_dict(state)
                rest = [(b.images.clone(), b.indices.tolist(), b.valid.tolist())
                        for b in loader]
                assert [r[1:] for r in rest] == [r[1:] for r in ref[k:]], (backend, epoch, k)
                assert all(torch.equal(a[0], r[0]) for a, r in zip(rest, ref[k:])), (
                    backend, epoch, k)
                cases += 1
            epoch += 1
        assert dropped >= 3, dropped  # the fuzz did drop batches
        print(f"{backend}: {cases} resumed states over {epoch} epochs, {dropped} batches dropped")
    finally:
        loader.close()
