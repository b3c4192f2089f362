"""Lightning's Trainer and an Accelerate loop drive our loader: epochs advance by themselves,
checkpoints carry the loader state, and a run resumed mid-epoch joins the uninterrupted one."""
from __future__ import annotations

import warnings

import pytest
import torch

from pipelines import AugmentSpec, LoaderConfig, create_loader

BACKENDS = ["dali", "pinned", "pageable"]


def _cfg(root):
    return LoaderConfig(root=root, batch_size=4, device="cpu", num_workers=1, seed=3,
                        augment=AugmentSpec(size=16), debug_indices=True)


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 3))


def _key(x) -> float:
    return round(float(x.double().sum()), 3)  # the batch's pixels, in one number


def _lightning(backend, root):
    """Lightning (skipped without it, or without DALI for ``dali``), a LightningModule class
    that trains on our loader and records, per step, ``(epoch, step, the loader's epoch, the
    batch's pixels)``, and the Trainer's quiet CPU arguments."""
    L = pytest.importorskip("lightning")
    if backend == "dali":
        pytest.importorskip("nvidia.dali")

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _net()
            self.seen = []
            self.loader = create_loader(backend, _cfg(root))

        def train_dataloader(self):
            return self.loader  # no set_epoch anywhere: Lightning calls loader.sampler's

        def training_step(self, batch, i):
            x, y = batch
            self.seen.append((self.current_epoch, i, self.loader.epoch, _key(x)))
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return L, Module, dict(accelerator="cpu", logger=False, enable_progress_bar=False,
                           enable_model_summary=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_lightning_trainer_advances_epochs_and_resumes_mid_epoch(backend, tiny_root, tmp_path):
    L, Module, kw = _lightning(backend, tiny_root)
    from lightning.pytorch.callbacks import ModelCheckpoint

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = Module()
        L.Trainer(max_epochs=2, enable_checkpointing=False, **kw).fit(ref)
        assert {e for e, _, _, _ in ref.seen} == {0, 1}
        assert all(e == loader_epoch for e, _, loader_epoch, _ in ref.seen)
        cut = len(ref.seen) // 2 + 2  # mid second epoch
        ck = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1,
                             filename="{step}")
        killed = Module()
        L.Trainer(max_steps=cut, callbacks=[ck], **kw).fit(killed)
        path = tmp_path / f"step={cut - 1}.ckpt"
        state = torch.load(path, weights_only=False)
        saved = state["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
        assert saved["batches"] >= 1 and "dali" not in saved  # the position only
        resumed = Module()
        L.Trainer(max_epochs=2, enable_checkpointing=False, **kw).fit(resumed, ckpt_path=path)
    at = resumed.seen[0][:2]
    assert at[0] == 1 and at[1] > 0  # resumed inside the second epoch
    joined = [r for r in killed.seen if r[:2] < at] + resumed.seen
    assert joined == ref.seen


@pytest.mark.parametrize("backend", BACKENDS)
def test_lightning_end_of_epoch_checkpoint_resumes_exactly(backend, tiny_root, tmp_path):
    """``ModelCheckpoint(every_n_epochs=1)``, then ``fit(ckpt_path=...)``: Lightning calls only
    ``set_epoch(1)`` on a fresh loader, and epoch 1 has the uninterrupted run's pixels."""
    L, Module, kw = _lightning(backend, tiny_root)
    from lightning.pytorch.callbacks import ModelCheckpoint

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = Module()
        L.Trainer(max_epochs=2, enable_checkpointing=False, **kw).fit(ref)
        ck = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1,
                             filename="end")
        first = Module()
        L.Trainer(max_epochs=1, callbacks=[ck], **kw).fit(first)
        resumed = Module()
        L.Trainer(max_epochs=2, enable_checkpointing=False, **kw).fit(
            resumed, ckpt_path=tmp_path / "end.ckpt")
    assert first.seen == [r for r in ref.seen if r[0] == 0]
    assert resumed.seen == [r for r in ref.seen if r[0] == 1] and resumed.seen


