"""What the suite runs: variants (a backend plus loader-only overrides), the presets, and
``--sweep`` parsed into variants."""
from __future__ import annotations

import enum
import itertools
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pipelines import Backend, LoaderConfig
from pipelines.config import Decoder
from pipelines.factory import options_for
from pipelines.options import Options, literal_words, value_type

from .cli import PRESETS

# What a variant may change: how data is loaded (``num_workers`` and the backend's options).
CONFIG_KEYS = ("num_workers",)


def _option_types(b: Backend) -> dict[str, object]:
    return options_for(b).option_types()


def honours(b: Backend, key: str) -> bool:
    """Whether backend ``b`` has a knob ``key`` with an effect on it."""
    if key in CONFIG_KEYS:
        return True
    cls = options_for(b)
    return key in cls.option_types() and b.value in cls.honoured_by(key)


@dataclass(frozen=True)
class Variant:
    """A backend plus loader-only overrides; ``sources``: the command-line item that set each
    (``{"num_workers": "--sweep num_workers=4"}``), which a refused value's error names."""

    label: str
    backend: Backend
    overrides: dict[str, object] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    reference: bool = False  # --reference: a plain recipe of ``backend`` (compare.reference)

    @property
    def kind(self) -> str:
        """The results' ``backend`` field: the backend's name, or ``"reference"``."""
        return "reference" if self.reference else self.backend.value

    def __post_init__(self):
        allowed = set(CONFIG_KEYS) | set(_option_types(self.backend))
        extra = sorted(set(self.overrides) - allowed)
        if extra:  # apples to apples: a variant may only change how data is loaded
            raise ValueError(f"variant {self.label!r} overrides {extra}; only "
                             f"{sorted(allowed)} may differ between variants")

    def config_of(self, base: LoaderConfig) -> LoaderConfig:
        """``base`` with this variant's config overrides (validated)."""
        return base.replace(**{k: v for k, v in self.overrides.items() if k in CONFIG_KEYS})

    def options_of(self) -> Options:
        """This variant's backend options (validated, and refused where they have no effect)."""
        kw = {k: v for k, v in self.overrides.items() if k not in CONFIG_KEYS}
        return options_for(self.backend)(**kw).for_backend(self.backend.value)


ORDER = (Backend.PAGEABLE, Backend.PINNED, Backend.DALI)


def preset(name: str, backends: Sequence[Backend]) -> list[Variant]:
    """The variants of ``--preset name`` (``--help-all`` lists them), restricted to ``backends``."""
    if name not in PRESETS:
        raise ValueError(f"--preset {name!r} is unknown; choose one of {', '.join(PRESETS)}")
    src = {"streams": f"--preset {name}", "decoder": f"--preset {name}"}
    dec = lambda d: {"streams": 2, "decoder": d}  # noqa: E731
    if name == "large":  # the loaders' own defaults for large photos, and what they beat
        out = [Variant("pageable", Backend.PAGEABLE),
               Variant("pinned", Backend.PINNED),
               Variant("pinned torchvision", Backend.PINNED, {"decoder": Decoder.TORCHVISION},
                       {"decoder": f"--preset {name}"}),
               Variant("dali", Backend.DALI),
               Variant("dali one pipeline", Backend.DALI, {"pipelines": 1},
                       {"pipelines": f"--preset {name}"}),
               Variant("dali hw 0", Backend.DALI, {"hw_decoder_load": 0.0},
                       {"hw_decoder_load": f"--preset {name}"})]
    else:
        out = [Variant("pageable", Backend.PAGEABLE),
               Variant("pin-only", Backend.PINNED, {"streams": 0, "decoder": Decoder.PIL}, src),
               Variant("pinned", Backend.PINNED, dec(Decoder.PIL), src),
               Variant("pinned torchvision", Backend.PINNED, dec(Decoder.TORCHVISION), src),
               Variant("pinned scaled", Backend.PINNED, dec(Decoder.SCALED), src),
               Variant("dali", Backend.DALI)]
    return [v for v in out if v.backend in backends]


# NOTE [sweep keys]: each backend is swept over the keys it ``honours`` only (else identical
# setups would report noise as a speed-up); a key no backend honours is refused. ``pin`` picks
# backends (on = pinned, off = pageable) and must agree with --backends when given.
PIN = {"on": Backend.PINNED, "off": Backend.PAGEABLE}
WORDS = {"on": True, "off": False, "true": True, "false": False}


def sweep_keys() -> dict[str, object]:
    """Every sweep key and its type: ``num_workers``, then each backend's option fields."""
    keys: dict[str, object] = {"num_workers": int}
    for b in ORDER:
        for k, t in _option_types(b).items():
            keys.setdefault(k, t)
    return keys


def _names(backs) -> str:
    return ",".join(b.value for b in backs)


