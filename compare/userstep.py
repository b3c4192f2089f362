"""``--step MODULE:NAME``: time your own training step instead of a built-in model.

The name holds the step, a callable ``step(images, labels)`` that runs one training step on a
batch already on the device (any model, optimiser, AMP, ``torch.compile``, DDP); what it
returns is ignored. Written as a call, ``MODULE:NAME(key=literal, ...)``, the name is a factory
called once with those arguments, and its result is the step. The suite times it exactly as it
times a built-in model: after every loader's batches, and on a batch already on the device for
the ceiling. ``compare.steps`` has an example.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable

from . import cli


def load_step(ref: str) -> Callable:
    """The step ``ref`` names (module doc), or a ``ValueError`` naming ``--step``."""
    obj, kwargs, called, name = cli.load_ref(ref, "--step")
    if called:
        try:
            obj = obj(**kwargs)
        except Exception as e:  # noqa: BLE001 - the user's factory raised: one line naming it
            raise ValueError(f"--step {ref!r}: calling {name} failed "
                             f"({type(e).__name__}: {e})") from None
    if not callable(obj):
        raise ValueError(f"--step {ref!r} is a {type(obj).__name__}, not a callable "
                         "step(images, labels)")
    try:
        inspect.signature(obj).bind(None, None)
    except TypeError:
        raise ValueError(f"--step {ref!r} must take (images, labels); write it as a call, "
                         f"MODULE:{name}(key=literal, ...), if {name} builds the step") from None
    except ValueError:  # a builtin without a signature: taken as it is
        pass
    return obj