@pytest.mark.parametrize("backend", BACKENDS)
def test_accelerate_prepare_loop_checkpoints_and_resumes_mid_epoch(backend, tiny_root,
                                                                   tmp_path):
    pytest.importorskip("accelerate")
    from accelerate import Accelerator

    if backend == "dali":
        pytest.importorskip("nvidia.dali")

    def run(stop_after=None, resume=None):
        acc = Accelerator(cpu=True)
        net = _net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        loader = create_loader(backend, _cfg(tiny_root))
        net, opt, loader = acc.prepare(net, opt, loader)  # our loader passes through
        acc.register_for_checkpointing(loader)
        if resume is not None:
            acc.load_state(resume)
        seen = []
        for epoch in range(loader.epoch, 2):
            loader.set_epoch(epoch)  # as with Accelerate's own DataLoaderShard
            for x, y in loader:
                loss = torch.nn.functional.cross_entropy(net(x), y)
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
                seen.append((epoch, loader.position[1] - 1,
                             tuple(loader.last_batch_indices.tolist()), _key(x)))
                if stop_after is not None and len(seen) == stop_after:
                    acc.save_state(str(tmp_path / "state"))
                    loader.close()
                    return seen
        loader.close()
        return seen

    ref = run()
    cut = len(ref) // 2 + 2
    first = run(stop_after=cut)
    rest = run(resume=str(tmp_path / "state"))
    assert rest[0][:2] == ref[cut][:2] and rest[0][0] == 1
    assert first + rest == ref


# -- evaluation hooks: val/test/predict loaders, and Batch through the device transfer ----------
def _eval_cfg(backend, root):
    """No torch worker process: one would import this module again in each rank."""
    return LoaderConfig(root=root, batch_size=8, device="cpu", shuffle=False,
                        num_workers=1 if backend == "dali" else 0,
                        augment=AugmentSpec(mode="eval", size=16), last_batch="pad")


def _eval_module(L, backend, root):
    """A LightningModule whose four ``*_dataloader()`` hooks return our loaders, and that runs
    the README's masked count in ``validation_step``/``test_step``: ``self.counts[stage]`` is
    ``(samples, correct)`` summed over ranks; ``self.rows[stage]`` the valid rows' indices seen
    on this rank; ``self.rebuilt`` whether a step got another type than ``Batch``."""
    from pipelines.types import Batch

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _net()
            self.loaders, self.counts, self.rows, self.rebuilt = [], {}, {}, False

        def _loader(self):
            self.loaders.append(create_loader(backend, _eval_cfg(backend, root)))
            return self.loaders[-1]

        train_dataloader = val_dataloader = test_dataloader = predict_dataloader = _loader

        def training_step(self, batch, i):
            x, y = batch  # the 2-tuple unpack still works
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def _count(self, batch, stage):
            self.rebuilt |= type(batch) is not Batch
            hit = (self.net(batch.images).argmax(1) == batch.labels) & batch.valid
            self.count += torch.stack([batch.valid.sum(), hit.sum()])
            self.rows.setdefault(stage, []).extend(batch.indices[batch.valid].tolist())

        def validation_step(self, batch, i):
            self._count(batch, "val")

        def test_step(self, batch, i):
            self._count(batch, "test")

        def predict_step(self, batch, i):
            self.rebuilt |= type(batch) is not Batch
            return batch.indices[batch.valid]

        def on_validation_epoch_start(self):  # the sanity check's batches are not counted
            self.count = torch.zeros(2, dtype=torch.int64)
            self.rows.pop("test" if self.trainer.testing else "val", None)

        on_test_epoch_start = on_validation_epoch_start

        def on_validation_epoch_end(self):
            total = self.trainer.strategy.reduce(self.count, reduce_op="sum")
            self.counts["test" if self.trainer.testing else "val"] = tuple(total.tolist())

        on_test_epoch_end = on_validation_epoch_end

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Module()


def _want(backend, root, net):
    """``(samples, correct)`` of ``net`` by the plain loop on one process."""
    cfg = _eval_cfg(backend, root).replace(last_batch="partial", rank=0, world_size=1)
    with create_loader(backend, cfg) as ld:
        n, hit = 0, 0
        with torch.no_grad():
            for x, y in ld:
                n, hit = n + len(y), hit + int((net(x).argmax(1) == y).sum())
    return n, hit