def _sweep_value(key: str, hint, raw: str):
    """One ``--sweep`` value, typed from the option's annotation."""
    if key == "pin":
        if raw not in PIN:
            raise ValueError(f"--sweep pin={raw} must be on or off")
        return raw
    args = typing.get_args(hint)
    if type(None) in args and raw.lower() == "none":
        return None
    if raw in literal_words(hint):  # hw_decoder_load=auto
        return raw
    hint = value_type(hint)
    if hint is bool:
        if raw.lower() not in WORDS:
            raise ValueError(f"--sweep {key}={raw} must be on or off")
        return WORDS[raw.lower()]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return raw  # the options class names the valid values
    try:
        return float(raw) if hint is float else int(raw)
    except ValueError:
        kind = "a number" if hint is float else "an int"
        raise ValueError(f"--sweep {key}={raw} must be {kind}") from None


def _axes(spec: str, note: Callable[[str], None]) -> dict[str, list[tuple[str, object]]]:
    """``"num_workers=0,4 pin=on"`` -> ``{key: [(raw, value), ...]}``, duplicates merged."""
    axes: dict[str, list[tuple[str, object]]] = {}
    types = {**sweep_keys(), "pin": str}
    keys = sorted(types)
    gone = {n: why for b in ORDER for n, why in options_for(b).removed.items()}
    for part in spec.split():
        k, eq, vals = part.partition("=")
        if k in gone:
            raise ValueError(f"--sweep {k} is an option that was removed: {gone[k]}")
        if k not in types or not eq or not vals:
            raise ValueError(f"--sweep item {part!r} is not KEY=V1,V2 with KEY in {keys}")
        if k in axes:
            note(f"--sweep {k} is given twice; its values are merged")
        for raw in vals.split(","):
            if not raw:
                raise ValueError(f"--sweep item {part!r} has an empty value")
            v = _sweep_value(k, types[k], raw)
            seen = axes.setdefault(k, [])
            if any(v == w for _, w in seen):
                note(f"--sweep {k} lists {raw} more than once; it runs once")
                continue
            seen.append((raw, v))
    if not axes:
        raise ValueError(f"--sweep {spec!r} names no KEY=V1,V2 item")
    return axes


def parse_sweep(spec: str, backends: Sequence[Backend], *, chosen: bool = False,
                note: Callable[[str], None] = lambda s: None) -> list[Variant]:
    """``"num_workers=0,4,8 pin=on,off"`` -> one variant per combination (NOTE [sweep keys]).

    Example: backends pageable,dali and ``"num_workers=2,4 hw_decoder_load=0,1"`` -> two
    ``pageable`` variants and four ``dali`` ones, and a note. ``" | "`` joins sweeps.

    Args:
        backends: the backends to sweep (``--backends``, or every one available).
        chosen: the user listed ``backends``: ``pin`` must agree with them.
        note: receives one-line notes (merged duplicates, keys with no effect on a backend).

    Raises:
        ValueError: naming the ``--sweep`` item.
    """
    if "|" in spec:
        out: list[Variant] = []
        for group in spec.split("|"):
            if not group.strip():
                raise ValueError(f"--sweep {spec!r} has an empty sweep between its '|'")
            for v in parse_sweep(group, backends, chosen=chosen, note=note):
                if any(v.backend is w.backend and v.overrides == w.overrides for w in out):
                    note(f"--sweep {v.label} is made by two of the '|' sweeps; it runs once")
                    continue
                out.append(v)
        return out
    axes = _axes(spec, note)
    pins = axes.pop("pin", None)
    backs = list(backends)
    if pins is not None:
        picked = [PIN[raw] for raw, _ in pins]
        torch_backs = [b for b in backs if b in PIN.values()]
        if not chosen:
            backs = picked
        elif set(picked) != set(torch_backs):
            raise ValueError(
                f"--sweep pin={','.join(r for r, _ in pins)} runs {_names(picked)} but "
                f"--backends is {_names(backs)}; pin only picks between pinned (on) and "
                "pageable (off): drop it or list the same backends")
    names = list(axes)
    for k in names:
        if not any(honours(b, k) for b in backs):
            owners = _names(b for b in ORDER if honours(b, k))
            raise ValueError(f"--sweep {k} sets {owners} only and has no effect on "
                             f"{_names(backs)}; add {owners} to --backends or drop {k}=")
    out = []
    for b in backs:
        mine = [k for k in names if honours(b, k)]
        idle = [k for k in names if k not in mine] + (["pin"] if pins and b not in PIN.values() else [])
        if idle:
            note(f"--sweep {', '.join(idle)}: no effect on {b.value}; it runs once")
        for combo in itertools.product(*(axes[k] for k in mine)):
            ov, src = {}, {}
            for k, (raw, v) in zip(mine, combo):
                ov[k], src[k] = v, f"--sweep {k}={raw}"
            label = b.value + "".join(f" {k}={raw}" for k, (raw, _) in zip(mine, combo))
            out.append(Variant(label, b, ov, src))
    return out
