"""DALI backend specifics, in CPU mode (CI) and, with the cuda marker, on the GPU."""
import threading

import numpy as np
import pytest
import torch
from PIL import Image
from utils import make

from pipelines import AugmentSpec, LoaderConfig, create_loader

pytestmark = pytest.mark.dali


def _cfg(root, **kw):
    base = dict(root=root, batch_size=8, device="cpu", num_workers=2, augment=AugmentSpec(size=32))
    base.update(kw)
    return LoaderConfig(**base)


def _denorm_mae(a, b, spec):
    std = torch.tensor(spec.std, device=a.device).view(1, 3, 1, 1)
    return ((a.float() - b.float()) * std).abs().mean().item()


def test_eval_output_matches_torch_backends_within_2_over_255(tiny_root):
    spec = AugmentSpec(mode="eval", size=32, resize_size=40)
    outs = {}
    for b in ("pageable", "dali"):
        with create_loader(b, _cfg(tiny_root, augment=spec, shuffle=False)) as ld:
            outs[b] = torch.cat([x for x, _ in ld])
    mae = _denorm_mae(outs["pageable"], outs["dali"], spec)
    assert mae < 2 / 255, f"mean abs diff {mae * 255:.3f}/255"


def test_early_break_then_next_epoch_is_complete(tiny_root):
    with create_loader("dali", _cfg(tiny_root, debug_indices=True)) as ld:
        for i, _ in enumerate(ld):
            if i == 1:
                break
        ld.set_epoch(1)
        n = sum(len(y) for _, y in ld)
        assert n == 37 and sorted(ld.last_indices.tolist()) == list(range(37))


def test_grayscale_and_cmyk_come_out_rgb(tmp_path):
    (tmp_path / "c").mkdir()
    rgb = np.zeros((64, 64, 3), np.uint8)
    rgb[..., 0] = 200
    rgb[..., 2] = 40
    Image.fromarray(rgb).convert("CMYK").save(tmp_path / "c" / "cmyk.jpg", quality=95)
    Image.fromarray(np.full((64, 64), 90, np.uint8)).save(tmp_path / "c" / "gray.jpg", quality=95)
    spec = AugmentSpec(mode="eval", size=32, resize_size=32)
    outs = {}
    for b in ("pageable", "dali"):
        with create_loader(b, _cfg(tmp_path, augment=spec, shuffle=False, batch_size=2)) as ld:
            outs[b] = next(iter(ld))[0]
    x = outs["dali"]
    assert x.shape == (2, 3, 32, 32)
    assert _denorm_mae(outs["pageable"], x, spec) < 3 / 255
    mean = torch.tensor(spec.mean).view(3, 1, 1)
    std = torch.tensor(spec.std).view(3, 1, 1)
    px = (x * std + mean) * 255
    assert px[0, 0].mean() > 150 and px[0, 2].mean() < 100  # CMYK red-ish stays red-ish
    assert (px[1].std(dim=0) < 2).all()                      # grayscale: R == G == B


def test_missing_file_error_reaches_caller(tiny_root, tmp_path):
    import shutil

    root = tmp_path / "r"
    shutil.copytree(tiny_root, root)
    with create_loader("dali", _cfg(root, shuffle=False)) as ld:
        victim = sorted(root.glob("class_0001/*.jpg"))[0]
        victim.unlink()
        with pytest.raises(Exception, match=victim.name):
            for _ in ld:
                pass


@pytest.mark.parametrize("run_on", [False, True])
def test_files_are_checked_in_python_once_then_fed_as_paths(tiny_root, run_on):
    from pipelines import DaliOptions

    opts = DaliOptions(run_on=run_on)
    with create_loader("dali", _cfg(tiny_root, debug_indices=True), options=opts) as ld:
        seen = []
        for epoch in range(3):
            ld.set_epoch(epoch)
            n = sum(len(y) for _, y in ld)
            seen.append((n, ld.source.files_checked))
            assert sorted(ld.last_indices.tolist()) == list(range(37))
        assert seen == [(37, 37), (37, 37), (37, 37)]   # epochs 1 and 2 read nothing in Python
        total = sum(p.stat().st_size for p in tiny_root.glob("*/*.jpg"))
        if not run_on:
            assert ld.source.bytes_read == 3 * total and ld.source.samples_read == 3 * 37
        else:  # epoch 3's first batches were fed ahead (NOTE [running on])
            assert 3 * total < ld.source.bytes_read < 4 * total
            assert 3 * 37 < ld.source.samples_read < 4 * 37


