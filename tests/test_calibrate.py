"""The self-tuning default of DaliOptions (NOTE [calibration] in pipelines.dali.calibrate): the
tuner's decisions on a fake clock, the loader's switches between (share, pipelines) settings,
and the hints sized from the data."""
import gc
import weakref
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from utils import make

from pipelines import AugmentSpec, LoaderConfig
from pipelines.dali.calibrate import (
    DRIFT,
    GRID,
    JUMP,
    MARGIN,
    MIN_WINDOW,
    WINDOW,
    CalibrationCache,
    Calibrator,
    Setting,
    cache_key,
    grid,
)

A, B, C = Setting(0.0, 1), Setting(1.0, 2), Setting(0.0, 2)  # the rule's default first


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
        """``ticks`` batches; the settings the calibrator switched to, in order."""
        switches = []
        for _ in range(ticks):
            self.t += self.periods[self.calib.setting]
            new = self.calib.tick()
            if new is not None:
                switches.append(new)
        return switches


def _calibrator(periods, cache=None, lag=0, key="k"):
    clock = Clock(periods, lag)
    c = Calibrator(settle=2, timer=clock, cache=cache or CalibrationCache(None), key=key,
                   window=4, candidates=tuple(periods))
    clock.calib = c
    return c, clock


def test_the_grid_holds_the_rows_that_win_and_a_pinned_axis_stays():
    """The candidates start at the rule's default and hold the rows that were fastest in
    some use (share 0 on one pipeline, 0.65 and 1 on two); a held share tries one to three
    pipelines; a pinned share or count keeps its value; counts are capped by the threads."""
    assert GRID == (A, Setting(0.65, 2), B)
    assert grid(A, loads=True, lanes=True, max_lanes=14) == GRID
    first = Setting(0.5, 4)  # large photos' rule
    assert grid(first, loads=True, lanes=True, max_lanes=14) == (first, *GRID)
    assert grid(A, loads=False, lanes=True, max_lanes=14) == (A, C, Setting(0.0, 3))
    assert grid(Setting(1.0, 2), loads=True, lanes=False, max_lanes=14) == tuple(
        Setting(x, 2) for x in (1.0, 0.0, 0.65))
    assert grid(A, loads=False, lanes=False, max_lanes=14) == (A,)  # both pinned: no tuning
    assert {s.pipelines for s in grid(A, loads=True, lanes=True, max_lanes=2)} == {1, 2}


@pytest.mark.parametrize("lag", [0, 3])
def test_a_training_use_keeps_the_first_setting_and_a_loader_bound_one_switches(lag):
    c, clock = _calibrator({A: 0.060, B: 0.066, C: 0.061}, lag=lag)
    assert c.setting == A  # the rule's default first
    assert clock.run(60) == [B, C, A]  # tried each, went back
    (d,) = c.decisions
    assert d.setting == A and d.how == "measured"
    assert d.periods_ms == {"hw 0 x1": pytest.approx(60.0), "hw 1 x2": pytest.approx(66.0),
                            "hw 0 x2": pytest.approx(61.0)}
    assert d.describe().startswith("hw 0 x1 (measured; ms per batch hw 0 x1: 60.0")
    c, clock = _calibrator({A: 0.020, B: 0.015, C: 0.018}, lag=lag)
    assert clock.run(60) == [B, C, B]  # tried both, kept the fastest
    assert c.setting == B and c.decisions[0].setting == B


def test_a_near_tie_keeps_the_first_setting():
    faster = 1.0 - MARGIN / 2
    c, clock = _calibrator({A: 0.050, B: 0.050 * faster, C: 0.051})
    clock.run(60)
    assert c.setting == A and c.decisions[0].setting == A


def test_one_candidate_never_switches():
    c, clock = _calibrator({A: 0.050})
    assert clock.run(60) == [] and c.decisions == []


