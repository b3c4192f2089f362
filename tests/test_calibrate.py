"""DaliOptions.hw_decoder_load=None: the calibration's decisions (NOTE [calibration] in
pipelines.dali.calibrate), the loader's switches, and the hints sized from the data."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from utils import make

from pipelines import AugmentSpec, LoaderConfig
from pipelines.dali.calibrate import (
    CANDIDATES,
    DRIFT,
    JUMP,
    MARGIN,
    MIN_WINDOW,
    WINDOW,
    CalibrationCache,
    Calibrator,
    cache_key,
)


class Clock:
    """A host timer whose time advances by the running setting's period at each tick; with
    ``lag``, a window's end is readable only ``lag`` ticks later (as a CUDA event is)."""

    def __init__(self, periods, lag=0):
        self.periods, self.lag, self.t, self.calib = periods, lag, 0.0, None
        self.wait = 0

    def mark(self):
        self.wait = self.lag
        return self.t

    def seconds(self, a, b):
        if self.wait:
            self.wait -= 1
            return None
        return b - a

    def run(self, ticks):
        """``ticks`` batches; the loads the calibrator switched to, in order."""
        switches = []
        for _ in range(ticks):
            self.t += self.periods[self.calib.load]
            new = self.calib.tick()
            if new is not None:
                switches.append(new)
        return switches


def _calibrator(periods, cache=None, lag=0, key="k"):
    clock = Clock(periods, lag)
    c = Calibrator(settle=2, timer=clock, cache=cache or CalibrationCache(None), key=key,
                   window=4)
    clock.calib = c
    return c, clock


@pytest.mark.parametrize("lag", [0, 3])
def test_a_training_use_keeps_the_first_candidate_and_a_loader_bound_one_switches(lag):
    c, clock = _calibrator({0.0: 0.060, 1.0: 0.066}, lag=lag)
    assert c.load == CANDIDATES[0] == 0.0  # the training default first
    assert clock.run(40) == [1.0, 0.0]  # tried 1.0, went back
    (d,) = c.decisions
    assert d.load == 0.0 and d.how == "measured"
    assert d.periods_ms == {"0": pytest.approx(60.0), "1": pytest.approx(66.0)}
    c, clock = _calibrator({0.0: 0.020, 1.0: 0.015}, lag=lag)
    assert clock.run(40) == [1.0]  # tried 1.0 and kept it
    assert c.load == 1.0 and c.decisions[0].load == 1.0


def test_a_near_tie_keeps_the_first_candidate():
    faster = 1.0 - MARGIN / 2
    c, clock = _calibrator({0.0: 0.050, 1.0: 0.050 * faster})
    clock.run(40)
    assert c.load == 0.0 and c.decisions[0].load == 0.0


def test_a_change_of_pace_recalibrates_and_a_steady_one_does_not():
    c, clock = _calibrator({0.0: 0.020, 1.0: 0.015})  # loader-bound: 1.0
    clock.run(60)
    assert c.load == 1.0 and len(c.decisions) == 1
    clock.periods = {0.0: 0.020 * (1 + DRIFT / 2), 1.0: 0.015 * (1 + DRIFT / 2)}
    assert clock.run(60) == [] and len(c.decisions) == 1  # within DRIFT: the same use
    clock.periods = {0.0: 0.060, 1.0: 0.066}  # a model step now: training
    assert clock.run(60) == [0.0] and c.load == 0.0  # measured 1.0 first, then 0.0 won
    assert [d.load for d in c.decisions] == [1.0, 0.0]


def _ticks_to_first_switch(clock, limit=60):
    for n in range(1, limit + 1):
        clock.t += clock.periods[clock.calib.load]
        if clock.calib.tick() is not None:
            return n
    return None