def test_a_known_bad_file_is_reported_every_epoch(tiny_root, tmp_path):
    import shutil

    root = tmp_path / "r"
    shutil.copytree(tiny_root, root)
    victim = sorted(root.glob("class_0001/*.jpg"))[0]
    victim.write_bytes(victim.read_bytes()[:500])          # truncated
    with create_loader("dali", _cfg(root, on_bad_file="skip")) as ld:
        for epoch in range(2):
            ld.set_epoch(epoch)
            with pytest.warns(RuntimeWarning, match="skipped 1 bad files"):
                assert sum(len(y) for _, y in ld) == 37  # replaced, batch sizes kept
        assert ld.stats["bad_files"] == 2 and victim.name in ld.stats["bad"][0][0]
    with create_loader("dali", _cfg(root, on_bad_file="error")) as ld:
        for epoch in range(2):                              # raised again from the record
            ld.set_epoch(epoch)
            with pytest.raises(Exception, match="truncated JPEG"):
                for _ in ld:
                    pass


@pytest.mark.parametrize("pipes", [2, 3])
@pytest.mark.parametrize("policy", ["partial", "drop", "pad"])
def test_side_by_side_pipelines_yield_the_plan_in_order(tiny_root, pipes, policy):
    """n pipelines each take every n-th batch; round-robin restores the one-pipeline order (37
    samples in batches of 8: 5 batches, so the lanes end unevenly), for every epoch."""
    spec = AugmentSpec(mode="eval", size=32, resize_size=40)   # deterministic: outputs comparable
    got = {}
    for n in (1, pipes):
        cfg = _cfg(tiny_root, augment=spec, debug_indices=True, last_batch=policy,
                   num_workers=max(2, n))
        with make("dali", cfg, pipelines=n) as ld:
            got[n] = []
            for epoch in (0, 1):
                ld.set_epoch(epoch)
                xs = [x for x, _ in ld]
                got[n].append((ld.last_indices.tolist(), [tuple(x.shape) for x in xs],
                               torch.cat(xs)))
            assert len(ld) == len(xs)
    for (i1, s1, x1), (i2, s2, x2) in zip(got[1], got[pipes]):
        assert i1 == i2 and s1 == s2
        assert torch.equal(x1, x2)
    assert got[1][0][0] != got[1][1][0]  # the epochs differ, so the order was really followed


def test_side_by_side_pipelines_break_early_and_skip_bad_files(tiny_root, tmp_path):
    import shutil

    root = tmp_path / "r"
    shutil.copytree(tiny_root, root)
    victim = sorted(root.glob("class_0002/*.jpg"))[0]
    victim.write_bytes(victim.read_bytes()[:400])
    cfg = _cfg(root, debug_indices=True, on_bad_file="skip")
    with make("dali", cfg, pipelines=2) as ld:
        for i, _ in enumerate(ld):
            if i == 2:
                break
        for epoch in (1, 2):
            ld.set_epoch(epoch)
            with pytest.warns(RuntimeWarning, match="skipped 1 bad files"):
                n = sum(len(y) for _, y in ld)
            assert n == 37 and len(set(ld.last_indices.tolist())) == 36


def test_mmap_and_plain_reads_give_identical_batches(tiny_root):
    spec = AugmentSpec(mode="eval", size=32, resize_size=40)
    outs = []
    for mmap in (True, False):
        with make("dali", _cfg(tiny_root, augment=spec), use_mmap=mmap) as ld:
            outs.append(torch.cat([x for x, _ in ld]))
    assert torch.equal(outs[0], outs[1])