def test_a_change_of_pace_decides_again_and_a_steady_one_does_not():
    c, clock = _calibrator({A: 0.020, B: 0.015})  # loader-bound: B
    clock.run(60)
    assert c.setting == B and len(c.decisions) == 1
    clock.periods = {A: 0.020 * (1 + DRIFT / 2), B: 0.015 * (1 + DRIFT / 2)}
    assert clock.run(60) == [] and len(c.decisions) == 1  # within DRIFT: the same use
    clock.periods = {A: 0.060, B: 0.066}  # a model step now: training
    assert clock.run(60) == [A] and c.setting == A  # measured B first, then A won
    assert [d.setting for d in c.decisions] == [B, A]


def _ticks_to_first_switch(clock, limit=60):
    for n in range(1, limit + 1):
        clock.t += clock.periods[clock.calib.setting]
        if clock.calib.tick() is not None:
            return n
    return None


def test_a_jump_in_pace_is_a_new_use_after_one_watched_window():
    """From a loader-bound use to training: a window JUMP times off the pace is a new use at
    once; a smaller change still needs STRIKES windows in a row."""
    gaps = {}
    for factor in (1.5, 2 * JUMP):
        c, clock = _calibrator({A: 0.020, B: 0.015})  # loader-bound: B
        clock.run(60)
        assert c.setting == B and len(c.decisions) == 1
        clock.periods = {k: v * factor for k, v in clock.periods.items()}
        gaps[factor] = _ticks_to_first_switch(clock)
    # watched windows are window // 2 = 2 batches: the jump switches at the end of the first,
    # the smaller change at the end of the second (a window starts one batch after the last)
    assert gaps[2 * JUMP] is not None and gaps[2 * JUMP] <= 2
    assert gaps[1.5] == gaps[2 * JUMP] + 3


def test_short_epochs_get_a_window_that_fits_and_a_window_ending_an_epoch_counts():
    """Epochs too short for settle + WINDOW batches get a window that fits, and a window that
    closes on an epoch's last batch keeps its result across the epoch start, though a CUDA
    event gives it only some batches later."""
    from pipelines.dali.calibrate import window_for

    assert window_for(1000, 4) == WINDOW and window_for(16, 4) == 11
    assert window_for(5, 4) == MIN_WINDOW  # too short to decide: never completes a window
    epoch, settle = 10, 2
    for lag in (0, 3):
        clock = Clock({A: 0.020, B: 0.015}, lag)
        c = clock.calib = Calibrator(settle=settle, timer=clock, candidates=(A, B),
                                     window=window_for(epoch, settle))
        switches = []
        for _e in range(6):
            c.restart()  # the loader restarts the calibrator at every epoch start
            switches += clock.run(epoch)
        assert switches == [B] and c.decisions[0].setting == B, lag


def test_the_cache_gives_a_known_use_its_choice_without_a_trial(tmp_path):
    cache = CalibrationCache(tmp_path / "c.json")
    c, clock = _calibrator({A: 0.020, B: 0.015, C: 0.018}, cache=cache)
    assert clock.run(60) == [B, C, B]
    again, clock = _calibrator({A: 0.021, B: 0.015, C: 0.018}, cache=cache)
    assert clock.run(60) == [B]  # one switch, straight to the cached choice
    assert again.decisions[0].how == "cached" and again.decisions[0].setting == B
    other, clock = _calibrator({A: 0.021, B: 0.015, C: 0.018}, cache=cache, key="another")
    clock.run(60)
    assert other.decisions[0].how == "measured"  # another key: tried afresh
    slow, clock = _calibrator({A: 0.060, B: 0.066, C: 0.061}, cache=cache)  # another band
    assert clock.run(60) == [B, C, A] and slow.decisions[0].how == "measured"
    (tmp_path / "c.json").write_text("{not json")
    broken, clock = _calibrator({A: 0.020, B: 0.015, C: 0.018}, cache=cache)
    clock.run(60)
    assert broken.decisions[0].how == "measured"  # an unreadable cache costs a trial
    assert cache_key("gpu", 1) != cache_key("gpu", 2) and len(cache_key("x")) == 32


def test_cache_is_off_by_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GPU_FEED_CALIBRATION_CACHE", "off")
    assert CalibrationCache.default().path is None
    monkeypatch.setenv("GPU_FEED_CALIBRATION_CACHE", str(tmp_path / "x.json"))
    assert CalibrationCache.default().path == tmp_path / "x.json"


