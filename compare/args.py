"""``python -m compare [run]``: which backend keeps my GPU busy, and by how much?

Runs every backend on the same files, AugmentSpec, batch size, model, steps and warm-up and
writes a table, ``results.json``, PNG plots and ``summary.md`` to ``--out``.

Commands (``python -m compare COMMAND --help`` for each):
  run      time every backend on the same files and model (the default; these options)
  doctor   check /dev/shm, workers, pinned memory, CUDA and DALI on this machine
  diff     compare two results.json: faster, slower or no significant difference
  scaling  a run with more ranks against one with fewer: speed-up and efficiency
  plot     redraw the PNGs of a results.json
  report   write the summary of a results.json again, with this version's report

Under ``torchrun --nproc_per_node N -m compare ...`` every rank runs every variant on its shard
with a DDP step; ``--batch-size`` and ``--workers`` are per rank.

Which variants run:

* By default one per backend of ``--backends`` (default: every backend installed here).
* ``--preset seeds``: pageable, pin-only and pinned (2 streams) on the PIL decoder, pinned
  torchvision, pinned scaled and dali; ``--preset large``: pageable, pinned, pinned torchvision, dali,
  dali one pipeline and dali hw 0 on 2000-4000 px photos. Not with ``--sweep``.
* ``--sweep "KEY=V1,V2 ..."``: every combination, per backend. A key is ``num_workers`` or a
  field of ``TorchOptions``/``DaliOptions`` (booleans on/off); ``pin=on,off`` picks pinned /
  pageable. A key runs only on the backends that honour it (the others once, noted); a key no
  backend of the run honours is refused.

NOTE [one validation pass, incremental results]
Every input (each variant's config, the dataset, model, transform, RANK/WORLD_SIZE, ``--out``)
is checked before the first timed batch: an error is one line, exit status 2. ``results.json``
(``"complete": false``) and ``summary.md`` are rewritten after each variant, so a late failure
exits 1, keeps the partial results and writes the traceback to ``error.log``. ``--resume`` runs
what an isolated run did not finish.
"""
from __future__ import annotations

import argparse

from . import cli
from .cli import PRESETS
from .probes import PROBES

# NOTE [fast --help]: parsing imports no torch; machine-dependent defaults are ``None`` until
# ``fill_defaults``.
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


SHORT_DESCRIPTION = """\
``python -m compare [run]``: which backend keeps my GPU busy, and by how much?

Times every backend on the same files, augmentation, batch size, model, steps and warm-up, and
writes a table, results.json, PNG plots and summary.md (the verdict first) to --out."""

EPILOG = """\
other commands (python -m compare COMMAND --help): doctor (check this machine), diff (two
results.json: faster, slower or no difference), report (the summary again), scaling,
plot. Multi-GPU: torchrun ... -m compare. --help-all: every option (the lab ones too), how
presets and sweeps pick the variants, and what is checked before timing. A training loop to
copy: examples/train.py in the repository."""

# NOTE [short and full help]: ``--help`` fits one screen and hides the lab options;
# ``--help-all`` builds the parser again with every option, its full help and ``__doc__``.


