"""What ``python -m compare`` runs: plan every variant, check every input, time them, report
(the options: ``compare/args.py``)."""
from __future__ import annotations

import argparse
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipelines import Backend, LoaderConfig, available_backends, from_torchvision
from pipelines.epoch_plan import num_batches
from pipelines.sources.remote import shown  # a remote root redacted: no secret in a message
from pipelines.sources.root import SourceKind, source_kind
from pipelines.sources.shards import shard_paths

from . import cli, ddp, owned, resume
from .args import PROG, parse_args
from .env import environment
from .models import parse_model
from .probes import PROBES, Active
from .report import details_lines, markdown, plots, table, verdict_lines, warnings_for
from .results import FIT_QUEUES, SuiteResult
from .runner import make_step, run_ceiling, run_variant
from .variants import ORDER, Variant, parse_sweep, preset


def default_cache() -> Path:
    base = os.environ.get("GPU_FEED_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "gpu-feed")
    return Path(base)


LARGE = (2000, 4000)  # --preset large: photo widths, as phones and DSLRs make them
LARGE_IMAGES = (1024, 128)  # its default image count with CUDA, without
LARGE_BATCH = 64  # its default --batch-size with CUDA: 16 batches an epoch, one per worker or more


def default_gen_config(num_images: int, large: bool = False):
    """The ``GenConfig`` of the default dataset in the cache (``large``: of large photos)."""
    from data_gen.generate import GenConfig

    name = f"default-large-{num_images}-seed0" if large else f"default-{num_images}-seed0"
    out = default_cache() / name
    try:
        return GenConfig(out=str(out), num_images=num_images, classes=max(1, min(100, num_images)),
                         seed=0, **({"width_range": LARGE} if large else {}))
    except (ValueError, TypeError) as e:  # names --num-images
        raise ValueError(str(e)) from None


def default_dataset(cfg, log) -> Path:
    """Generate the default dataset once (then reuse it from the cache)."""
    from data_gen.generate import ensure_dataset

    log(f"dataset: {cfg.out} (generated once, then reused)")
    try:
        return ensure_dataset(cfg, elsewhere="set GPU_FEED_CACHE to another folder")
    except OSError as e:  # foreign files in the cache, or an unwritable one: one line
        raise ValueError(str(e)) from None


def load_transform(ref: str):
    """``"module:name"`` (a transform, or a function returning one, optionally written as a call
    ``NAME(key=literal, ...)``) -> the flat v2 Compose ``LoaderConfig`` keeps."""
    import inspect

    from pipelines.transforms.migrate import check_transform

    obj, kwargs, called, name = cli.load_ref(ref, "--transform")
    if inspect.isfunction(obj):
        try:
            obj = obj(**kwargs)
        except Exception as e:  # noqa: BLE001 - the user's function raised: one line naming it
            if not called and isinstance(e, TypeError):
                raise ValueError(f"--transform {ref!r} is a function that needs arguments ({e}); "
                                 "name a transform or a function of no arguments, or call it: "
                                 "MODULE:NAME(key=literal, ...)") from None
            raise ValueError(f"--transform {ref!r}: calling {name} failed "
                             f"({type(e).__name__}: {e})") from None
    elif called:
        raise ValueError(f"--transform {ref!r}: {name} is not a function to call")
    try:
        return check_transform(obj)
    except (TypeError, ValueError) as e:
        raise ValueError(f"--transform {ref!r}: {e}") from None


@dataclass
class Plan:
    """Everything the run needs, checked: the variants with their configs, and ``--out``."""

    variants: list[Variant]
    configs: list[LoaderConfig]
    base: LoaderConfig
    out: Path
    gen: object = None  # the default dataset's GenConfig, when --data is not given
    classes: int = 0  # classes in --data (0 until the default dataset is listed)
    notes: list[str] = field(default_factory=list)
    resumed: SuiteResult | None = None  # --resume: the stopped run in --out (compare.resume)


def _variants(a, note: Callable[[str], None]) -> list[Variant]:
    out = _backend_variants(a, note)
    if getattr(a, "reference", False):
        from .reference import DALI_LABEL, LABEL

        if any(v.backend is not Backend.DALI for v in out):  # the torch backends' recipe
            out.insert(0, Variant(LABEL, Backend.PAGEABLE, reference=True))
        if any(v.backend is Backend.DALI for v in out):
            out.append(Variant(DALI_LABEL, Backend.DALI, reference=True))
    return out


def _backend_variants(a, note: Callable[[str], None]) -> list[Variant]:
    chosen = a.backends is not None
    backs = cli.parse_backends(a.backends, note=note) if chosen else available_backends()
    if a.preset and a.sweep is not None:
        raise ValueError(f"--preset {a.preset} is a fixed set of variants and cannot be combined "
                         "with --sweep; use one of them")
    if a.preset:
        return preset(a.preset, backs)
    if a.sweep is not None:
        return parse_sweep(a.sweep, backs, chosen=chosen, note=note)
    return [Variant(b.value, b) for b in sorted(backs, key=ORDER.index)]


def _where(v: Variant) -> str:
    return f"variant {v.label!r}"


def plan(a, note: Callable[[str], None]) -> Plan:
    """The validation pass: raises ``ValueError`` naming the option (and the variant)."""
    for k, v in {"--steps": a.steps, "--repeats": a.repeats}.items():
        cli.at_least(k, v, 1)
    cli.at_least("--warmup", a.warmup, 0)
    try:
        parse_model(a.model)
    except ValueError as e:
        raise ValueError(f"--model: {e}") from None
    if getattr(a, "step", None):
        cli.load_ref(a.step, "--step")  # imports now: a bad --step fails before any dataset
    if a.data and getattr(a, "given_num_images", None) is not None:
        raise ValueError("--num-images sizes the generated dataset, and --data names your own: "
                         "drop one of them")
    variants = _variants(a, note)
    transform = load_transform(a.transform) if a.transform else None
    large = a.preset == "large"
    if large:
        import torch

        cuda = torch.cuda.is_available()
        if getattr(a, "given_num_images", a.num_images) is None:
            a.num_images = LARGE_IMAGES[0 if cuda else 1]
        if getattr(a, "given_batch_size", a.batch_size) is None and cuda:
            a.batch_size = LARGE_BATCH
        # FIT_QUEUES x the queue of photos would take minutes: --steps is the window, as if given
        a.given_steps = a.steps
    gen = None if a.data else default_gen_config(a.num_images, large)
    base = cli.loader_config(
        root=a.data if a.data else gen.out, batch_size=a.batch_size,
        augment=cli.augment(mode=a.mode, size=a.image_size), num_workers=a.workers,
        dtype=a.dtype, channels_last=a.device.startswith("cuda"), device=a.device,
        last_batch="drop", seed=0, transform=transform, on_bad_file=a.on_bad_file,
        mix=cli.mix_spec(getattr(a, "mix", None)),
    )
    if getattr(a, "reference", False):
        from .reference import dali_reference_skip

        why = dali_reference_skip(base)
        if why is not None and any(v.reference and v.backend is Backend.DALI for v in variants):
            variants = [v for v in variants if not (v.reference and v.backend is Backend.DALI)]
            note(f"--reference: no DALI file-reader row: {why}")
    variants = _runnable(a, transform, variants, note)
    configs = plan_variants(variants, base)
    if getattr(a, "reference", False):
        if base.mix is not None:
            raise ValueError("--reference has no MixUp/CutMix (the plain recipe mixes in the "
                             "training loop); drop --mix or --reference")
        if a.data and source_kind(a.data) is not SourceKind.FOLDER:
            raise ValueError(f"--reference reads an ImageFolder folder; --data {shown(a.data)} is a "
                             f"{source_kind(a.data).value}")
    classes = 0
    # --out is checked before the dataset is listed or anything is written (a probe included)
    cli.outside_data(a.out, a.data if a.data else gen.out, "--out",
                     "--data" if a.data else "the default dataset")
    # --resume reads results.json first: a damaged one is named as such, not as another's file
    saved = resume.load_partial(Path(a.out)) if getattr(a, "resume", False) else None
    if Path(a.out).is_dir():
        owned.check_out(Path(a.out))
    if gen is None:
        paths, names = cli.list_dataset(a.data, allow_empty=base.allow_empty_classes,
                                        on_bad_file=base.on_bad_file)
        check_dataset(len(paths), variants, configs)
        classes = len(names)
    elif not Path(gen.out).exists():  # about to be generated: check its size first
        check_dataset(gen.num_images, variants, configs)
    for line in short_epochs(len(paths) if gen is None else gen.num_images, variants, configs):
        note(line)
    out = cli.writable_dir(a.out, "--out")
    return Plan(variants, configs, base, out, gen, classes, resumed=saved)


def _runnable(a, transform, variants: list[Variant], note: Callable[[str], None]) -> list[Variant]:
    """The variants that can run ``--transform``: rows it cannot run are noted as not run."""
    dali = [v for v in variants if v.backend is Backend.DALI]
    try:
        if transform is not None and dali:
            from_torchvision(transform)
    except ValueError as e:
        if len(dali) == len(variants):
            raise ValueError(f"--transform {a.transform} (for dali): {e}") from None
        note(f"not run: {', '.join(v.label for v in dali)}: --transform {a.transform}: {e}")
        return [v for v in variants if v.backend is not Backend.DALI]
    return variants


def plan_variants(variants: list[Variant], base: LoaderConfig) -> list[LoaderConfig]:
    """Each variant's config, options checked; an error names the item that set it."""
    configs = []
    for v in variants:
        try:
            cfg = v.config_of(base)
            opts = v.options_of()
            if v.backend is Backend.DALI:
                opts.check(cfg.num_workers)
        except (ValueError, TypeError) as e:
            raise cli.option_error(e, {**cli.FLAGS, **v.sources}, _where(v)) from None
        configs.append(cfg)
    return configs


def check_dataset(n: int, variants: list[Variant], configs: list[LoaderConfig]) -> None:
    """Every variant gets at least one batch per epoch from ``n`` images (``check_nonempty``)."""
    for v, cfg in zip(variants, configs):
        cli.check_batches(n, cfg, {**cli.FLAGS, **v.sources}, _where(v))


def short_epochs(n: int, variants: list[Variant], configs: list[LoaderConfig]) -> list[str]:
    """A line for each torch row whose epoch of ``n`` images has fewer batches than workers
    (it would time epoch starts more than decoding)."""
    out = []
    for v, cfg in zip(variants, configs):
        cfg = cfg.resolved()
        if v.backend is Backend.DALI or cfg.num_workers < 2:
            continue
        k = num_batches(n, batch_size=cfg.batch_size, policy=cfg.last_batch, rank=cfg.rank,
                        world_size=cfg.world_size)
        if 0 < k < cfg.num_workers:  # no batch at all: check_dataset refuses it
            need = cfg.num_workers * cfg.batch_size * cfg.world_size
            out.append(f"{v.label}: an epoch of {n} images is {k} batches of {cfg.batch_size}, fewer "
                       f"than its {cfg.num_workers} workers, so it times epoch starts more than "
                       f"decoding; use at least {need} images or a smaller --batch-size")
    return out


def prepare(p: Plan, a, log, job: ddp.Job | None = None, build_step: bool = True):
    """Make (or reuse) the default dataset (rank 0 first) and check it; ``(root, step)``, the
    step ``None`` unless ``build_step`` (isolated units build their own)."""
    job = job or ddp.Job()
    root, classes = p.base.root, p.classes
    user_step = None
    if build_step and getattr(a, "step", None):  # before the default dataset is made
        from .userstep import load_step

        user_step = load_step(a.step)
    if p.gen is not None:
        if job.main:
            root = default_dataset(p.gen, log)
        job.barrier()
        if not job.main:
            root = default_dataset(p.gen, log)
        paths, names = cli.list_dataset(root, allow_empty=p.base.allow_empty_classes,
                                        on_bad_file=p.base.on_bad_file)
        check_dataset(len(paths), p.variants, p.configs)
        classes = len(names)
    p.classes = classes
    if not build_step:
        return _local(root), None
    if user_step is not None:
        return _local(root), user_step
    wrap = (lambda m: ddp.wrap(m, job)) if job.group else None
    return _local(root), make_step(a.model, p.base, classes, wrap=wrap)


def run(argv=None) -> int:
    """Run the suite for ``argv`` (or parsed options); the exit status. Rank 0 reports."""
    a = argv if isinstance(argv, argparse.Namespace) else parse_args(argv)
    try:
        cli.check_dist_env()  # RANK and WORLD_SIZE come as a pair, before any work
    except ValueError as e:
        return cli.fail(PROG, e)
    try:
        job = ddp.start(a.device)
    except (ValueError, RuntimeError) as e:
        return cli.fail(PROG, f"cannot join the torchrun job: {e}")
    try:
        return _run(a, job)
    finally:
        job.finish()


def _run(a, job: ddp.Job) -> int:
    quiet = lambda s: None  # noqa: E731
    log = (lambda s: print(s, flush=True)) if job.main else quiet  # noqa: E731
    notes: list[str] = []
    say = cli.note(PROG) if job.main else quiet

    def note(msg: str) -> None:
        notes.append(msg)
        say(msg)

    try:
        p = plan(a, note)
        p.notes = notes
        a.isolate = isolated(a, job, note)
        if p.resumed is not None and not a.isolate:
            raise ValueError("--resume continues an isolated run; this one is not isolated "
                             "(--no-isolate, no CUDA or torchrun): drop --resume")
        if a.isolate and getattr(a, "step", None):  # built in each unit's process: check now
            from .userstep import load_step

            load_step(a.step)
        root, step = prepare(p, a, log, job, build_step=not a.isolate)
    except (ValueError, TypeError, ImportError) as e:
        return cli.fail(PROG, e if job.main else f"rank {job.rank}: {e}")
    return execute(a, p, root, step, log, job)


def isolated(a, job: ddp.Job, note: Callable[[str], None]) -> bool:
    """Whether each repeat runs in a fresh process (``--isolate``; compare.isolate)."""
    want = getattr(a, "isolate", None)
    if job.group:
        if want:
            note("--isolate: off under torchrun (the ranks are the job's processes)")
        return False
    if want is None:
        import torch

        return torch.cuda.is_available() and str(a.device).startswith("cuda")
    return bool(want)


def _local(root):
    """``root`` as a ``Path``; a remote root (``https://``, ``s3://``, ``pipe:``) stays a str,
    which a ``Path`` would mangle (``https:/host``)."""
    from pipelines.sources import remote

    return root if remote.is_remote(root) else Path(root)


def _manifest(root, read_manifest) -> dict | None:
    """data_gen's manifest of ``root`` (of a shard pattern: its folder's, if it names every
    shard); none for a remote root."""
    if not isinstance(root, Path):
        return None
    if root.is_dir() or source_kind(root) is not SourceKind.SHARDS:
        return read_manifest(root)
    shards = shard_paths(root)
    folder = Path(shards[0]).parent
    man = read_manifest(folder)
    listed = {f.get("path") for f in (man or {}).get("files", []) if str(f.get("path", "")).endswith(".tar")}
    here = {os.path.relpath(s, folder) for s in shards}
    return man if man and listed == here else None


def execute(a, p: Plan, root: Path, step, log, job: ddp.Job | None = None) -> int:
    """Run the planned variants, rewriting the results after each one (rank 0 writes)."""
    from data_gen.generate import read_manifest

    job = job or ddp.Job()
    base, out = p.base, p.out
    man = _manifest(root, read_manifest)
    probes = Active.of(a, out, root)
    setup = {
        "data": shown(root), "source": source_kind(root).value,
        "dataset": (man or {}).get("stats", {}), "model": a.model,
        "batch_size": a.batch_size, "steps": a.steps, "warmup": a.warmup, "repeats": a.repeats,
        "dtype": a.dtype, "channels_last": base.channels_last, "workers": base.num_workers,
        "on_bad_file": base.on_bad_file.value,
        "augment": repr(base.transform) if base.transform is not None else repr(base.augment),
        "mix": repr(base.mix) if base.mix is not None else None,
        "device": a.device, "variants": [v.label for v in p.variants], "notes": list(p.notes),
        "world_size": job.world, "local_world_size": job.local_world, "nodes": job.nodes,
        "step": getattr(a, "step", None), "isolate": bool(getattr(a, "isolate", False)),
        **{p.name: p.name in probes.on for p in PROBES},
        # --steps not given: each window is at least FIT_QUEUES x its loader's queue
        "fit_queue": getattr(a, "given_steps", a.steps) is None,
    }
    env = environment()
    results: list = []
    captured: list = []
    ceiling: object | None = None

    def save(complete: bool, error: str | None = None) -> SuiteResult:
        suite = SuiteResult(env, {**setup, **({"error": error} if error else {})}, ceiling,
                            tuple(results), complete=complete)
        if not job.main:
            return suite
        suite.dump(out / "results.json")
        (out / "summary.md").write_text(markdown(suite, getattr(a, "details", False)))
        return suite

    def late(code: int, why: str, tb: str | None = None) -> int:
        if not job.main:
            return cli.fail(PROG, f"rank {job.rank}: {why}", code)
        where = "; no variant finished, nothing written"
        if results:
            try:
                save(False, why)
                where = (f"; {len(results)} of {len(p.variants)} variants finished, partial "
                         f"results in {out / 'results.json'} (complete: false)")
            except OSError as e:
                where = f"; the partial results could not be written ({e})"
        if tb:
            try:
                log_path = owned.write_error_log(out, tb)  # never over a file of another's
                where += f"; traceback in {log_path}"
            except OSError:
                pass
        return cli.fail(PROG, why + where, code)

    ranks = (f" on each of {job.world} rank{'s' if job.world > 1 else ''} (DDP)" if job.group else "")
    what = f"step {a.step}" if getattr(a, "step", None) else f"model {a.model}"
    log(f"running {len(p.variants)} variants x {a.repeats} repeats, {what}, batch {a.batch_size}, {a.steps} "
        f"steps{f' (or {FIT_QUEUES}x the loader queue, if more)' if setup['fit_queue'] else ''} "
        f"(+{a.warmup} warm-up), workers {base.num_workers}{ranks}")
    t0 = time.perf_counter()
    stage = "setup"
    try:
        probes.check()  # before any timing: a probe that cannot work here (--cold on tmpfs)
    except ValueError as e:
        return late(2, str(e))
    try:
        if getattr(a, "isolate", False):
            from . import isolate

            want_ceiling = not (a.no_ceiling or a.model == "none")
            units = isolate.order(len(p.variants), a.repeats, want_ceiling, getattr(a, "order_seed", 0))
            labels = [v.label for v in p.variants]
            setup["order_seed"] = getattr(a, "order_seed", 0)
            setup["order"] = [u.name(labels) for u in units]
            work = isolate.Job(tuple(p.variants), base, a.model, p.classes, a.steps, a.warmup,
                               getattr(a, "step", None), setup["fit_queue"], probes)
            prior = None
            if p.resumed is not None:  # NOTE [resume]: checked before any unit runs
                try:
                    resume.check_same(p.resumed, setup, env)
                    prior = resume.done_units(p.resumed, units, labels)
                except ValueError as e:
                    return cli.fail(PROG, e)  # nothing written: the stopped run stays as it was
                log(f"resuming {out / 'results.json'}: {prior[0]} of {len(units)} repeats "
                    f"done, {len(units) - prior[0]} to run")

            def done(got, c):
                nonlocal ceiling
                results[:] = [got[i] for i in sorted(got)]
                ceiling = c
                save(False)

            stage = "the isolated repeats"
            isolate.run_all(work, units, log=log, done=done, resumed=prior)
        else:
            setup["order"] = [f"{v.label} #{r + 1}" for v in p.variants for r in range(a.repeats)]
            for v in p.variants:
                stage = _where(v)
                want = None if (captured or a.no_ceiling or a.model == "none") else captured
                mine = run_variant(v, base, step, steps=a.steps, warmup=a.warmup,
                                   repeats=a.repeats, log=log, capture=want, sync=job.barrier,
                                   agree=job.all_agree if job.group else None,
                                   fit=setup["fit_queue"], probes=probes)
                results.append(ddp.merge(job.gather(mine)))
                save(False)
            if captured:
                stage = "the ceiling run"
                mine = run_ceiling(captured[0], step, steps=a.steps, warmup=a.warmup,
                                   repeats=a.repeats, device=captured[0][0].device, log=log,
                                   sync=job.barrier, probes=probes)
                ceiling = ddp.merge(job.gather(mine))
    except KeyboardInterrupt:
        return late(130, f"interrupted during {stage}")
    except Exception as e:  # noqa: BLE001 - reported in one line, traceback kept in error.log
        tb = traceback.format_exc() + getattr(e, "child_traceback", "")
        return late(1, f"{stage} failed: {type(e).__name__}: {e}", tb)
    suite = save(True)
    if not job.main:
        return 0
    owned.drop_stale_error_log(out)  # an earlier failed run's; never a file of another's
    pngs = plots(suite, out)
    print()
    for line in verdict_lines(suite):  # the answer first (compare.report NOTE [verdict first])
        print(line)
    print()
    print(table(suite))
    for w in warnings_for(suite):
        print(f"warning: {w}")
    if getattr(a, "details", False):
        print("\n".join(["", *details_lines(suite)]))
    print(f"\nwrote {out / 'results.json'}, {out / 'summary.md'}, "
          f"{', '.join(str(p) for p in pngs)} in {time.perf_counter() - t0:.0f}s")
    return 0


def main(argv=None) -> int:
    """``python -m compare run ...`` (the same as ``python -m compare ...``)."""
    return run(argv)