def _cfg(root, **kw):
    base = dict(root=root, batch_size=2, device="cpu", num_workers=3, debug_indices=True,
                augment=AugmentSpec(size=32))  # train: random crops and flips
    base.update(kw)
    return LoaderConfig(**base)


def _epochs(ld, clock=None, epochs=2, stop=None):
    """Per epoch: the images, labels and indices the loader yields (``stop``: the number of
    batches after which the last epoch is left)."""
    out = []
    for e in range(epochs):
        ld.set_epoch(e)
        xs, ys = [], []
        for x, y in ld:
            if clock is not None:
                clock.t += clock.periods[ld.setting]
            xs.append(x.clone())
            ys.append(y.clone())
            if stop is not None and e == epochs - 1 and len(xs) == stop:
                break
        idx = ld.last_indices  # None after a break
        out.append((torch.cat(xs), torch.cat(ys), None if idx is None else idx.tolist()))
    return out


# every switch of these: 1 -> 2 -> 3 pipelines, with shares the CPU operators ignore
FORCED = {Setting(0.0, 1): 0.050, Setting(1.0, 2): 0.030, Setting(0.5, 3): 0.040}


def _forced(ld, background=False):
    clock = Clock(FORCED)
    clock.calib = Calibrator(settle=1, timer=clock, window=2, candidates=tuple(FORCED))
    ld.tune_with(clock.calib, background=background)
    return clock


class Pipes:
    """Every DALI pipeline the loader module builds, by weak reference: ``live()`` counts
    those not yet released."""

    def __init__(self, monkeypatch):
        from pipelines.dali import loader

        self.refs, real = [], loader.build_pipeline

        def build(*a, **kw):
            pipe = real(*a, **kw)
            self.refs.append(weakref.ref(pipe))
            return pipe

        monkeypatch.setattr(loader, "build_pipeline", build)

    def live(self, collect=True) -> int:
        if collect:
            gc.collect()
        return sum(r() is not None for r in self.refs)


@pytest.mark.dali
def test_tuning_is_off_on_cpu_operators_and_the_loader_says_so(tiny_root):
    with make("dali", _cfg(tiny_root)) as ld:
        assert ld.calibrator is None and ld.tuning.startswith("off: DALI's CPU operators")
        assert ld.setting == Setting(0.0, 1) and ld.decoder == "DALI CPU"
        assert ld.asked.hw_decoder_load == "auto" and ld.asked.pipelines is None


@pytest.mark.dali
def test_forced_switches_change_no_batch(tiny_root):
    """Switches between pipeline counts (1, 2, 3) mid-epoch, forced by a fake clock: every
    epoch's indices, labels and pixels (random crops and flips) are those of a loader that
    never switched; each switch builds its setting's pipelines then (none up front)."""
    cfg = _cfg(tiny_root)
    with make("dali", cfg, pipelines=1, hw_decoder_load=0.0) as ld:
        assert ld.calibrator is None and ld.tuning.startswith("off")
        want = _epochs(ld, epochs=3)
    with make("dali", cfg, pipelines=1, hw_decoder_load=0.0) as ld:
        clock = _forced(ld)
        built, switched = [], []
        real_build, real_switch = ld._pipes_for, ld._switch
        ld._pipes_for = lambda s, ahead=False: (built.append(s), real_build(s, ahead))[1]
        ld._switch = lambda e: (switched.append(ld.calibrator.setting), real_switch(e))[1]
        got = _epochs(ld, clock, epochs=3)
        assert switched == [Setting(1.0, 2), Setting(0.5, 3), Setting(1.0, 2)] == built
        assert ld.setting == Setting(1.0, 2) and len(ld.pipes) == 2
        assert ld.calibrator.decisions[0].setting == Setting(1.0, 2)
    for (xa, ya, ia), (xb, yb, ib) in zip(want, got):
        assert ia == ib and sorted(ia) == list(range(37))
        assert torch.equal(ya, yb) and torch.equal(xa, xb)