class HelpAll(argparse.Action):
    """``--help-all``: print the full help (every option, the long texts) and exit 0."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        build_parser(full=True).print_help()
        parser.exit()


def build_parser(full: bool = False) -> argparse.ArgumentParser:
    """The parser of ``python -m compare [run]`` (``full``: the ``--help-all`` one)."""
    p = cli.Parser(prog=PROG, description=__doc__ if full else SHORT_DESCRIPTION,
                   epilog=None if full else EPILOG, formatter_class=cli.HelpFormatter,
                   usage=None if full else
                   "%(prog)s [run] [--data DIR] [--backends LIST] [--out DIR] [options]\n"
                   "       %(prog)s COMMAND ...   (doctor, diff, report, ...)",
                   see="--help, or --help-all for every option")

    def add(*names, short=None, lab=False, **kw):
        """An option; ``short``: its ``--help`` text; ``lab``: only in ``--help-all``."""
        if not full:
            kw["help"] = argparse.SUPPRESS if lab else (short or kw.get("help"))
        p.add_argument(*names, **kw)

    p.add_argument("--help-all", action=HelpAll, help="show every option, the lab ones included, and exit")
    add("--data", metavar="DIR",
        short="ImageFolder, file list or shards (default: generated)",
        help="ImageFolder root, file list or tar shards (default: generate one into the cache)")
    add("--num-images", type=int, default=None, metavar="N",
        help=f"size of the default generated dataset ({_auto('num_images')})")
    add("--backends", default=None, metavar="LIST",
        short="dali,pinned,pageable (default: all installed)",
        help="comma list of dali,pinned,pageable (default: all available)")
    add("--preset", choices=PRESETS,
        short="seeds (the README's table) or large (big photos)",
        help="seeds: pageable, pin-only and pinned with the PIL decoder, pinned torchvision, pinned "
             "scaled, dali; large: pageable, pinned, pinned torchvision, dali, dali one pipeline, dali "
             "hw 0 (no hardware decoder) on a default set of 2000-4000 px photos, batch 64 with CUDA "
             "unless given (restricted to --backends; not with --sweep)")
    add("--sweep", metavar="SPEC",
        short="every combination, e.g. 'num_workers=4,8 pin=on,off'",
        help="e.g. 'num_workers=0,4,8 pin=on,off' or 'hw_decoder_load=0,1 pipelines=1,2'; ' | ' joins "
             "sweeps ('hw_decoder_load=0 run_on=off | hw_decoder_load=1 pipelines=1,2': three variants). "
             "Keys: num_workers and the fields of TorchOptions and DaliOptions; pin=on/off picks "
             "pinned/pageable. A key runs only on the backends it applies to: the others run once, noted "
             "'no effect on <backend>'; a key that applies to no backend of the run is refused")
    add("--model", default=None,
        short=f"none, tinycnn, resnet50, ... or synthetic:<ms> ({_auto('model')})",
        help=f"none, tinycnn, resnet18, resnet50, vit_b_16, vit_l_16 or synthetic:<ms> ({_auto('model')})")
    add("--batch-size", type=int, default=None, metavar="N", help=_auto("batch_size"))
    add("--image-size", type=int, default=224, metavar="PX", help="output side in pixels")
    add("--mode", choices=["train", "eval"], default="train",
        help="train: random-resized-crop and flip; eval: resize and centre crop")
    add("--steps", type=int, default=None, metavar="N", help=_auto("steps"))
    add("--warmup", type=int, default=None, metavar="N", help=_auto("warmup"))
    add("--repeats", type=int, default=3, metavar="N", help="timed repeats per variant")
    add("--workers", type=int, default=None, metavar="N", help="default: cores - 2 (all on 2 or fewer)")
    add("--dtype", choices=["float32", "bfloat16", "float16"], default=None, help=_auto("dtype"))
    add("--device", default=None, help=_auto("device"))
    add("--on-bad-file", choices=["error", "skip"], default="error",
        short="stop at an undecodable file, or skip (replace and count) it",
        help="a file that is not a decodable image: stop with its name (error) or "
             "replace it within its batch and count it (skip)")
    add("--out", default="runs/compare", metavar="DIR", help="output directory")
    add("--resume", action="store_true",
        short="finish the stopped run in --out (same command)",
        help="run the repeats that an isolated run in --out did not finish (a time limit, "
             "a lost machine), in its order, into the same results.json; the command, "
             "dataset, machine and software must be the same (compare.resume)")
    add("--details", action="store_true",
        help="also the research sections: spreads, timed windows, the probes' sections")
    add("--no-ceiling", action="store_true", help="skip the model-only ceiling run")
    add("--transform", metavar="MODULE:NAME",
        short="your torchvision v2 Compose; DALI translates it",
        help="your torchvision v2 Compose (e.g. compare.examples:color_aug): the torch "
             "backends run it as is, DALI runs its translation")
    add("--step", metavar="MODULE:NAME",
        short="your step(images, labels), or a factory call",
        help="your own training step, a callable step(images, labels), or a factory "
             "written as a call: e.g. \"compare.steps:compiled(model='resnet50')\" "
             "(compare.userstep); --model then only names it in the report")
    add("--mix", metavar="SPEC",
        short="batch MixUp/CutMix, e.g. mixup=0.2,cutmix=1.0",
        help="batch MixUp/CutMix on the device, every backend alike (pipelines.transforms.mix): "
             "e.g. \"mixup=0.2,cutmix=1.0\" (keys mixup, cutmix, switch, prob, "
             "smoothing); labels become soft targets")
    add("--reference", action="store_true",
        short="add the plain ImageFolder+PIL and DALI reader rows",
        help="add a row for each plain recipe: with a torch backend, torchvision.datasets.ImageFolder + "
             "PIL + the same v2 transforms, a DataLoader with no pinning and blocking copies, to check "
             "pageable against it; with dali, DALI's file reader recipe (compare.reference)")
    add("--isolate", action=argparse.BooleanOptionalAction, default=None,
        short="each repeat in a fresh process (default: on with CUDA)",
        help="run each (variant, repeat) and each ceiling repeat in a fresh process, "
             "in a seeded interleaved order (compare.isolate; default: on with CUDA, "
             "off without; always off under torchrun)")
    # the lab options: in --help-all only (NOTE [short and full help])
    add("--order-seed", type=int, default=0, metavar="N", lab=True,
        help="the seed of the interleaved order of --isolate (recorded)")
    for probe in PROBES:  # one file each in compare/probes
        probe.add_arguments(add)
    return p


def parse_args(argv):
    """The options of ``python -m compare [run]``, machine-dependent defaults filled in."""
    return fill_defaults(build_parser().parse_args(argv))
