"""``python -m compare [run]``: which backend keeps my GPU busy, and by how much?

Runs every backend on the same files, AugmentSpec, batch size, model, steps and warm-up and
writes a table, ``results.json``, PNG plots and ``summary.md`` to ``--out``.

Commands (``python -m compare COMMAND --help`` for each):
  run      time every backend on the same files and model (the default; these options)
  train    a short training run through one backend
  doctor   check /dev/shm, workers, pinned memory, CUDA and DALI on this machine
  memory   device and host memory of each backend over epochs
  diff     compare two results.json: faster, slower or no significant difference
  scaling  a run with more ranks against one with fewer: speed-up and efficiency
  plot     redraw the PNGs of a results.json
  report   write the summary of a results.json again, with this version's report
  fuzz     mutated image files against every loader

Under ``torchrun --nproc_per_node N -m compare ...`` every rank runs every variant on its shard
with a DDP model step, on ``cuda:LOCAL_RANK``; rank 0 writes the job's totals and each rank's
figures (``compare.ddp``). ``--batch-size`` and ``--workers`` are per rank.

Which variants run:

* By default one per backend of ``--backends`` (default: every backend installed here).
  A backend listed twice runs once (a one-line note); an empty list (``--backends ,``) is refused.
* ``--preset seeds``: pageable, pin-only and pinned (2 streams) on the PIL decoder, pinned
  torchvision, pinned scaled and dali; ``--preset large``: pageable, pinned (torchvision's
  decoder), pinned scaled, dali, dali hw 1 x2 (the hardware decoder, two pipelines; dropped
  with a note below two workers) and dali calibrated on a default set of 2000-4000 px photos.
  Either is restricted to the ``--backends`` given. A preset is a fixed set of variants, so
  ``--preset`` with ``--sweep`` is refused.
* ``--sweep "KEY=V1,V2 ..."``: every combination, per backend. A key is ``num_workers`` or a
  field of a backend's options (``TorchOptions``: prefetch_factor, persistent_workers, and for
  pinned queue_depth, streams, cpu_binding; ``DaliOptions``: queue_depth, reader_threads,
  hw_decoder_load, pipelines, use_mmap, ...; booleans are on/off). A key is swept only on the
  backends that honour it. A backend runs once for the keys it does
  not honour (a note says "no effect on <backend>"), so identical setups are never timed twice;
  a key that no backend of the run honours is refused. ``pin=on,off`` picks pinned / pageable:
  without ``--backends`` it chooses them, with ``--backends`` it must name the same torch
  backends (``--sweep pin=on,off --backends dali`` is refused). Repeated values run once.
  Example: ``--sweep "num_workers=4,8 hw_decoder_load=0,1"``.

NOTE [one validation pass, incremental results]
Every input is checked before the first timed batch (and, where the answer does not need its
files, before the default dataset is generated): each variant's ``LoaderConfig`` (so a sweep
value the config refuses is caught up front), the dataset against the batch size and
last-batch policy (listed once, under the run's ``--on-bad-file``), the model, the transform,
``RANK`` and ``WORLD_SIZE`` (both or neither), and that ``--out`` can be written, lies outside
``--data`` (by real paths: ``cd DATA; python -m compare --data .`` is refused) and holds no
file at a name the run writes that the suite did not write (compare.owned).
An error is one line naming the option and the variant; exit status 2. While the suite runs,
``results.json`` (``"complete": false``) and ``summary.md`` are rewritten after each finished
variant, so a late failure loses nothing: it exits 1 with one line that says where the partial
results are, and leaves the traceback in ``error.log`` beside them (``error-N.log`` when
``error.log`` is a file the suite did not write: it is never replaced, nor deleted by a later
successful run; compare.owned NOTE [files the suite owns]).
"""
from __future__ import annotations

import argparse

from . import cli
from .cli import PRESETS

# NOTE [fast --help]: the options are parsed without importing torch, so ``--help`` and usage
# errors return at once. Defaults that depend on the machine are ``None`` in the parser and
# filled in by ``fill_defaults`` (which imports torch) once the run starts; the help shows both.
PROG = "python -m compare"
AUTO = {  # option -> (default with CUDA, default without)
    "num_images": (8000, 1000), "model": ("resnet50", "tinycnn"), "batch_size": (256, 32),
    "steps": (50, 5), "warmup": (10, 2), "dtype": ("bfloat16", "float32"),
    "device": ("cuda", "cpu"),
}


def fill_defaults(a: argparse.Namespace) -> argparse.Namespace:
    """Fill the machine-dependent defaults the user did not give (imports torch)."""
    a.given_num_images = a.num_images  # --preset large has its own defaults (compare.suite)
    a.given_batch_size = a.batch_size
    a.given_steps = a.steps  # not given: each window holds FIT_QUEUES x its queue (runner.window)
    if any(getattr(a, k) is None for k in AUTO):
        import torch

        cuda = torch.cuda.is_available()
        for k, (gpu, cpu) in AUTO.items():
            if getattr(a, k) is None:
                setattr(a, k, gpu if cuda else cpu)
    return a


def _auto(key: str) -> str:
    gpu, cpu = AUTO[key]
    return f"default: {gpu} with CUDA, {cpu} without"