@pytest.mark.dali
def test_the_default_builds_one_setting_and_keeps_only_the_chosen_one(tiny_root, monkeypatch):
    """A tuned loader builds only its first setting's pipelines; a trial holds at most the
    running setting's and the one being built (here 2 + 3), and after the decision only the
    chosen setting's are alive. With builds in the background the batches are still those of
    a loader that never switched."""
    from pipelines.dali.loader import DaliLoader

    cfg = _cfg(tiny_root)
    clock = Clock(FORCED)

    def tuned(self, config, options, candidates):
        clock.calib = Calibrator(settle=1, timer=clock, window=2, candidates=candidates)
        return clock.calib

    monkeypatch.setattr(DaliLoader, "_settings", lambda self, config, options: (
        Setting(0.0, 1), tuple(FORCED), "on: forced"))
    monkeypatch.setattr(DaliLoader, "_calibrator", tuned)
    pipes = Pipes(monkeypatch)
    with make("dali", cfg) as ld:  # the default: tuned
        assert ld.calibrator is clock.calib and pipes.live() == 1 == len(pipes.refs)
        peak, got = 0, []
        for e in range(8):
            ld.set_epoch(e)
            xs, ys = [], []
            for x, y in ld:
                clock.t += clock.periods[ld.setting]
                xs.append(x.clone())
                ys.append(y.clone())
                peak = max(peak, pipes.live(collect=False))  # the loader collects cycles
            got.append((torch.cat(xs), torch.cat(ys), ld.last_indices.tolist()))
            if ld.calibrator.decisions and ld._ahead is None:
                break
        assert ld.calibrator.decisions[0].setting == Setting(1.0, 2) == ld.setting
        assert pipes.live() == 2 == len(ld.pipes) and peak <= 5 and len(pipes.refs) == 8
    assert pipes.live() == 0  # closed: every pipeline released
    monkeypatch.undo()
    with make("dali", cfg, pipelines=1, hw_decoder_load=0.0) as ld:
        want = _epochs(ld, epochs=len(got))
    for (xa, ya, ia), (xb, yb, ib) in zip(want, got, strict=True):
        assert ia == ib and torch.equal(ya, yb) and torch.equal(xa, xb)


@pytest.mark.dali
@pytest.mark.parametrize("k, now", [(6, Setting(1.0, 2)), (10, Setting(0.5, 3))])
def test_a_state_saved_after_a_switch_resumes_exactly(tiny_root, k, now):
    """A state saved after ``k`` batches of a tuned epoch whose switches happened before (6:
    one switch, to 2 pipelines; 10: two, to 3) resumes in a loader at another setting with the
    rest of the unswitched epoch: the same indices, labels and pixels."""
    cfg = _cfg(tiny_root)
    with make("dali", cfg, pipelines=1, hw_decoder_load=0.0) as ld:
        (x, y, idx), = _epochs(ld, epochs=1)
    with make("dali", cfg, pipelines=1, hw_decoder_load=0.0) as ld:
        clock = _forced(ld)
        _epochs(ld, clock, epochs=1, stop=k)
        assert ld.setting == now  # switched before the state was saved
        state = ld.state_dict()
    with make("dali", cfg, pipelines=2, hw_decoder_load=0.0) as b:
        b.load_state_dict(state)
        xs, ys = zip(*[(xb.clone(), yb.clone()) for xb, yb in b])
        assert b.last_indices.tolist() == idx[k * 2:]
    assert torch.equal(torch.cat(ys), y[k * 2:]) and torch.equal(torch.cat(xs), x[k * 2:])


class _FakeGpu(SimpleNamespace):
    def __len__(self):
        return 100  # batches per epoch


