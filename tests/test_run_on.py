"""DALI's pipelines running on across epoch boundaries (``pipelines.dali.loader`` NOTE
[running on]): the same batches, crops and order as pipelines that stop at each epoch end,
whatever the consumer does between epochs, with the next epoch's first batches made ahead."""
import numpy as np
import pytest
import torch

from pipelines import AugmentSpec, DaliOptions, LoaderConfig, create_loader

pytest.importorskip("nvidia.dali")


def _cfg(root, **kw):
    base = dict(root=root, batch_size=4, device="cpu", num_workers=2, debug_indices=True,
                augment=AugmentSpec(size=32), seed=5)
    base.update(kw)
    return LoaderConfig(**base)


def _run(root, epochs, run_on, stop_at=None, pipelines=None, **kw):
    """Each epoch of ``epochs`` in turn (``set_epoch`` before it; ``None``: no call), as
    ``(images, labels, indices)``; ``stop_at[i]``: leave epoch i after that many batches."""
    out = []
    opts = DaliOptions(run_on=run_on, pipelines=pipelines)
    with create_loader("dali", _cfg(root, **kw), options=opts) as ld:
        for i, e in enumerate(epochs):
            if e is not None:
                ld.set_epoch(e)
            got, left = [], False
            for x, y in ld:
                got.append((x.clone(), y.clone()))
                if stop_at and stop_at.get(i) == len(got):
                    left = True
                    break
            out.append((got, None if left else ld.last_indices.copy()))
    return out


def _same(a, b, exact=None):
    """The same epochs, batches, indices and labels; the same pixels in the first ``exact``
    epochs (all by default)."""
    assert len(a) == len(b)
    for e, ((ga, ia), (gb, ib)) in enumerate(zip(a, b)):
        assert (ia is None and ib is None) or np.array_equal(ia, ib)
        assert len(ga) == len(gb)
        for (xa, ya), (xb, yb) in zip(ga, gb):
            assert torch.equal(ya, yb) and xa.shape == xb.shape
            if exact is None or e < exact:
                assert torch.equal(xa, xb), e


@pytest.mark.parametrize("pipelines", [1, 2])
@pytest.mark.parametrize("last_batch", ["drop", "partial", "pad"])
def test_running_on_yields_what_stopping_yields(tiny_root, pipelines, last_batch):
    """Three epochs in order: the same indices, labels and pixels with and without running on,
    for each last-batch policy and for two lanes."""
    epochs = [0, 1, 2]
    a = _run(tiny_root, epochs, False, pipelines=pipelines, last_batch=last_batch)
    b = _run(tiny_root, epochs, True, pipelines=pipelines, last_batch=last_batch)
    _same(a, b)
    assert all(idx is not None and len(idx) for _, idx in b)


@pytest.mark.parametrize("epochs,stop_at,exact", [
    ([None, None, None], None, 1),  # no set_epoch: the same epoch again (guessed from the 3rd)
    ([0, 5, 6], None, 1),           # a jump: what ran on is dropped
    ([0, 1, 2], {0: 3}, None),      # an early end: drained as before
    ([0, 1, 1, 2], {1: 9}, 2),      # leaves one batch early (having run on), then repeats it
])
def test_running_on_survives_what_the_consumer_does_between_epochs(tiny_root, epochs, stop_at,
                                                                   exact):
    """The same batches whatever the consumer does. Batches made ahead and dropped (a wrong
    guess, an early end after running on) took their random draws, so the crops after them
    differ from a loader that did not run on, as they do after any early end."""
    _same(_run(tiny_root, epochs, False, stop_at=stop_at),
          _run(tiny_root, epochs, True, stop_at=stop_at), exact)


def test_the_next_epoch_is_made_ahead_and_the_pipelines_are_not_reset(tiny_root):
    """After an epoch ends the lanes hold the next one's first batches, and its iter() starts
    on them without resetting the pipelines; a wrong guess drains them and resets."""
    with create_loader("dali", _cfg(tiny_root), options=DaliOptions(pipelines=2)) as ld:
        resets = []
        ld.set_epoch(0)
        n0 = sum(len(y) for _, y in ld)
        assert ld._ran_on == 1 and ld.source.samples_read > n0  # epoch 1 fed ahead
        for it in ld._its:
            orig = it.reset
            it.reset = lambda orig=orig: (resets.append(1), orig())
        ld.set_epoch(1)
        assert sum(len(y) for _, y in ld) == n0 and resets == []
        ld.set_epoch(7)  # not the guess (2): what ran on is dropped, the pipelines reset
        assert sum(len(y) for _, y in ld) == n0 and len(resets) >= 2
        plan = np.concatenate(ld.plan(7))
        assert np.array_equal(ld.last_indices, plan[:len(ld.last_indices)])


def test_a_bad_file_at_an_epoch_end_is_counted_once_per_epoch(tiny_root, tmp_path):
    """A wholly bad last batch (its record trails the lane's last fed batch) is counted in the
    epoch it belongs to, not lost or moved by running on."""
    import shutil

    root = tmp_path / "r"
    shutil.copytree(tiny_root, root)
    with create_loader("dali", _cfg(root, shuffle=False, on_bad_file="skip")) as ld:
        last = [ld.paths[i] for i in ld.plan(0)[-1]]
        size = sum(len(b) for b in ld.plan(0))
        for p in last:
            with open(p, "wb") as f:
                f.write(b"not a jpeg")
        counts = []
        for e in range(3):
            ld.set_epoch(e)
            n = sum(len(y) for _, y in ld)
            counts.append((n, ld.stats.bad_files))
    assert [c[0] for c in counts] == [size - len(last)] * 3
    assert counts[0][1] == len(last) and counts[1][1] - counts[0][1] == len(last) \
        and counts[2][1] - counts[1][1] == len(last)


@pytest.mark.cuda
@pytest.mark.parametrize("hw", [0.0, 1.0])
def test_running_on_yields_what_stopping_yields_on_the_gpu(gpu_root, hw):
    """nvJPEG (and the hardware decoder where the GPU has one) with the fused crop: three
    epochs, the same indices, labels and pixels with and without running on."""
    kw = dict(device="cuda", batch_size=48, augment=AugmentSpec(size=64))
    opts = dict(hw_decoder_load=hw)
    runs = []
    for run_on in (False, True):
        out = []
        with create_loader("dali", _cfg(gpu_root, **kw),
                           options=DaliOptions(run_on=run_on, **opts)) as ld:
            for e in range(3):
                ld.set_epoch(e)
                out.append(([(x.cpu(), y.cpu()) for x, y in ld], ld.last_indices.copy()))
        runs.append(out)
    _same(*runs)
