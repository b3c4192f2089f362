"""``--step MODULE:NAME``: time your own ``step(images, labels)`` instead of a built-in model;
``MODULE:NAME(key=literal, ...)`` names a factory called once for the step. Example:
``compare.steps``.
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
            raise ValueError(f"--step {ref!r}: calling {name} failed ({type(e).__name__}: {e})") from None
    if not callable(obj):
        raise ValueError(f"--step {ref!r} is a {type(obj).__name__}, not a callable step(images, labels)")
    try:
        inspect.signature(obj).bind(None, None)
    except TypeError:
        raise ValueError(f"--step {ref!r} must take (images, labels); write it as a call, "
                         f"MODULE:{name}(key=literal, ...), if {name} builds the step") from None
    except ValueError:  # a builtin without a signature: taken as it is
        pass
    return obj