def _evaluate_everything(L, backend, root, **trainer):
    """``fit`` for one epoch (with its validation), ``validate``, ``test`` and ``predict`` of one
    module; returns it and what ``predict`` returned."""
    kw = dict(accelerator="cpu", logger=False, enable_progress_bar=False,
              enable_model_summary=False, enable_checkpointing=False, **trainer)
    module = _eval_module(L, backend, root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = L.Trainer(max_epochs=1, limit_train_batches=2, **kw)
        t.fit(module)
        fit_val = module.counts.pop("val")
        t.validate(module)
        t.test(module)
        predicted = t.predict(module)
    for ld in module.loaders:
        ld.close()
    return module, fit_val, predicted


@pytest.mark.parametrize("backend", BACKENDS)
def test_lightning_val_test_and_predict_loaders_count_each_sample_once(backend, tiny_root):
    L, _, _ = _lightning(backend, tiny_root)
    module, fit_val, predicted = _evaluate_everything(L, backend, tiny_root)
    want = _want(backend, tiny_root, module.net)  # the weights fit left, as every stage saw
    assert want[0] == 37
    assert fit_val == module.counts["val"] == module.counts["test"] == want
    assert not module.rebuilt  # Lightning's transfer went through Batch.to
    assert sorted(module.rows["val"]) == sorted(module.rows["test"]) == list(range(37))
    assert sorted(torch.cat(predicted).tolist()) == list(range(37))


def _ddp_rank(rank, backends, root, port, out):
    import json
    import os

    import lightning as L

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank),
                      NODE_RANK="0")  # as torchrun sets them: Lightning launches nothing
    torch.set_num_threads(1)
    for backend in backends:  # one process group for all: a rank's start is most of the time
        module, fit_val, predicted = _evaluate_everything(
            L, backend, root, strategy="ddp", devices=2, num_sanity_val_steps=0)
        rows = {**module.rows, "predict": torch.cat(predicted).tolist()}
        res = {"fit_val": fit_val, "counts": module.counts, "rows": rows,
               "rebuilt": module.rebuilt,
               "want": _want(backend, root, module.net)}  # one process, the weights DDP left
        with open(os.path.join(out, f"{backend}-rank{rank}.json"), "w") as f:
            json.dump(res, f)


@pytest.fixture(scope="module")
def ddp_runs(tiny_root, tmp_path_factory):
    """What each rank of a ``strategy="ddp"`` job on two ranks (gloo) saw, per backend: the
    folder of ``{backend}-rank{r}.json`` (``_ddp_rank``)."""
    import socket

    import torch.multiprocessing as mp

    pytest.importorskip("lightning")
    backends = [b for b in BACKENDS if b != "dali" or _has_dali()]
    out = tmp_path_factory.mktemp("ddp")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_ddp_rank, args=(backends, str(tiny_root), port, str(out)), nprocs=2, join=True)
    return out


def _has_dali() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("backend", BACKENDS)
def test_lightning_ddp_masked_evaluation_counts_each_sample_once(backend, tiny_root, ddp_runs):
    """``strategy="ddp"`` on two ranks, ``last_batch="pad"``: the README's masked count in
    ``validation_step``/``test_step``, reduced over ranks, equals one process's exactly, and the
    valid rows of val, test and predict are each sample once over both ranks."""
    import json

    _lightning(backend, tiny_root)
    ranks = [json.loads((ddp_runs / f"{backend}-rank{r}.json").read_text()) for r in (0, 1)]
    for r in ranks:
        assert r["want"][0] == 37 and r["want"] == ranks[0]["want"]
        assert r["fit_val"] == r["counts"]["val"] == r["counts"]["test"] == r["want"]
        assert not r["rebuilt"]
    for stage in ("val", "test", "predict"):
        rows = ranks[0]["rows"][stage] + ranks[1]["rows"][stage]
        assert sorted(rows) == list(range(37)), stage  # each sample once, over the ranks
        assert ranks[0]["rows"][stage] and ranks[1]["rows"][stage], stage


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_keeps_indices_and_valid_through_lightning_and_accelerate_transfer(backend,
                                                                              tiny_root):
    """Both frameworks move a batch with ``Batch.to``; a batch rebuilt from ``(images,
    labels)`` refuses to say which rows are valid rather than calling them all valid."""
    pytest.importorskip("lightning")
    pytest.importorskip("accelerate")
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    from accelerate.utils import send_to_device
    from lightning.fabric.utilities.apply_func import move_data_to_device

    from pipelines.types import Batch

    with create_loader(backend, _eval_cfg(backend, tiny_root)) as ld:
        *_, last = ld  # the padded last batch: 37 = 4 * 8 + 5
    assert last.valid.tolist() == [True] * 5 + [False] * 3
    for moved in (move_data_to_device(last, "cpu"), send_to_device(last, "cpu"),
                  send_to_device({"batch": last}, "cpu")["batch"], last.to("cpu")):
        assert type(moved) is Batch
        x, y = moved  # still a pair
        assert torch.equal(x, last.images) and torch.equal(y, last.labels)
        assert torch.equal(moved.indices, last.indices)
        assert torch.equal(moved.valid, last.valid)
    rebuilt = Batch(*last)  # what a NamedTuple-rebuilding transfer would make
    for field in ("indices", "valid"):
        with pytest.raises(AttributeError, match=f"no {field}.*batch.to"):
            getattr(rebuilt, field)
