"""``python -m compare``: which backend keeps my GPU busy, and by how much?

Runs every backend on the same files, AugmentSpec, batch size, model, steps and warm-up and
writes a table, ``results.json``, PNG plots and ``summary.md`` to ``--out``.
Sub-commands: ``train`` (``python -m compare train --backend dali --data DIR --epochs 2``),
``doctor`` (``python -m compare doctor``: /dev/shm, workers, pinned memory, CUDA, DALI) and
``fuzz`` (``python -m compare fuzz``: mutated image files against every loader).

Which variants run:

* By default one per backend of ``--backends`` (default: every backend installed here).
  A backend listed twice runs once (a one-line note); an empty list (``--backends ,``) is refused.
* ``--preset seeds``: pageable, pin-only, pinned (2 streams) and dali, restricted to the
  ``--backends`` given. A preset is a fixed set of variants, so ``--preset`` with ``--sweep``
  is refused.
* ``--sweep "KEY=V1,V2 ..."``: every combination, per backend. A key is swept only on the
  backends that honour it: ``workers``, ``prefetch`` on all; ``streams``, ``pinmode`` on pinned;
  ``hw``, ``pipes``, ``mmap``, ``prealloc`` on dali. A backend runs once for the keys it does
  not honour (a note says "no effect on <backend>"), so identical setups are never timed twice;
  a key that no backend of the run honours is refused. ``pin=on,off`` picks pinned / pageable:
  without ``--backends`` it chooses them, with ``--backends`` it must name the same torch
  backends (``--sweep pin=on,off --backends dali`` is refused). Repeated values run once.

NOTE [one validation pass, incremental results]
Every input is checked before the first timed batch (and, where the answer does not need its
files, before the default dataset is generated): each variant's ``LoaderConfig`` (so a sweep
value the config refuses is caught up front), the dataset against the batch size and
last-batch policy (listed once), the model, the transform, and that ``--out`` can be written.
An error is one line naming the option and the variant; exit status 2. While the suite runs,
``results.json`` (``"complete": false``) and ``summary.md`` are rewritten after each finished
variant, so a late failure loses nothing: it exits 1 with one line that says where the partial
results are, and leaves the traceback in ``error.log`` beside them.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional

import torch

from pipelines import Backend, LoaderConfig, available_backends

from . import cli
from .env import environment
from .models import parse_model
from .report import markdown, plots, table, warnings_for
from .results import SuiteResult
from .runner import (ORDER, PRESETS, Variant, make_step, parse_sweep, preset, run_ceiling,
                     run_variant)

PROG = "python -m compare"


def default_cache() -> Path:
    base = os.environ.get("GPU_FEED_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "gpu-feed")
    return Path(base)


def default_gen_config(num_images: int):
    """The ``GenConfig`` of the default dataset (in the cache); nothing is written yet."""
    from data_gen.generate import GenConfig

    out = default_cache() / f"default-{num_images}-seed0"
    try:
        return GenConfig(out=str(out), num_images=num_images, classes=max(1, min(100, num_images)),
                         seed=0)
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
    """``"module:name"`` -> the transform it names, as the flat v2 Compose ``LoaderConfig`` keeps.

    The name may hold a v2 or v1 ``Compose``, a single transform, an ``nn.Sequential`` of
    transforms, or a function of no arguments that returns one of these.
    """
    import importlib
    import inspect

    from pipelines.migrate import check_transform

    mod, _, name = ref.partition(":")
    try:
        obj = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"--transform {ref!r} cannot be loaded ({e}); use MODULE:NAME") from None
    if inspect.isfunction(obj):
        try:
            obj = obj()
        except TypeError as e:
            raise ValueError(f"--transform {ref!r} is a function that needs arguments ({e}); "
                             "name a transform or a function of no arguments") from None
    try:
        return check_transform(obj)
    except (TypeError, ValueError) as e:
        raise ValueError(f"--transform {ref!r}: {e}") from None


def parse_args(argv):
    cuda = torch.cuda.is_available()
    p = cli.Parser(prog=PROG, description=__doc__,
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="ImageFolder root (default: generate one into the cache)")
    p.add_argument("--num-images", type=int, default=8000 if cuda else 1000,
                   help="size of the default generated dataset")
    p.add_argument("--backends", default=None,
                   help="comma list of dali,pinned,pageable (default: all available)")
    p.add_argument("--preset", choices=PRESETS,
                   help="seeds: pageable, pin-only, pinned, dali (restricted to --backends; "
                        "not with --sweep)")
    p.add_argument("--sweep", help="e.g. 'workers=0,4,8,16 pin=on,off' or 'hw=0,1.0 pipes=1,2'. "
                   "Keys: workers, prefetch (every backend); streams, pinmode (pinned); hw, pipes, "
                   "mmap, prealloc (dali); pin=on/off picks pinned/pageable. A key runs only on "
                   "the backends it applies to: the others run once, noted 'no effect on "
                   "<backend>'; a key that applies to no backend of the run is refused")
    p.add_argument("--model", default="resnet50" if cuda else "tinycnn",
                   help="none, tinycnn, resnet18, resnet50, vit_b_16, vit_l_16 or synthetic:<ms>")
    p.add_argument("--batch-size", type=int, default=256 if cuda else 32)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--mode", choices=["train", "eval"], default="train")
    p.add_argument("--steps", type=int, default=50 if cuda else 5)
    p.add_argument("--warmup", type=int, default=10 if cuda else 2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=None, help="default: CPU cores - 2")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   default="bfloat16" if cuda else "float32")
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--on-bad-file", choices=["error", "skip"], default="error",
                   help="a file that is not a decodable image: stop with its name (error) or "
                        "replace it within its batch and count it (skip)")
    p.add_argument("--out", default="runs/compare", help="output directory")
    p.add_argument("--no-ceiling", action="store_true", help="skip the model-only ceiling run")
    p.add_argument("--transform", metavar="MODULE:NAME",
                   help="your torchvision v2 Compose (e.g. compare.recipes:color_aug): the torch "
                        "backends run it as is, DALI runs its translation")
    return p.parse_args(argv)


@dataclass
class Plan:
    """Everything the run needs, checked: the variants with their configs, and ``--out``."""

    variants: List[Variant]
    configs: List[LoaderConfig]
    base: LoaderConfig
    out: Path
    gen: object = None  # the default dataset's GenConfig, when --data is not given
    classes: int = 0  # classes in --data (0 until the default dataset is listed)
    notes: List[str] = field(default_factory=list)


def _variants(a, note: Callable[[str], None]) -> List[Variant]:
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
    variants = _variants(a, note)
    transform = load_transform(a.transform) if a.transform else None
    gen = None if a.data else default_gen_config(a.num_images)
    base = cli.loader_config(
        root=a.data if a.data else gen.out, batch_size=a.batch_size,
        augment=cli.augment(mode=a.mode, size=a.image_size), num_workers=a.workers,
        dtype=a.dtype, channels_last=a.device.startswith("cuda"), device=a.device,
        last_batch="drop", seed=0, transform=transform, on_bad_file=a.on_bad_file,
    )
    configs = []
    for v in variants:
        try:
            configs.append(base.replace(**v.overrides))
        except (ValueError, TypeError) as e:
            raise cli.option_error(e, {**cli.FLAGS, **v.options}, _where(v)) from None
    if transform is not None and any(v.backend is Backend.DALI for v in variants):
        from pipelines.migrate import from_torchvision

        try:
            from_torchvision(transform)  # fail now, with the list of untranslatable transforms
        except ValueError as e:
            raise ValueError(f"--transform {a.transform} (for dali): {e}") from None
    classes = 0
    if gen is None:
        paths, names = cli.list_dataset(a.data, allow_empty=base.allow_empty_classes)
        check_dataset(len(paths), variants, configs)
        classes = len(names)
    elif not Path(gen.out).exists():  # about to be generated: check its size first
        check_dataset(gen.num_images, variants, configs)
    out = cli.writable_dir(a.out, "--out")
    return Plan(variants, configs, base, out, gen, classes)


def check_dataset(n: int, variants: List[Variant], configs: List[LoaderConfig]) -> None:
    """Every variant gets at least one batch per epoch from ``n`` images (``check_nonempty``)."""
    for v, cfg in zip(variants, configs):
        cli.check_batches(n, cfg, {**cli.FLAGS, **v.options}, _where(v))


def prepare(p: Plan, a, log):
    """Make (or reuse) the default dataset and check it as ``--data`` is; build the model step."""
    root, classes = p.base.root, p.classes
    if p.gen is not None:
        root = default_dataset(p.gen, log)
        paths, names = cli.list_dataset(root, allow_empty=p.base.allow_empty_classes)
        check_dataset(len(paths), p.variants, p.configs)
        classes = len(names)
    return Path(root), make_step(a.model, p.base, classes)


def run(argv=None) -> int:
    a = parse_args(argv)
    log = lambda s: print(s, flush=True)  # noqa: E731
    notes: List[str] = []
    say = cli.note(PROG)

    def note(msg: str) -> None:
        notes.append(msg)
        say(msg)

    try:
        p = plan(a, note)
        p.notes = notes
        root, step = prepare(p, a, log)
    except (ValueError, TypeError, ImportError) as e:
        return cli.fail(PROG, e)
    return execute(a, p, root, step, log)


def execute(a, p: Plan, root: Path, step, log) -> int:
    """Run the planned variants, rewriting the results after each one (see the NOTE)."""
    from data_gen.generate import read_manifest

    base, out = p.base, p.out
    man = read_manifest(root)
    setup = {
        "data": str(root), "dataset": (man or {}).get("stats", {}), "model": a.model,
        "batch_size": a.batch_size, "steps": a.steps, "warmup": a.warmup, "repeats": a.repeats,
        "dtype": a.dtype, "channels_last": base.channels_last, "workers": base.num_workers,
        "prefetch": base.prefetch, "on_bad_file": base.on_bad_file.value,
        "augment": repr(base.transform) if base.transform is not None else repr(base.augment),
        "device": a.device, "variants": [v.label for v in p.variants], "notes": list(p.notes),
    }
    env = environment()
    results: list = []
    captured: list = []
    ceiling: Optional[object] = None

    def save(complete: bool, error: Optional[str] = None) -> SuiteResult:
        suite = SuiteResult(env, {**setup, **({"error": error} if error else {})}, ceiling,
                            tuple(results), complete=complete)
        suite.dump(out / "results.json")
        (out / "summary.md").write_text(markdown(suite))
        return suite

    def late(code: int, why: str, tb: Optional[str] = None) -> int:
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
                (out / "error.log").write_text(tb)
                where += f"; traceback in {out / 'error.log'}"
            except OSError:
                pass
        return cli.fail(PROG, why + where, code)

    log(f"running {len(p.variants)} variants x {a.repeats} repeats, model {a.model}, "
        f"batch {a.batch_size}, {a.steps} steps (+{a.warmup} warm-up), workers {base.num_workers}")
    t0 = time.perf_counter()
    stage = "setup"
    try:
        for v in p.variants:
            stage = _where(v)
            want = None if (captured or a.no_ceiling or a.model == "none") else captured
            results.append(run_variant(v, base, step, steps=a.steps, warmup=a.warmup,
                                       repeats=a.repeats, log=log, capture=want))
            save(False)
        if captured:
            stage = "the ceiling run"
            ceiling = run_ceiling(captured[0], step, steps=a.steps, warmup=a.warmup,
                                  repeats=a.repeats, device=captured[0][0].device, log=log)
    except KeyboardInterrupt:
        return late(130, f"interrupted during {stage}")
    except Exception as e:  # noqa: BLE001 - reported in one line, traceback kept in error.log
        return late(1, f"{stage} failed: {type(e).__name__}: {e}", traceback.format_exc())
    suite = save(True)
    (out / "error.log").unlink(missing_ok=True)  # a stale one from an earlier failed run
    pngs = plots(suite, out)
    print()
    print(table(suite))
    for w in warnings_for(suite):
        print(f"warning: {w}")
    print(f"\nwrote {out / 'results.json'}, {out / 'summary.md'}, "
          f"{', '.join(str(p) for p in pngs)} in {time.perf_counter() - t0:.0f}s")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "doctor":
        from .doctor import main as doctor_main

        return doctor_main(argv[1:])
    if argv and argv[0] == "train":
        from .train import main as train_main

        return train_main(argv[1:])
    if argv and argv[0] == "fuzz":
        from .fuzz import main as fuzz_main

        return fuzz_main(argv[1:])
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
