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