def test_a_jump_in_pace_is_a_new_use_after_one_watched_window():
    """Regression (H200, dali-calibration): from loader-only (1.0 chosen) to training, two
    watched windows and an epoch start passed before the trial, and half the training window
    ran at the loader-only setting. A window JUMP times off the pace is a new use at once; a
    smaller change still needs STRIKES windows in a row."""
    gaps = {}
    for factor in (1.5, 2 * JUMP):
        c, clock = _calibrator({0.0: 0.020, 1.0: 0.015})  # loader-bound: 1.0
        clock.run(60)
        assert c.load == 1.0 and len(c.decisions) == 1
        clock.periods = {k: v * factor for k, v in clock.periods.items()}
        gaps[factor] = _ticks_to_first_switch(clock)
    # watched windows are window // 2 = 2 batches: the jump switches at the end of the first,
    # the smaller change at the end of the second (a window starts one batch after the last)
    assert gaps[2 * JUMP] is not None and gaps[2 * JUMP] <= 2
    assert gaps[1.5] == gaps[2 * JUMP] + 3


def test_short_epochs_get_a_window_that_fits_and_a_window_ending_an_epoch_counts():
    """Regression (H200, large-photos): epochs of 16 batches never held a settle + 16-batch
    window, so the calibrated row never decided. The window now fits the epoch, and a window
    that closes on an epoch's last batch keeps its result across the epoch start, though a
    CUDA event gives it only some batches later."""
    from pipelines.dali.calibrate import window_for

    assert window_for(1000, 4) == WINDOW and window_for(16, 4) == 11
    assert window_for(5, 4) == MIN_WINDOW  # too short to decide: never completes a window
    epoch, settle = 10, 2
    for lag in (0, 3):
        clock = Clock({0.0: 0.020, 1.0: 0.015}, lag)
        c = clock.calib = Calibrator(settle=settle, timer=clock, window=window_for(epoch, settle))
        switches = []
        for _e in range(6):
            c.restart()  # the loader restarts the calibrator at every epoch start
            switches += clock.run(epoch)
        assert switches == [1.0] and c.decisions[0].load == 1.0, lag


def test_the_cache_gives_a_known_use_its_choice_without_calibrating(tmp_path):
    cache = CalibrationCache(tmp_path / "c.json")
    c, clock = _calibrator({0.0: 0.020, 1.0: 0.015}, cache=cache)
    assert clock.run(40) == [1.0]
    again, clock = _calibrator({0.0: 0.021, 1.0: 0.015}, cache=cache)
    assert clock.run(40) == [1.0]  # one switch, straight to the cached choice
    assert again.decisions[0].how == "cached" and again.decisions[0].load == 1.0
    other, clock = _calibrator({0.0: 0.021, 1.0: 0.015}, cache=cache, key="another")
    clock.run(40)
    assert other.decisions[0].how == "measured"  # another key: calibrated afresh
    slow, clock = _calibrator({0.0: 0.060, 1.0: 0.066}, cache=cache)
    assert clock.run(40) == [1.0, 0.0] and slow.decisions[0].how == "measured"
    (tmp_path / "c.json").write_text("{not json")
    broken, clock = _calibrator({0.0: 0.020, 1.0: 0.015}, cache=cache)
    clock.run(40)
    assert broken.decisions[0].how == "measured"  # an unreadable cache costs a calibration
    assert cache_key("gpu", 1) != cache_key("gpu", 2) and len(cache_key("x")) == 32


def test_cache_is_off_by_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GPU_FEED_CALIBRATION_CACHE", "off")
    assert CalibrationCache.default().path is None
    monkeypatch.setenv("GPU_FEED_CALIBRATION_CACHE", str(tmp_path / "x.json"))
    assert CalibrationCache.default().path == tmp_path / "x.json"


def _cfg(root, **kw):
    base = dict(root=root, batch_size=2, device="cpu", num_workers=2, debug_indices=True,
                augment=AugmentSpec(mode="eval", size=32, resize_size=40))
    base.update(kw)
    return LoaderConfig(**base)


@pytest.mark.dali
@pytest.mark.parametrize("pipes", [1, 2])
@pytest.mark.parametrize("periods, loads", [({0.0: 0.020, 1.0: 0.015}, [1.0]),
                                            ({0.0: 0.060, 1.0: 0.066}, [1.0, 0.0])])