def test_close_stops_reader_threads(tiny_root):
    before = {t.name for t in threading.enumerate()}
    ld = create_loader("dali", _cfg(tiny_root))
    next(iter(ld))
    ld.close()
    left = [t.name for t in threading.enumerate() if t.name.startswith("dali-read") and t.name not in before]
    assert left == []


@pytest.mark.cuda
@pytest.mark.parametrize("pipes, mmap", [(1, False), (2, False), (1, True)])
def test_gpu_eval_matches_torch_and_batches_live_on_gpu(gpu_root, pipes, mmap):
    spec = AugmentSpec(mode="eval", size=224)
    outs = {}
    for b in ("pinned", "dali"):
        cfg = LoaderConfig(root=gpu_root, batch_size=60, device="cuda", num_workers=4,
                           augment=spec, shuffle=False)
        opts = {"pipelines": pipes, "use_mmap": mmap} if b == "dali" else {}
        with make(b, cfg, **opts) as ld:
            xs = [x for x, _ in ld]
            assert xs[0].is_cuda and len(xs) == len(ld) == 9   # 512 = 8 x 60 + 32
            outs[b] = torch.cat(xs)
    mae = _denorm_mae(outs["pinned"], outs["dali"], spec)
    print(f"DALI (GPU, {pipes} pipelines, mmap={mmap}) vs pinned eval: "
          f"mean abs diff {mae * 255:.4f}/255")
    assert mae < 2 / 255


@pytest.mark.cuda
@pytest.mark.parametrize("dtype, cl, pipes", [("bfloat16", True, 1), ("float32", False, 1),
                                              ("bfloat16", True, 2)])
def test_gpu_train_contract(gpu_root, dtype, cl, pipes):
    cfg = LoaderConfig(root=gpu_root, batch_size=64, device="cuda", num_workers=4, dtype=dtype,
                       channels_last=cl, debug_indices=True, last_batch="partial")
    with make("dali", cfg, pipelines=pipes) as ld:
        ys = []
        for x, y in ld:
            assert x.is_cuda and y.is_cuda and x.dtype == getattr(torch, dtype)
            assert x.shape[1:] == (3, 224, 224)
            assert x.is_contiguous(memory_format=torch.channels_last) == cl
            ys.append(y)
        assert sorted(ld.last_indices.tolist()) == list(range(512))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype, cl", [("bfloat16", True), ("float32", False)])
def test_gpu_batches_stay_intact_for_a_busy_consumer(gpu_root, dtype, cl):
    """A batch is DALI's own output memory, handed over on the consumer's current stream: the
    images and labels a consumer reads while its stream is still busy with earlier work equal
    those an idle consumer reads, in the config's dtype and layout, labels on the device."""
    spec = AugmentSpec(mode="eval", size=224)
    cfg = LoaderConfig(root=gpu_root, batch_size=64, device="cuda", num_workers=4, dtype=dtype,
                       channels_last=cl, augment=spec, shuffle=False)
    outs = {}
    busy = torch.randn(4096, 4096, device="cuda")
    for consumer in ("idle", "busy"):
        with make("dali", cfg) as ld:
            kept = []
            for x, y in ld:
                if consumer == "busy":
                    for _ in range(20):  # queue work ahead of the consumer's use of x
                        busy = (busy @ busy).clamp_(-1, 1)
                assert x.dtype == getattr(torch, dtype) and y.is_cuda and y.dtype == torch.int64
                assert x.is_contiguous(memory_format=torch.channels_last) == cl
                kept.append((x.float().sum(dim=(1, 2, 3)), x[:2].float().clone(), y.clone()))
            torch.cuda.synchronize()
            outs[consumer] = [torch.cat([k[i] for k in kept]) for i in range(3)]
    for a, b in zip(outs["idle"], outs["busy"]):
        assert torch.equal(a, b)


