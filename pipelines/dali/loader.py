"""``DaliLoader``: the DALI graph behind the common ``BatchLoader`` contract.

DALI specifics (``DALIGenericIterator``'s ``List[Dict]``, its last-batch handling) stay here; the
caller only sees ``Batch``. The last-batch policy is applied by the shared plan (full batches,
a short last batch under PARTIAL, wrapped padding under PAD), so DALI itself always runs with
``LastBatchPolicy.PARTIAL`` and stops when the source raises ``StopIteration``. With
``DaliOptions.pipelines = n`` there are n pipelines and n iterators, fed by the source's lanes (every
n-th batch each) and read round-robin, which yields the plan's order.

NOTE [recovery]
A file can pass the byte check and still fail in DALI's decoder (or vanish after it was
checked). DALI then raises from ``next()`` with a message that names neither the file nor the
batch, and the pipeline that raised cannot be trusted again. The loader then:

1. takes the files of every batch that was fed but not yet yielded (``PlanSource.in_flight``):
   the failing file is among them;
2. decodes them again with a ``DecodeProbe`` (same device and decoder, groups halved around each
   failure) and records each failing file as bad in the source (``PlanSource.mark_bad``);
3. rebuilds the pipelines and restarts each lane at its first position not yet yielded.

The bad file is then handled like any other: replaced and counted under ``skip``, one
``BadFileError`` naming it at its batch under ``error``. If no single file fails alone, the
original DALI error is re-raised.

NOTE [resume]
The graph draws nothing itself: every random number arrives with its sample, made on the host
from ``(seed, epoch, index)`` (``pipelines.transforms.draws`` NOTE [one plan]). So a state is the
position only, as on every backend: a resumed, rebuilt, recovered or recalibrated loader, any
pipeline count or hardware-decoder share, and any rank of the job draws what an
uninterrupted loader draws for the same sample.

An epoch that ends early (``break``, an exception) leaves the pipelines with at most
``queue_depth`` batches in flight; the next ``iter()`` stops the source and drains only those
(or rebuilds, after a failure), so it always starts clean.

NOTE [running on]
With ``DaliOptions.run_on`` (the default) the pipelines do not stop at the end of an epoch: each
lane goes on with the next epoch's batches (``pipelines.dali.source`` NOTE [running on]), so the
first batches of the next epoch are made while the consumer finishes this one, and the next
``iter()`` finds them ready. Without it every epoch starts with empty pipelines, and its first
batch waits for a whole batch's read, decode and augmentation: at short epochs (large photos,
many ranks) that wait is in a large share of the steps. The next epoch is guessed: the one after
this, or this one again when the consumer repeated its last epoch (no ``set_epoch``). An
``iter()`` of another epoch, a resumed position, a recovery, a calibration switch, or an epoch
whose size was set after its first batches were fed (``pipelines.resolution`` NOTE [sizes
ahead]) drops what was made ahead (drained, as after an early end) and starts afresh. In an
epoch the loader asks a lane for a batch only while the lane's oldest batch not yet yielded is
of this epoch, so a batch of the next one is never yielded early. When the guess is right, the
random draws follow the batches in the same order as without running on: the same crops, and
resumption (NOTE [resume]) stays exact: the draws are keyed by the sample, not by what ran
before.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import cast

import torch
from nvidia.dali.plugin.base_iterator import LastBatchPolicy as DaliPolicy
from nvidia.dali.plugin.pytorch import DALIGenericIterator

from pipelines.config import LoaderConfig, OutputDType
from pipelines.dali.calibrate import (
    CalibrationCache,
    Calibrator,
    EventTimer,
    Setting,
    cache_key,
    grid,
    window_for,
)
from pipelines.dali.graph import OUTPUTS, build_pipeline, conditional, decodes_on_gpu
from pipelines.dali.probe import DecodeProbe
from pipelines.dali.source import Lane, PlanSource
from pipelines.device import HW_JPEG_DECODERS, resolve_device
from pipelines.epoch_plan import MAX_EPOCH, config_len
from pipelines.loader import LoaderBase
from pipelines.options import DaliOptions
from pipelines.sources.root import header_sizes, median_megapixels
from pipelines.types import Batch

# NOTE [large photos]
# On photos of several megapixels one pipeline's nvJPEG decoder falls far behind what the GPU
# and the cores can do, and more pipelines side by side raised the loader's rate up to four
# (docs/results/h200/large-photos-dali). So when nvJPEG decodes a dataset whose median image
# (from the headers ``header_sizes`` samples) has at least ``LARGE_PHOTOS_MP`` megapixels, the
# rule for ``DaliOptions.pipelines`` (where the tuner starts: ``pipelines.dali.calibrate`` NOTE
# [calibration]) is ``LARGE_PHOTO_LANES``, fewer when an epoch has fewer than ``LANE_BATCHES``
# batches for each: the pipelines take every n-th batch, and short epochs ran fastest on fewer.
# The size threshold lies between the default dataset's images, where one pipeline stays the
# rule for training, and the measured sets; sizes in between were not measured. On a GPU with
# the hardware decoder, the rule for ``DaliOptions.hw_decoder_load`` there is
# ``LARGE_PHOTO_HW_LOAD``, which was faster than 0.0 on such photos loader-only and in
# training. The rules depend only on the files, the GPU and the epoch's length.
LARGE_PHOTOS_MP = 2.0


def large_photos(source) -> bool:
    """Whether ``source``'s median image (by ``header_sizes``) has ``LARGE_PHOTOS_MP`` or more
    megapixels (NOTE [large photos])."""
    mp = median_megapixels(source)
    return mp is not None and mp >= LARGE_PHOTOS_MP


class DaliLoader(LoaderBase):
    """Decode and augment with DALI (GPU when the config's device is CUDA, CPU operators otherwise)."""

    options: DaliOptions  # LoaderBase.options, narrowed

    def __init__(self, config: LoaderConfig, options: DaliOptions):
        options.check(cast(int, config.num_workers))  # set by LoaderConfig
        super().__init__(config, options)
        config = self.config  # resolved: rank, world size, cuda:LOCAL_RANK
        self.device = resolve_device(config, "dali")
        self.gpu = self.device.type == "cuda"
        self.device_id = (self.device.index if self.device.index is not None
                          else torch.cuda.current_device()) if self.gpu else None
        self.plan_dali = self.transform_plan.dali_plan()  # UnsupportedTransformError here, at build
        options = self._sized(options)
        first, candidates, self.tuning = self._settings(config, options)
        self.asked = options  # what the caller asked (``self.options``: the running setting)
        options = self.options = options.replace(hw_decoder_load=first.load,
                                                 pipelines=first.pipelines)
        depth = options.queue_depth
        self.calibrator = self._calibrator(config, options, candidates)  # NOTE [calibration]
        self.source = PlanSource(self.paths, self.labels, self.plan_of,
                                 readahead=depth + 1,
                                 threads=options.threads(cast(int, config.num_workers)),
                                 keep_alive=depth + 2, max_pixels=config.max_image_pixels,
                                 lanes=cast(int, options.pipelines),
                                 read=None if self.data_source.by_path
                                 else self.data_source.read,
                                 size_of=functools.partial(_fed_size, self._sizes))
        self.pipes: list = []
        self._its: list[DALIGenericIterator] | None = None
        # NOTE [calibration]: the setting the tuner moves to, its pipelines and lanes, and
        # the background build (and warm-up) of its iterators; only the running set otherwise
        self._ahead: tuple[Setting, list, list[Lane], Future] | None = None
        self._builder: ThreadPoolExecutor | None = None
        self.background = True  # build ahead in a thread (``tune_with`` may turn it off)
        with self._on_device():
            self._build()
        self._probe: DecodeProbe | None = None
        self._in_epoch = False  # the pipelines may hold batches: drain before a fresh start
        self._last_epoch: int | None = None  # the epoch the last iter() read
        self._broken = False
        self.recoveries = 0

    def _on_device(self):
        """Make this loader's GPU current while DALI builds or runs: its iterator places
        outputs by the current device, so without this rank 1 of a job that never called
        ``torch.cuda.set_device`` would get its batches on ``cuda:0``."""
        return torch.cuda.device(self.device_id) if self.gpu else contextlib.nullcontext()

    def _sized(self, options: DaliOptions) -> DaliOptions:
        """``options`` with the hardware decoder's preallocation hints resolved: unset, they
        are the largest image (by area) among the headers ``header_sizes`` samples, when the
        hardware decoder may run (a GPU and ``hw_decoder_load`` not 0: tuned, or a share),
        else 0 (none)."""
        w, h = options.preallocate_width_hint, options.preallocate_height_hint
        if w is not None and h is not None:
            return options
        sizes = (header_sizes(self.data_source)
                 if self.gpu and options.hw_decoder_load != 0.0 else [])
        big = max(sizes, key=lambda s: s[0] * s[1], default=(0, 0))
        return options.replace(preallocate_width_hint=big[0] if w is None else w,
                               preallocate_height_hint=big[1] if h is None else h)

    def _settings(self, config: LoaderConfig,
                  options: DaliOptions) -> tuple[Setting, tuple[Setting, ...], str]:
        """The setting the loader starts at, the tuner's candidates and why it tunes or not
        (NOTE [calibration]). The start is the rules' default (``DaliOptions.load_for``,
        ``lanes_for``; NOTE [large photos]) for an axis left unset, the value for a pinned one.
        The share is tuned where the hardware decoder runs (nvJPEG on a GPU that has one),
        the pipeline count on any GPU; on CPU operators nothing is."""
        workers = cast(int, config.num_workers)
        mixed = decodes_on_gpu(options, self.gpu)
        hw_gpu = self.gpu and torch.cuda.get_device_capability(self.device_id) in HW_JPEG_DECODERS
        ruled = options.hw_decoder_load in ("auto", None)  # the share left to the library
        tuned = options.hw_decoder_load is None  # asked for: the tuner (NOTE [calibration])
        large = mixed and (ruled or options.pipelines is None) \
            and large_photos(self.data_source)
        load = options.replace(hw_decoder_load="auto").load_for(large and hw_gpu) \
            if ruled else options.load_for()
        first = Setting(cast(float, load),
                        options.lanes_for(conditional(self.plan_dali), workers, large, len(self)))
        if not self.gpu:
            return first, (first,), "off: DALI's CPU operators (tuning times GPU work)"
        if not tuned:
            return first, (first,), ("off: the rules' setting (hw_decoder_load=None tunes the "
                                     "share and the pipeline count on your loop)")
        loads, lanes = mixed and hw_gpu, options.pipelines is None
        candidates = grid(first, loads=loads, lanes=lanes,
                          max_lanes=max(1, min(workers, len(self))))
        if len(candidates) == 1:
            return first, candidates, "off: hw_decoder_load and pipelines are pinned or fixed"
        what = " and ".join(w for w, on in (("hw_decoder_load", loads), ("pipelines", lanes)) if on)
        return first, candidates, f"on: {what}, over {len(candidates)} settings"

    def _calibrator(self, config: LoaderConfig, options: DaliOptions,
                    candidates: tuple[Setting, ...]) -> Calibrator | None:
        """The tuner over ``candidates`` (``pipelines.dali.calibrate`` NOTE [calibration]),
        keyed by the GPU, DALI, the data, the recipe, the batch and the candidates; ``None``
        with one candidate."""
        if len(candidates) < 2:
            return None
        from nvidia.dali import __version__ as dali_version
        key = cache_key(torch.cuda.get_device_name(self.device_id), dali_version,
                        len(self.paths), self.paths[:1], self.paths[-1:], repr(self.transform_plan),
                        config.batch_size, config.dtype.value, config.world_size,
                        config.num_workers, options.queue_depth, [c.label for c in candidates])
        settle = options.queue_depth + 2
        return Calibrator(settle=settle, timer=EventTimer(self.device),
                          cache=CalibrationCache.default(), key=key, candidates=candidates,
                          window=window_for(config_len(len(self.paths), config), settle))

    def tune_with(self, calibrator: Calibrator, background: bool = True) -> None:
        """Tune with ``calibrator`` (its first candidate must be the running setting): how
        tests force switches with a fake clock, on CPU operators too (NOTE [calibration]).
        ``background=False`` builds a candidate's pipelines at the batch the calibrator
        moves to it, so switches happen at batches the clock alone decides."""
        if calibrator.setting != self.setting:
            raise ValueError(f"calibrator's first setting {calibrator.setting.label} must be "
                             f"the running one, {self.setting.label}")
        if self._ahead is not None:
            raise RuntimeError("tune_with: a candidate's pipelines are being built; call it "
                               "before the loader tunes")
        self.calibrator, self.background = calibrator, background
        self.tuning = f"on: {len(calibrator.candidates)} settings (installed by tune_with)"

    @property
    def setting(self) -> Setting:
        """The hardware decoder's share and the pipeline count the loader runs with now."""
        return Setting(self.hw_decoder_load, cast(int, self.options.pipelines))

    @property
    def hw_decoder_load(self) -> float:
        """The hardware decoder's share the pipelines run with now (the tuned one, unless
        pinned; it has no effect on CPU operators or a GPU without the hardware decoder)."""
        return cast(float, self.options.hw_decoder_load)  # resolved when built, and by switches

    @property
    def decoder(self) -> str:
        """What decodes, for reports: nvJPEG with the hardware decoder's share, or DALI's CPU
        decoder."""
        if not self.gpu:
            return "DALI CPU"
        if not decodes_on_gpu(self.options, self.gpu):
            return "DALI CPU decode"  # DaliOptions.decode_on="cpu"
        return f"nvJPEG hw {self.hw_decoder_load:g}"

    def _build(self) -> None:
        self.pipes = self._pipes_for(self.setting)[0]
        self._its = None
        self._ran_on: int | None = None  # the epoch every lane ran on into (NOTE [running on])

    def _pipes_for(self, setting: Setting, ahead: bool = False) -> tuple[list, list[Lane]]:
        """One pipeline per lane of ``setting`` (the source must have that many lanes, unless
        ``ahead``: ``PlanSource.lane``), with its hardware decoder's share, and their lanes;
        the source fills the rows of draws by their graph's layout."""
        opts = self.options.replace(hw_decoder_load=setting.load, pipelines=setting.pipelines)
        lanes = [self.source.lane(k, ahead) for k in range(setting.pipelines)]
        pipes = [build_pipeline(self.config, opts, self.plan_dali, lane, self.device_id,
                                encoded=not self.data_source.by_path) for lane in lanes]
        self.source.draw(pipes[0].draw_plan, self.config.seed)  # the same graph: unchanged
        return pipes, lanes

    def _iterators(self, pipes: list | None = None) -> list[DALIGenericIterator]:
        return [DALIGenericIterator(p, list(OUTPUTS), size=-1, auto_reset=False,
                                    last_batch_policy=DaliPolicy.PARTIAL,
                                    prepare_first_batch=False)
                for p in (self.pipes if pipes is None else pipes)]

    # -- the tuner's switches (NOTE [calibration]) -------------------------------------------
    def _tune(self, calib: Calibrator) -> bool:
        """Tick ``calib`` as a batch is handed out; whether to switch to its setting now. The
        setting's pipelines are traced when it moves to one, then built and warmed up in the
        background (``_build_ahead``) while the running ones serve; ``calib`` is not ticked
        until they are ready, so no window spans the wait."""
        if self._ahead is None:
            if calib.tick() is None:
                return False
            self._build_ahead(calib.setting)
        return cast(tuple, self._ahead)[3].done()

    def _build_ahead(self, setting: Setting) -> None:
        """Trace ``setting``'s pipelines here (the graph's builders are not thread-safe) and
        build and warm them up in a thread (``background``), or here."""
        pipes, lanes = self._pipes_for(setting, ahead=True)
        fut: Future = Future()
        if self.background:
            if self._builder is None:
                self._builder = ThreadPoolExecutor(1, thread_name_prefix="dali-build")
            fut = self._builder.submit(self._warmed, pipes)
        else:
            fut.set_result(self._warmed(pipes))
        self._ahead = (setting, pipes, lanes, fut)

    def _warmed(self, pipes: list) -> list[DALIGenericIterator] | None:
        """Build ``pipes`` and run their lanes' warm-up batch through them on a side stream of
        this loader's GPU, dropping it, so their first use is paid outside any timed window
        (docs/investigations/dali-hardware-decoder.md); their iterators, or ``None`` when
        DALI failed on that batch (the switch builds them again)."""
        stream = torch.cuda.Stream(self.device) if self.gpu else None
        with self._on_device(), (torch.cuda.stream(stream) if stream is not None
                                 else contextlib.nullcontext()):
            its = self._iterators(pipes)
            try:
                for it in its:
                    for _ in it:
                        pass
            except Exception:  # noqa: BLE001 - a batch nobody sees; see the docstring
                return None
            if stream is not None:
                stream.synchronize()  # this thread only: the outputs it dropped are written
        return its

    def _switch(self, epoch: int) -> int:
        """Hand the plan from the running pipelines to those built ahead for the calibrator's
        setting (NOTE [calibration]) and return the first position not yet handed out, where
        the new lanes go on. The old ones are stopped, drained (their batches in flight are
        dropped, and made again by the new ones) and released. Each lane keeps its place when
        the count stays; a new count deals the positions from the first one not yet handed
        out. A build that failed raises here, on the consumer's thread."""
        setting, pipes, lanes, fut = cast(tuple, self._ahead)
        self._ahead = None
        its = fut.result()
        self._drain(self._its or [])  # a failure there: a batch nobody will see
        resume = self.source.resume_positions()
        first = min(resume)
        self._its = None
        self._drop_pipes()
        self.options = self.options.replace(hw_decoder_load=setting.load,
                                            pipelines=setting.pipelines)
        if setting.pipelines != len(resume):
            resume = _dealt(first, setting.pipelines)
        self.source.start_epoch(epoch, resume=resume, lanes=setting.pipelines)
        for lane in lanes:
            lane.serve()
        if its is None:  # DALI failed on the warm-up batch: built again; a bad file is found
            del pipes, lanes, fut  # as usual when the lanes reach it
            self._build()
            self._its = self._iterators()
        else:
            self.pipes = pipes
            for it in its:
                it.reset()
            self._its = its
        cast(Calibrator, self.calibrator).restart()
        return first

    def _drain(self, its) -> bool:
        """Stop the source and run ``its`` dry, dropping the batches they hold; ``False`` when
        DALI failed on one of them (a batch nobody will see)."""
        self.source.stop()
        try:
            for it in its:
                for _ in it:
                    pass
        except Exception:  # noqa: BLE001 - the caller decides what a failed drain means
            return False
        return True

    def h2d_bytes_per_sample(self) -> float | None:
        """The encoded file bytes (they go to the GPU decoder) and the int64 label."""
        if not self.gpu:
            return 0.0
        src = self.source
        if not src.samples_read:
            return None
        return src.bytes_read / src.samples_read + 8.0

    def _target_after(self, epoch: int) -> int | None:
        """The epoch the lanes run on into after ``epoch`` (NOTE [running on]): this one again
        when the consumer repeated its last epoch, else the next; ``None`` without ``run_on``."""
        if not self.options.run_on:
            return None
        if self._last_epoch == epoch:
            return epoch
        return epoch + 1 if epoch + 1 < MAX_EPOCH else None  # none after the last epoch

    def _start(self, epoch: int, start: int = 0) -> None:
        """Make the pipelines ready for a new epoch, from plan position ``start`` on (module
        NOTE [recovery]; a resumed epoch starts past 0 and never reads what it skips). When
        every lane ran on into this epoch, it goes on where they are (NOTE [running on])."""
        ran_on, self._ran_on = self._ran_on, None
        target = self._target_after(epoch)
        self._last_epoch = epoch
        size = _fed_size(self._sizes, epoch)  # pipelines.resolution NOTE [sizes ahead]
        if (ran_on == epoch and start == 0 and not self._broken and self._its is not None
                and self.source.fed_size(epoch) in (None, size)):
            self.source.continue_into(epoch)
            self.source.run_on(target)
            return
        self.source.run_on(target)
        if self._broken:
            self._rebuild()
        elif self._its is not None and self._in_epoch:  # the last epoch ended early
            if not self._drain(self._its):  # a failure in a batch nobody will see
                self._rebuild()  # start from scratch
        self._in_epoch = False
        n = cast(int, self.options.pipelines)  # lane j serves positions j, j + n, ...: its first >= start
        self.source.start_epoch(epoch, resume=_dealt(start, n), size=size, lanes=n)
        if self._its is None:
            self._its = self._iterators()
        else:
            for it in self._its:
                it.reset()

    def _rebuild(self) -> None:
        self._its = None
        self._drop_pipes()
        self._build()
        self._broken = False

    def _recover(self, err: Exception, epoch: int) -> None:
        """Find the file behind a DALI failure, record it, restart the lanes (NOTE [recovery])."""
        self._broken = True
        items: dict[int, str] = {}
        for k in range(cast(int, self.options.pipelines)):
            for fed in self.source.in_flight(k):
                for i in fed.rows.tolist():
                    items.setdefault(i, self.paths[i])
        if self._probe is None:
            mixed = decodes_on_gpu(self.options, self.gpu)
            kw = {"hw_decoder_load": self.hw_decoder_load} if mixed else {}
            self._probe = DecodeProbe(self.config.batch_size, self.device_id, kw,
                                      read=None if self.data_source.by_path
                                      else self.data_source.read, mixed=mixed)
        found = self._probe.failing(sorted(items.items()), on_bad=self.source.mark_bad)
        if not found:
            raise RuntimeError(
                f"DALI failed in epoch {epoch} and no file of the {len(items)} in flight "
                f"fails to decode alone; DALI said: {err}") from err
        self._restart(epoch)
        self.recoveries += 1

    def _restart(self, epoch: int) -> None:
        """Rebuild the pipelines and start each lane at its first position not yet handed out
        (after a recovery)."""
        resume = self.source.resume_positions()
        self._rebuild()
        self.source.start_epoch(epoch, resume=resume)
        self._its = self._iterators()
        if self.calibrator is not None:
            self.calibrator.restart()

    def _account(self, k: int) -> None:
        """Count (``skip``) or raise (``error``) the bad files of lane ``k``'s next batch."""
        fed = self.source.take(k)
        if fed is not None:
            self._report(fed.bad, fed.dropped)

    def _drop_at(self, k: int, pos: int) -> bool:
        """Account the wholly-bad batch at plan position ``pos`` when lane ``k``'s oldest
        record begins with it (its files are the record's first), so positions are consumed
        in the plan's order with any number of lanes (``pipelines.loader`` NOTE
        [positions])."""
        f = self.source.peek(k)
        if (f is None or f.round != self.source.round or not f.positions
                or f.positions[0] != pos or (len(f.positions) == 1 and len(f.rows))):
            return False
        m = self.config.batch_size if len(f.positions) > 1 else len(f.bad)
        bad, f.bad = f.bad[:m], f.bad[m:]
        f.positions.pop(0)
        f.dropped -= 1
        if not f.positions:
            self.source.take(k)
        self._report(bad, 1)
        return True

    def _more(self, k: int) -> bool:
        """Whether lane ``k``'s next batch from DALI is one of this epoch (NOTE [running on]):
        not once its oldest batch not yet yielded is of the next pass. The lane's trailing
        wholly-bad batches of this epoch are accounted first."""
        src = self.source
        while (f := src.peek(k)) is not None and f.round == src.round and not len(f.rows):
            self._account(k)
        f = src.peek(k)
        return f is None or f.round == src.round

    def _produce(self, epoch: int, start: int):
        if start >= len(self):  # a state saved at the end of an epoch: nothing is left
            return
        with self._on_device():
            self._start(epoch, start)
        self._in_epoch = True
        calib = self.calibrator
        if calib is not None:
            calib.restart()
        cast = self.config.dtype is OutputDType.BFLOAT16
        assert self._its is not None  # _start made them
        n = len(self._its)
        live = [True] * n
        ran_on = [True] * n  # lanes that went on into the next pass (NOTE [running on])
        ended = [False] * n  # lanes whose iterator raised StopIteration
        held: list = [None] * n  # a lane's batch taken from DALI before its turn
        turn = start  # the plan position next handed over; lane turn % n holds it
        while any(live):
            k = turn % n
            if not live[k]:
                turn += 1
                continue
            if self._drop_at(k, turn):  # position turn was wholly bad: consumed, not yielded
                turn += 1
                continue
            if ended[k]:
                while self.source.in_flight(k):  # trailing wholly-bad batches
                    self._account(k)
                live[k] = False
                continue
            if held[k] is None:
                if not self._more(k):  # the lane's next batch is the next epoch's
                    live[k] = False
                    continue
                try:
                    with self._on_device():
                        held[k] = next(self._its[k])
                except StopIteration:
                    ended[k], ran_on[k] = True, False
                except Exception as e:  # a DALI failure: find the file, rebuild, retry this lane
                    with self._on_device():
                        self._recover(e, epoch)
                    held = [None] * n  # the rebuilt lanes make them again
                continue  # its record is there now: a batch before it may have been dropped
            out, held[k] = held[k], None
            turn += 1
            with self._on_device():  # not a DALI failure if this raises
                x, y = self._own(out[0], cast)
            idx = out[0]["indices"].view(-1).numpy().copy()  # on the CPU: the fed meta
            del out
            self._account(k)
            yield Batch(x, y), idx
            calib = self.calibrator  # tune_with may have installed one
            # the consumer asks for the next batch: NOTE [calibration]
            if calib is not None and self._tune(calib):
                with self._on_device():
                    turn = self._switch(epoch)
                n = len(self._its)  # the new setting's lanes, all live again
                live, ran_on = [True] * n, [True] * n
                ended, held = [False] * n, [None] * n  # the new pipelines make them again
        self._in_epoch = any(ran_on)  # those lanes' pipelines hold the next pass's batches
        if all(ran_on):
            self._ran_on = self.source.target

    def _own(self, d: dict[str, torch.Tensor], cast: bool):
        """The batch's ``(images, labels)`` from DALI's outputs ``d``: images in the config's
        layout and dtype, labels on the device (the graph copies them there on a GPU)."""
        x, y = d["images"], d["labels"].view(-1)
        if x.dim() == 5:  # AugmentSpec.views: N x views x ... -> the views as adjacent rows
            x = x.flatten(0, 1)
        if self.config.channels_last:
            x = x.permute(0, 3, 1, 2)  # NHWC memory == NCHW with channels_last strides
        if cast:
            x = x.to(torch.bfloat16, memory_format=torch.preserve_format)
        return x, y

    def _release(self) -> None:
        """Release the pipelines, their threads and their GPU memory."""
        self._its = None
        if self._builder is not None:  # a build under way ends first
            self._builder.shutdown(wait=True)
        self.source.close()
        spare = [weakref.ref(p) for p in self._ahead[1]] if self._ahead is not None else []
        self._ahead = None
        self._probe = None
        self._drop_pipes(spare)

    def _drop_pipes(self, spare: list[weakref.ref] | None = None) -> None:
        """Drop the pipelines; collect garbage only when a reference cycle (a traceback's
        frames, say) still holds one of them or of the dropped ``spare`` ones, so their
        threads and memory go now without a full collection on every close."""
        held = [weakref.ref(p) for p in self.pipes] + (spare or [])
        self.pipes = []
        if any(r() is not None for r in held):
            gc.collect()


def _dealt(start: int, n: int) -> list[int]:
    """Per lane of ``n``, its first position from ``start`` on: lane j serves j, j + n, ..."""
    return [start + (j - start) % n for j in range(n)]


def _fed_size(sizes, epoch: int) -> tuple[int, int, int]:
    """The ``(height, width, resize)`` that ``epoch``'s rows carry (``AugmentSpec``'s recipe
    feeds its sizes: ``pipelines.transforms.migrate.spec_ops``)."""
    spec = sizes.at(epoch)
    return (*spec.hw, cast(int, spec.resize_size))