def test_loader_switches_mid_epoch_without_losing_or_repeating_a_sample(tiny_root, pipes,
                                                                        periods, loads):
    """Each switch drains the running pipelines and hands the lanes, from the first batch not
    yet handed out, to the other setting's: the epoch's samples, order and (deterministic
    eval) pixels are those of a run that never switched, and a switch back reuses the first
    pipelines instead of building new ones."""
    with make("dali", _cfg(tiny_root), pipelines=pipes, hw_decoder_load=None) as ld:
        assert ld.calibrator is None and ld.hw_decoder_load == 0.0  # CPU operators: no need
        assert ld.decoder == "DALI CPU"
        want = [(torch.cat([x for x, _ in ld]), ld.last_indices.tolist()) for _ in range(2)]
    with make("dali", _cfg(tiny_root), pipelines=pipes) as ld:
        clock = Clock(periods)
        ld.calibrator = clock.calib = Calibrator(settle=1, timer=clock, window=2)
        first = ld.pipes
        built, switched = [], []
        real, real_switch = ld._pipes_for, ld._switch
        ld._pipes_for = lambda load, *a: (built.append(load), real(load, *a))[1]
        ld._switch = lambda old, e: (switched.append(ld.hw_decoder_load), real_switch(old, e))[1]
        ld._spares()  # as a calibrated loader on a GPU builds them: primed with one batch
        assert built == [1.0] and list(ld._spare) == [1.0]
        got = []
        for _ in range(2):
            xs = []
            for x, _ in ld:
                clock.t += clock.periods[ld.hw_decoder_load]
                xs.append(x)
            got.append((torch.cat(xs), ld.last_indices.tolist()))
        assert switched == loads and ld.hw_decoder_load == loads[-1]
        assert built == [1.0]  # no pipeline was built for a switch
        assert ld.calibrator.decisions[0].load == loads[-1]
        assert (ld.pipes is first) == (loads[-1] == 0.0)
    for (xa, ia), (xb, ib) in zip(want, got):
        assert ia == ib and sorted(ia) == list(range(37))
        assert torch.equal(xa, xb)


def test_hints_are_the_largest_image_when_the_hardware_decoder_may_run(tmp_path):
    from pipelines.dali.loader import DaliLoader
    from pipelines.options import DaliOptions
    from pipelines.sources.root import Source, SourceKind

    names = []
    for i, (w, h) in enumerate([(300, 200), (200, 400), (350, 100)] * 3):
        names.append(str(tmp_path / f"{i}.jpg"))
        Image.new("RGB", (w, h)).save(names[-1], "JPEG")
    src = Source(SourceKind.FOLDER, names, np.zeros(len(names), np.int64), ["c"], None)
    gpu = SimpleNamespace(gpu=True, data_source=src)
    auto = dict(preallocate_width_hint=None, preallocate_height_hint=None)
    default = DaliLoader._sized(gpu, DaliOptions())  # the default: no hints
    assert (default.preallocate_width_hint, default.preallocate_height_hint) == (0, 0)
    sized = DaliLoader._sized(gpu, DaliOptions(hw_decoder_load=None, **auto))  # calibrated
    assert (sized.preallocate_width_hint, sized.preallocate_height_hint) == (200, 400)
    half = DaliLoader._sized(gpu, DaliOptions(hw_decoder_load=0.5, **auto))
    assert half.preallocate_height_hint == 400
    none = DaliLoader._sized(gpu, DaliOptions(hw_decoder_load=0.0, **auto))
    assert (none.preallocate_width_hint, none.preallocate_height_hint) == (0, 0)
    cpu = DaliLoader._sized(SimpleNamespace(gpu=False, data_source=src),
                            DaliOptions(hw_decoder_load=None, **auto))
    assert (cpu.preallocate_width_hint, cpu.preallocate_height_hint) == (0, 0)
    given = DaliLoader._sized(gpu, DaliOptions(hw_decoder_load=1.0, preallocate_width_hint=64,
                                               preallocate_height_hint=None))
    assert (given.preallocate_width_hint, given.preallocate_height_hint) == (64, 400)


