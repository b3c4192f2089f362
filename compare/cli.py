"""Argument checks shared by every ``compare`` command: one-line errors that name the option
(``<prog>: error: <message>``, exit status 2). Loader options are checked by ``LoaderConfig``
itself; its message gets the option as prefix (``--batch-size: batch_size=0 must be ...``).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipelines import AugmentSpec, Backend, LoaderConfig

# ``pipelines`` (and so torch) is imported inside functions, so that ``--help`` stays fast.
PRESETS = ("seeds", "large")
BACKENDS = ("pageable", "pinned", "dali")  # pipelines.Backend's values, without importing it

# LoaderConfig / AugmentSpec field -> the command-line option that sets it.
FLAGS = {
    "root": "--data", "batch_size": "--batch-size", "num_workers": "--workers",
    "prefetch_factor": "--prefetch", "seed": "--seed", "dtype": "--dtype", "device": "--device",
    "on_bad_file": "--on-bad-file", "transform": "--transform", "size": "--image-size",
    "mode": "--mode", "mix": "--mix",
}

MIX_KEYS = {"mixup": "mixup_alpha", "cutmix": "cutmix_alpha", "switch": "switch_prob",
            "prob": "prob", "smoothing": "label_smoothing"}


def load_ref(ref: str, option: str):
    """``"module:name"`` or ``"module:name(key=literal, ...)"`` -> ``(object, kwargs, called,
    name)``; a ``ValueError`` naming ``option`` when it cannot be parsed or loaded."""
    import ast
    import importlib

    mod, _, name = ref.partition(":")
    kwargs, called = {}, "(" in name
    if called:
        try:
            call = ast.parse(name.strip(), mode="eval").body
            if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.args:
                raise ValueError("write NAME(key=value, ...)")
            name = call.func.id
            kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        except (SyntaxError, ValueError) as e:
            raise ValueError(f"{option} {ref!r}: the call is not NAME(key=literal, ...) ({e})") from None
    if not mod or not name:
        raise ValueError(f"{option} {ref!r} is not MODULE:NAME")
    try:
        obj = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"{option} {ref!r} cannot be loaded ({e}); use MODULE:NAME") from None
    except Exception as e:  # noqa: BLE001 - the user's module raised on import: one line
        raise ValueError(f"{option} {ref!r}: importing {mod} raised {type(e).__name__}: {e}") from None
    return obj, kwargs, called, name


def mix_spec(text: str | None):
    """``--mix "mixup=0.2,cutmix=1.0[,switch=0.5,prob=1,smoothing=0.1]"`` -> a ``MixSpec``."""
    if not text:
        return None
    from pipelines import MixSpec

    kw = {}
    for part in text.split(","):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or key not in MIX_KEYS:
            raise ValueError(f"--mix {text!r}: {part!r} is not KEY=VALUE with KEY one of "
                             f"{', '.join(MIX_KEYS)}")
        try:
            kw[MIX_KEYS[key]] = float(value)
        except ValueError:
            raise ValueError(f"--mix {text!r}: {key}={value!r} is not a number") from None
    try:
        return MixSpec(**kw)
    except ValueError as e:
        raise ValueError(f"--mix {text!r}: {e}") from None


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's layout and appends each option's default to its help."""

    def _get_help_string(self, action):
        h = action.help or ""
        if ("default" in h or action.default in (None, False, argparse.SUPPRESS)
                or not action.option_strings):
            return h
        return h + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """``argparse`` with one-line errors pointing at ``see`` (the help option), and every
    default in ``--help``."""

    def __init__(self, *args, see: str = "--help", **kw):
        kw.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kw)
        self.see = see

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.see})\n")


def fail(prog: str, err: object, code: int = 2) -> int:
    """Print ``err`` as one line on stderr; return ``code`` (2: a usage error)."""
    msg = " ".join(str(err).split("\n"))
    print(f"{prog}: error: {msg}", file=sys.stderr, flush=True)
    return code


def note(prog: str) -> Callable[[str], None]:
    """A one-line ``<prog>: note: ...`` printer (stderr, so JSON on stdout stays clean)."""
    return lambda msg: print(f"{prog}: note: {msg}", file=sys.stderr, flush=True)


def at_least(option: str, value: int, lo: int) -> int:
    """``value`` if it is ``>= lo``, else ``ValueError`` naming ``option``."""
    if value < lo:
        raise ValueError(f"{option} {value} must be >= {lo}")
    return value


def option_error(err: Exception, flags: Mapping[str, str] = FLAGS,
                 where: str = "") -> ValueError:
    """A ``LoaderConfig`` error prefixed by its option: ``"num_workers=-1 ..."`` ->
    ``"--workers (variant 'x'): num_workers=-1 ..."`` (``where="variant 'x'"``)."""
    msg = str(err)
    m = re.match(r"(\w+)=", msg)
    flag = flags.get(m.group(1)) if m else None
    head = " ".join(x for x in (flag, f"({where})" if where else "") if x)
    return ValueError(f"{head}: {msg}" if head else msg)