def test_decode_on_cpu_refuses_a_hardware_decoder_share_and_is_a_no_op_on_cpu_operators(
        tiny_root):
    """``DaliOptions.decode_on="cpu"``: no nvJPEG tuning reaches its decoder, a hardware
    decoder share (or its calibration) is refused naming both options, and on CPU operators,
    where everything decodes on the CPU anyway, the batches are the default's."""
    from pipelines import DaliOptions
    from pipelines.config import DecodeOn
    from pipelines.dali.graph import decoder_kwargs, decodes_on_gpu

    cpu = DaliOptions(decode_on="cpu")
    assert cpu.decode_on is DecodeOn.CPU and DaliOptions().decode_on is DecodeOn.GPU
    assert decoder_kwargs(cpu, gpu=True) == {} and not decodes_on_gpu(cpu, gpu=True)
    assert decoder_kwargs(DaliOptions(), gpu=True)["hw_decoder_load"] == 0.0
    for load in (1.0, None):
        with pytest.raises(ValueError, match="decode_on='cpu' does not use"):
            make("dali", _cfg(tiny_root), decode_on="cpu", hw_decoder_load=load)
    outs = []
    for where in ("gpu", "cpu"):
        with make("dali", _cfg(tiny_root), decode_on=where) as ld:
            assert ld.decoder == "DALI CPU"
            outs.append(torch.cat([x for x, _ in ld]))
    assert torch.equal(outs[0], outs[1])


@pytest.mark.cuda
def test_gpu_decode_on_cpu_gives_gpu_batches_close_to_nvjpegs(gpu_root):
    """``decode_on="cpu"`` on a GPU: DALI's CPU decoder, the batches on the device, the eval
    recipe within 2/255 of nvJPEG's (two JPEG decoders), and the train recipe's contract."""
    spec = AugmentSpec(mode="eval", size=224)
    cfg = LoaderConfig(root=gpu_root, batch_size=64, device="cuda", num_workers=4,
                       augment=spec, shuffle=False)
    outs = {}
    for where in ("gpu", "cpu"):
        with make("dali", cfg, decode_on=where) as ld:
            assert ld.decoder == ("DALI CPU decode" if where == "cpu" else "nvJPEG hw 0")
            xs = [x for x, _ in ld]
            assert xs[0].is_cuda
            outs[where] = torch.cat(xs)
    mae = _denorm_mae(outs["gpu"], outs["cpu"], spec)
    print(f"DALI decode_on=cpu vs nvJPEG eval: mean abs diff {mae * 255:.4f}/255")
    assert mae < 2 / 255
    train = cfg.replace(augment=AugmentSpec(size=224), dtype="bfloat16", channels_last=True)
    with make("dali", train, decode_on="cpu") as ld:
        x, y = next(iter(ld))
        assert x.is_cuda and y.is_cuda and x.dtype == torch.bfloat16
        assert x.shape == (64, 3, 224, 224)
        assert x.is_contiguous(memory_format=torch.channels_last)


def test_the_pipelines_run_on_dalis_dynamic_executor(tiny_root):
    """DALI's default executor (``exec_dynamic``); the pipelined one was no faster
    (docs/investigations/dali-hardware-decoder.md)."""
    with make("dali", _cfg(tiny_root)) as ld:
        assert ld.pipes and all(p._exec_dynamic for p in ld.pipes)  # DALI's own attribute


def test_large_photos_get_more_pipelines_by_default(tmp_path):
    """NOTE [large photos]: the default pipeline count follows the data's median header size
    (nvJPEG only); an explicit count wins."""

    from pipelines.dali.loader import large_photos
    from pipelines.options import LARGE_PHOTO_LANES, DaliOptions
    from pipelines.sources.root import open_source

    for name, (w, h) in {"small": (640, 480), "large": (2000, 1500)}.items():
        d = tmp_path / name / "c"
        d.mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (w, h), (i, 0, 0)).save(d / f"{i}.jpg")
    assert not large_photos(open_source(str(tmp_path / "small")))
    assert large_photos(open_source(str(tmp_path / "large")))
    opt = DaliOptions()
    assert opt.lanes_for(False, 14, large_photos=True) == LARGE_PHOTO_LANES
    assert opt.lanes_for(True, 2, large_photos=True) == 2  # never more than the threads
    # at least LANE_BATCHES batches of an epoch for each pipeline, and at least one pipeline
    assert [opt.lanes_for(False, 14, True, batches=b) for b in (1, 5, 6, 9, 11, 12, 100)] == [
        1, 1, 2, 3, 3, 4, 4]
    assert opt.lanes_for(False, 14) == 1 and opt.lanes_for(True, 14) == 2
    assert DaliOptions(pipelines=1).lanes_for(False, 14, large_photos=True) == 1