@pytest.mark.dali
@pytest.mark.parametrize("cc, options, want", [
    ((9, 0), {}, None),  # the default: the rules' setting, not tuned
    ((9, 0), {"hw_decoder_load": 1.0}, None),
    ((9, 0), {"pipelines": 2}, None),
    ((9, 0), {"decode_on": "cpu"}, None),
    ((8, 6), {}, None),
    ((9, 0), {"hw_decoder_load": None}, GRID),
    ((9, 0), {"hw_decoder_load": None, "pipelines": 2}, tuple(Setting(x, 2) for x in (0.0, 0.65, 1.0))),
    ((8, 6), {"hw_decoder_load": None}, tuple(Setting(0.0, n) for n in (1, 2, 3))),  # no hw decoder
])
def test_hw_decoder_load_none_tunes_on_a_gpu_and_the_default_does_not(monkeypatch, tiny_root, cc,
                                                                      options, want):
    """``hw_decoder_load=None`` tunes the share (where a hardware decoder runs) and the count,
    a number for ``pipelines`` pinning its axis; the default (``"auto"``) and any number run
    the rules' setting untuned."""
    from pipelines.dali import loader
    from pipelines.dali.loader import DaliLoader
    from pipelines.options import DaliOptions

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: cc)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "a GPU")
    monkeypatch.setattr(loader, "large_photos", lambda src: False)
    monkeypatch.setattr(loader, "conditional", lambda plan: False)
    fake = _FakeGpu(gpu=True, device_id=0, device=torch.device("cpu"), paths=["a", "b"],
                    transform_plan="r", data_source=None, plan_dali=None)
    cfg = _cfg(tiny_root, num_workers=14)
    opts = DaliOptions(**options)
    first, candidates, why = DaliLoader._settings(fake, cfg, opts)
    cal = DaliLoader._calibrator(fake, cfg, opts, candidates)
    if want is None:
        assert cal is None and candidates == (first,) and why.startswith("off")
        return
    assert candidates == want and first == want[0] and why.startswith("on")
    assert cal is not None and cal.setting == first and len(cal.key) == 32


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
def test_gpu_tuning_decides_and_keeps_every_sample(gpu_root, tmp_path, monkeypatch):
    """On the GPU (CUDA-event windows) a loader asked to tune decides within four epochs
    of 64 batches, caches the decision, and every epoch still holds every sample once."""
    monkeypatch.setenv("GPU_FEED_CALIBRATION_CACHE", str(tmp_path / "c.json"))
    cfg = LoaderConfig(root=gpu_root, batch_size=8, device="cuda", num_workers=4,
                       debug_indices=True)
    busy = torch.randn(2048, 2048, device="cuda")
    with make("dali", cfg, hw_decoder_load=None, preallocate_width_hint=None,
              preallocate_height_hint=None) as ld:
        assert ld.calibrator is not None and ld.options.preallocate_width_hint > 0
        assert ld.tuning.startswith("on") and len(ld.calibrator.candidates) > 2
        for epoch in range(4):
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
        chosen = ld.calibrator.decisions[-1].setting  # running, or built in the background
        ahead = ld._ahead  # to run from the first batch after its build (H200: it may lag)
        assert ld.setting == chosen or (ahead is not None and ahead[0] == chosen)
    assert (tmp_path / "c.json").exists()


def test_the_summary_and_results_json_keep_the_tuners_decisions(tmp_path):
    """A repeat's decisions (``Repeat.calibration``) survive results.json and the summary's
    window line names the last one of each repeat: what the tuner tried and chose."""
    from compare.report import markdown
    from compare.results import Repeat, SuiteResult, VariantResult
    from pipelines.dali.calibrate import Decision

    d = (Decision(Setting(0.65, 2), {"hw 0 x1": 34.8, "hw 0.65 x2": 12.2}, "measured").describe(),
         Decision(Setting(0.0, 1), {"hw 0 x1": 56.0, "hw 0.65 x2": 61.0}, "cached").describe())
    rep = Repeat(4500.0, 9000.0, 3.0, 30.0, 1.0, steps=62, window_s=3.5, decoder="nvJPEG hw 0",
                 calibration=d)
    res = SuiteResult({"gpu": "H200"}, {"model": "resnet50", "batch_size": 256, "steps": 50,
                                        "fit_queue": True}, None,
                      (VariantResult("dali calibrated", "dali", {}, 67.0, (rep,), 2),))
    res.dump(tmp_path / "results.json")
    back = SuiteResult.load(tmp_path / "results.json")
    assert back.variants[0].repeats[0].calibration == d
    md = markdown(back, details=True)
    assert ("DALI tuner's last choice per repeat: hw 0 x1 (cached; ms per batch hw 0 x1: "
            "56.0, hw 0.65 x2: 61.0) after 2 decision(s)") in md
    assert "50 timed steps (at least 4x each loader's queue: 62 here)" in md  # what ran