def parse_args(argv):
    p = cli.Parser(prog=PROG, description=__doc__, formatter_class=cli.HelpFormatter)
    p.add_argument("--data", help="ImageFolder root (default: generate one into the cache)")
    p.add_argument("--num-images", type=int, default=None,
                   help=f"size of the default generated dataset ({_auto('num_images')})")
    p.add_argument("--backends", default=None,
                   help="comma list of dali,pinned,pageable (default: all available)")
    p.add_argument("--preset", choices=PRESETS,
                   help="seeds: pageable, pin-only and pinned with the PIL decoder, pinned "
                        "torchvision, pinned scaled, dali; large: pageable, pinned "
                        "(torchvision's decoder), pinned scaled, dali, dali hw 1 x2 (hardware decoder, "
                        "two pipelines), dali calibrated on a "
                        "default set of 2000-4000 px photos, batch 64 with CUDA unless given "
                        "(restricted to --backends; not with --sweep)")
    p.add_argument("--sweep", help="e.g. 'num_workers=0,4,8 pin=on,off' or 'hw_decoder_load=0,1 "
                   "pipelines=1,2'; ' | ' joins sweeps ('hw_decoder_load=0 run_on=off | "
                   "hw_decoder_load=1 pipelines=1,2': three variants). Keys: num_workers and the "
                   "fields of TorchOptions and DaliOptions; pin=on/off picks pinned/pageable. "
                   "A key runs only on the backends it applies to: the others run once, noted 'no effect on "
                   "<backend>'; a key that applies to no backend of the run is refused")
    p.add_argument("--model", default=None,
                   help="none, tinycnn, resnet18, resnet50, vit_b_16, vit_l_16 or synthetic:<ms> "
                        f"({_auto('model')})")
    p.add_argument("--batch-size", type=int, default=None, help=_auto("batch_size"))
    p.add_argument("--image-size", type=int, default=224, help="output side in pixels")
    p.add_argument("--mode", choices=["train", "eval"], default="train",
                   help="train: random-resized-crop and flip; eval: resize and centre crop")
    p.add_argument("--steps", type=int, default=None, help=_auto("steps"))
    p.add_argument("--warmup", type=int, default=None, help=_auto("warmup"))
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per variant")
    p.add_argument("--workers", type=int, default=None, help="default: CPU cores - 2")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help=_auto("dtype"))
    p.add_argument("--device", default=None, help=_auto("device"))
    p.add_argument("--on-bad-file", choices=["error", "skip"], default="error",
                   help="a file that is not a decodable image: stop with its name (error) or "
                        "replace it within its batch and count it (skip)")
    p.add_argument("--out", default="runs/compare", help="output directory")
    p.add_argument("--no-ceiling", action="store_true", help="skip the model-only ceiling run")
    p.add_argument("--transform", metavar="MODULE:NAME",
                   help="your torchvision v2 Compose (e.g. compare.recipes:color_aug): the torch "
                        "backends run it as is, DALI runs its translation")
    p.add_argument("--step", metavar="MODULE:NAME",
                   help="your own training step, a callable step(images, labels), or a factory "
                        "written as a call: e.g. \"compare.steps:compiled(model='resnet50')\" "
                        "(compare.userstep); --model then only names it in the report")
    p.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                   help="run each (variant, repeat) and each ceiling repeat in a fresh process, "
                        "in a seeded interleaved order (compare.isolate; default: on with CUDA, "
                        "off without; always off under torchrun)")
    p.add_argument("--order-seed", type=int, default=0,
                   help="the seed of the interleaved order of --isolate (recorded)")
    p.add_argument("--reference", action="store_true",
                   help="add a row for each plain recipe: with a torch backend, "
                        "torchvision.datasets.ImageFolder + PIL + the same v2 transforms, a "
                        "DataLoader with no pinning and blocking copies, to check pageable "
                        "against it; with dali, DALI's file reader recipe (compare.reference)")
    p.add_argument("--long", action="store_true",
                   help="time a window of at least 10x each loader's queue, across an epoch "
                        "boundary (the steady-state check)")
    p.add_argument("--paired-long", action="store_true",
                   help="the steady-state check in one process: each repeat also times a "
                        "--long pair of windows on the same loader, between its default pair "
                        "and a second one, and the summary gives long / default per row, with "
                        "the drift within the process taken out "
                        "(compare.runner NOTE [paired long])")
    p.add_argument("--loader-only-last", action="store_true",
                   help="time the loader alone after the model step, not before it, with the "
                        "DataLoader workers as training left them (compare.runner NOTE "
                        "[loader-only last]); the summary and diff say which")
    p.add_argument("--trace", action="store_true",
                   help="after the first repeat of each variant (and of the ceiling), trace one "
                        "more training window with torch.profiler into OUT/trace: the waits, "
                        "the CUDA calls and stream activity in flight during the long ones; "
                        "its numbers are not in the results")
    p.add_argument("--wait-sites", action="store_true",
                   help="sample the training loop's Python stack while it waits for data and "
                        "list, per row, where it waited: DALI's share_outputs, the "
                        "DataLoader's queue, a CUDA event (compare.waitsites)")
    p.add_argument("--cold", action="store_true",
                   help="evict the dataset's files from the page cache before each timed run "
                        "(posix_fadvise, no root) and check with mincore that it took "
                        "(compare.pagecache); refused before timing where it cannot take (tmpfs), "
                        "and the report marks a row cold only where every eviction took")
    p.add_argument("--compute-stream", choices=("default", "side", "high"), default="default",
                   help="the CUDA stream the model step runs on: the default stream (as a plain "
                        "script has it), a new stream (side) or a new one at the highest "
                        "priority (high), so the loader's GPU work yields to the step "
                        "(compare.runner.ComputeStream; recorded)")
    p.add_argument("--mix", metavar="SPEC",
                   help="batch MixUp/CutMix on the device, every backend alike (pipelines.mix): "
                        "e.g. \"mixup=0.2,cutmix=1.0\" (keys mixup, cutmix, switch, prob, "
                        "smoothing); labels become soft targets")
    return fill_defaults(p.parse_args(argv))