def test_the_hardware_share_defaults_to_half_on_large_photos_only():
    """NOTE [large photos]: ``hw_decoder_load="auto"`` (the default) is ``LARGE_PHOTO_HW_LOAD``
    on large photos with a hardware decoder, else 0.0; a number or ``None`` (calibrate) wins."""
    from pipelines.options import LARGE_PHOTO_HW_LOAD, DaliOptions

    assert DaliOptions().hw_decoder_load == "auto" and DaliOptions().changed() == {}
    assert DaliOptions().load_for(True) == LARGE_PHOTO_HW_LOAD == 0.5
    assert DaliOptions().load_for(False) == 0.0
    assert DaliOptions(hw_decoder_load=0).load_for(True) == 0.0
    assert DaliOptions(hw_decoder_load=None).load_for(True) is None
    with pytest.raises(ValueError, match=r"hw_decoder_load='fast' must be a number or 'auto'"):
        DaliOptions(hw_decoder_load="fast")
    # "auto" is a share of 0 for decode_on="cpu", which uses no hardware decoder
    DaliOptions(decode_on="cpu").check(4)


def test_the_loader_resolves_the_automatic_share_before_building(tiny_root):
    """The pipelines are built with a number, never the word: on CPU operators, 0.0."""
    with make("dali", _cfg(tiny_root)) as ld:
        assert ld.options.hw_decoder_load == 0.0 and ld.hw_decoder_load == 0.0


@pytest.mark.cuda
def test_large_photos_on_a_gpu_send_half_to_the_hardware_decoder(tmp_path):
    """On a GPU with the hardware decoder the default share on large photos is 0.5; on the
    default-sized images it stays 0.0 (NOTE [large photos])."""
    from pipelines.device import HW_JPEG_DECODERS

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    hw = torch.cuda.get_device_capability() in HW_JPEG_DECODERS
    for name, (w, h), want in (("small", (640, 480), 0.0), ("large", (2400, 1800), 0.5 if hw else 0.0)):
        d = tmp_path / name / "c"
        d.mkdir(parents=True)
        for i in range(8):
            Image.new("RGB", (w, h), (i * 20, 0, 0)).save(d / f"{i}.jpg")
        cfg = LoaderConfig(root=str(tmp_path / name), batch_size=2, device="cuda", num_workers=2)
        with make("dali", cfg) as ld:
            assert ld.options.hw_decoder_load == want, name
            assert sum(x.shape[0] for x, _ in ld) == 8


def test_pipeline_count_does_not_change_the_draws(tiny_root):
    """The draws are made on the host per sample: one pipeline or two, the same batches."""
    outs = []
    for n in (1, 2):
        with make("dali", _cfg(tiny_root), pipelines=n) as ld:
            outs.append(torch.cat([x for x, _ in ld]))
    assert torch.equal(outs[0], outs[1])


def test_dali_large_tool_reports_each_config(tiny_root, capsys):
    """``tools.dali_large`` (docs/results/h200/large-photos-dali): one JSON line per config,
    with the pipelines that ran."""
    import json

    from tools import dali_large

    assert dali_large.main(["--data", str(tiny_root), "--device", "cpu", "--batch-size", "8",
                            "--workers", "2", "--epochs", "1",
                            "--configs", '[{}, {"pipelines": 2, "workers": 2}]']) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["pipelines"] for r in lines] == [1, 2]
    assert all(r["median"] > 0 and len(r["rates"]) == 1 for r in lines)
    assert all(r["cpu_per_s"] > 0 and r["span"][0] < r["span"][1] for r in lines)