def loader_config(flags: Mapping[str, str] = FLAGS, **kw) -> LoaderConfig:
    """``LoaderConfig(**kw)``; its errors name the command-line option (see ``option_error``)."""
    from pipelines import LoaderConfig
    try:
        return LoaderConfig(**kw)
    except (ValueError, TypeError) as e:
        raise option_error(e, flags) from None


def augment(**kw) -> AugmentSpec:
    """``AugmentSpec(**kw)``; ``size`` errors name ``--image-size``, ``mode`` ``--mode``."""
    from pipelines import AugmentSpec
    try:
        return AugmentSpec(**kw)
    except (ValueError, TypeError) as e:
        raise option_error(e) from None


def parse_backends(spec: str, option: str = "--backends",
                   note: Callable[[str], None] | None = None) -> list[Backend]:
    """``"dali,pinned"`` -> backends, each once; ``ValueError`` for none, unknown or missing."""
    from pipelines import Backend, available_backends
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ValueError(f"{option} {spec!r} names no backend; give a comma list of "
                         f"{','.join(b.value for b in Backend)}")
    try:
        parsed = [Backend.parse(n) for n in names]
    except ValueError as e:
        raise ValueError(f"{option}: {e}") from None
    out = list(dict.fromkeys(parsed))
    if len(out) < len(parsed) and note:
        twice = sorted({b.value for b in parsed if parsed.count(b) > 1})
        note(f"{option} lists {', '.join(twice)} more than once; each runs once")
    avail = available_backends()
    missing = [b.value for b in out if b not in avail]
    if missing:
        raise ValueError(f"{option} {','.join(missing)}: not installed here (pip install 'gpu-feed[dali]')")
    return out


def writable_dir(path: str | os.PathLike, option: str = "--out") -> Path:
    """Create ``path`` and prove it can be written; else a ``ValueError`` naming ``option``."""
    p = Path(path)
    probe = p / f".gpu-feed-probe-{os.getpid()}"
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"{option} {str(p)!r} cannot be written ({e.strerror or e}); "
                         "choose another folder") from None
    return p


def list_dataset(root: str | os.PathLike, option: str = "--data",
                 allow_empty: bool = False, on_bad_file: object = "error"
                 ) -> tuple[list[str], list[str]]:
    """``(paths, classes)`` of any dataset root; under ``on_bad_file`` skip, bad rows are
    skipped as the loader will skip them; errors name ``option``."""
    from pipelines.sources.root import list_dataset as list_any
    skip = str(getattr(on_bad_file, "value", on_bad_file)) == "skip"
    try:
        paths, _, classes = list_any(root, allow_empty=allow_empty, skip_bad=skip)
    except ValueError as e:  # DatasetRootError: "root='...' does not exist"
        raise type(e)(f"{option}: {e}") from None
    return paths, classes


def check_batches(n: int, cfg: LoaderConfig, flags: Mapping[str, str] = FLAGS,
                  where: str = "") -> None:
    """Refuse ``cfg`` when an epoch of ``n`` samples would yield no batch (said in terms of
    ``--batch-size`` in the usual case: one rank, ``drop``)."""
    from pipelines import LastBatchPolicy
    from pipelines.epoch_plan import check_nonempty
    cfg = cfg.resolved()
    try:
        check_nonempty(n, cfg)
    except ValueError as e:
        if cfg.world_size > 1 or cfg.last_batch is not LastBatchPolicy.DROP:
            raise option_error(e, flags, where) from None
        flag = flags.get("batch_size", "batch_size")
        ctx = f" ({where})" if where else ""
        raise ValueError(f"{flag} {cfg.batch_size}{ctx} gives no batch: the dataset holds {n} "
                         f"images and the last, partial batch is dropped; use {flag} <= {n}"
                         ) from None


def check_dist_env() -> None:
    """Refuse ``RANK``/``WORLD_SIZE`` as the loader does (``pipelines.config.resolve``, NOTE
    [placement]): half of the pair, a value that is not an int, a rank outside the world size.
    Called before any rendezvous, which would otherwise wait for ranks that never come."""
    from pipelines import LoaderConfig
    from pipelines.config import resolve

    if any((os.environ.get(k) or "").strip() for k in ("RANK", "WORLD_SIZE")):
        resolve(LoaderConfig(root=".", device="cpu"))  # the loader's own ValueError, word for word


def data_folder(data: str | os.PathLike) -> Path | None:
    """The real folder ``--data`` reads, or ``None`` when it is not a folder."""
    p = Path(data)
    return Path(os.path.realpath(p)) if p.is_dir() else None


def outside_data(path: str | os.PathLike, data: str | os.PathLike, option: str,
                 data_option: str = "--data") -> None:
    """Refuse ``path`` (``--out``) inside the folder ``--data`` reads, by real paths: what is
    written there would become part of the dataset."""
    folder = data_folder(data)
    if folder is None:
        return
    real = Path(os.path.realpath(path))
    if real == folder or folder in real.parents:
        real_data = "" if str(folder) == str(data) else f" ({folder})"  # only when it adds
        raise ValueError(f"{option} {str(path)!r} is inside {data_option} {str(data)!r}{real_data}: what "
                         f"is written there would become part of the dataset; choose {option} outside it")