@pytest.mark.cuda
@pytest.mark.dali
def test_gpu_calibration_decides_and_keeps_every_sample(gpu_root, tmp_path, monkeypatch):
    """On the GPU (CUDA-event windows) a calibrated loader decides within two epochs of 32
    batches, caches the decision, and every epoch still holds every sample once."""
    monkeypatch.setenv("GPU_FEED_CALIBRATION_CACHE", str(tmp_path / "c.json"))
    cfg = LoaderConfig(root=gpu_root, batch_size=16, device="cuda", num_workers=4,
                       debug_indices=True)
    busy = torch.randn(2048, 2048, device="cuda")
    with make("dali", cfg, hw_decoder_load=None, preallocate_width_hint=None,
              preallocate_height_hint=None) as ld:
        assert ld.calibrator is not None and ld.options.preallocate_width_hint > 0
        for epoch in range(3):
            ld.set_epoch(epoch)
            kept, sums = [], []
            for x, _ in ld:
                for _ in range(4):  # a consumer with work of its own
                    busy = (busy @ busy).clamp_(-1, 1)
                kept.append(x)  # held across the switches' rebuilds
                sums.append(x.float().sum())
            assert sorted(ld.last_indices.tolist()) == list(range(512))
            later = torch.stack([x.float().sum() for x in kept])
            assert torch.equal(torch.stack(sums), later)  # no batch was overwritten
        print("decisions:", [d.describe() for d in ld.calibrator.decisions])
        assert ld.calibrator.decisions and ld.calibrator.decisions[0].how == "measured"
        assert "calibrated" in ld.decoder
    assert (tmp_path / "c.json").exists()


@pytest.mark.dali
@pytest.mark.parametrize("cc, calibrates", [((9, 0), True), ((8, 6), False)])
def test_only_a_gpu_with_the_hardware_decoder_calibrates(monkeypatch, tiny_root, cc, calibrates):
    """``hw_decoder_load=None`` on a GPU without NVJPG engines (an RTX A6000, 8.6) has nothing
    to choose, so it runs without a calibrator; an H200 (9.0) gets one, keyed by the GPU."""
    from pipelines.dali.loader import DaliLoader
    from pipelines.options import DaliOptions

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: cc)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "a GPU")
    fake = SimpleNamespace(gpu=True, device_id=0, device=torch.device("cpu"),
                           paths=["a", "b"], transform_plan="r")
    cfg = _cfg(tiny_root)
    cal = DaliLoader._calibrator(fake, cfg, DaliOptions(hw_decoder_load=None, pipelines=1))
    assert (cal is not None) == calibrates
    if cal is not None:
        assert cal.load == 0.0 and len(cal.key) == 32
    assert DaliLoader._calibrator(fake, cfg, DaliOptions(hw_decoder_load=1.0)) is None


def test_the_summary_and_results_json_keep_the_calibrations_decisions(tmp_path):
    """A repeat's decisions (``Repeat.calibration``) survive results.json and the summary's
    window line names the last one of each repeat."""
    from compare.report import markdown
    from compare.results import Repeat, SuiteResult, VariantResult

    d = ("hw_decoder_load 1 (measured; ms per batch 0: 34.8, 1: 12.2)",
         "hw_decoder_load 0 (cached; ms per batch 0: 56.0, 1: 61.0)")
    rep = Repeat(4500.0, 9000.0, 3.0, 30.0, 1.0, steps=62, window_s=3.5, decoder="nvJPEG hw 0 "
                 "calibrated", calibration=d)
    res = SuiteResult({"gpu": "H200"}, {"model": "resnet50", "batch_size": 256, "steps": 50,
                                        "fit_queue": True}, None,
                      (VariantResult("dali calibrated", "dali", {}, 67.0, (rep,), 2),))
    res.dump(tmp_path / "results.json")
    back = SuiteResult.load(tmp_path / "results.json")
    assert back.variants[0].repeats[0].calibration == d
    md = markdown(back, details=True)
    assert ("calibration's last choice per repeat: hw_decoder_load 0 (cached; ms per batch 0: "
            "56.0, 1: 61.0) after 2 decision(s)") in md
    assert "50 timed steps (at least 4x each loader's queue: 62 here)" in md  # what ran
