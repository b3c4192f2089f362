"""Errors about a user's transform: refused by torchvision, refused by DALI, raised at run time.

Each refusal names the step by its position in the (flattened) Compose, its class, the parameter
and the reason, e.g. ``#3 Normalize (input dtype=torch.uint8: Normalize needs a float image;
put ToDtype(torch.float32, scale=True) before it)``.
"""
from __future__ import annotations

from typing import NamedTuple


class Problem(NamedTuple):
    """One refused step: its position, class name, the parameter and why."""

    pos: int
    name: str
    param: str
    reason: str

    def __str__(self) -> str:
        where = f"#{self.pos} {self.name}" if self.pos >= 0 else "the Compose"
        why = f"{self.param}: {self.reason}" if self.param else self.reason
        return f"{where} ({why})"


class _Refusal(ValueError):
    """A ``ValueError`` listing every refused step (``.problems``)."""

    def __init__(self, message: str, problems: list[Problem] = ()):  # type: ignore[assignment]
        super().__init__(message)
        self.problems = list(problems)


class InvalidTransformError(_Refusal):
    """torchvision itself would refuse this sequence on the decoded uint8 image (every backend).

    Raised when ``LoaderConfig`` is built, e.g. ``Normalize`` before any float conversion.
    """


class UnsupportedTransformError(_Refusal):
    """The DALI backend cannot reproduce this step (or sequence) as torchvision runs it.

    Raised by ``from_torchvision``, so by ``create_loader("dali", cfg)``; the torch backends run
    the same Compose.
    """


class TransformError(RuntimeError):
    """A step of the user's transform raised while a sample was being transformed.

    Not a bad file: it is raised under every ``on_bad_file`` policy. The message names the step
    and its position in the Compose, the original error and the file. From a DataLoader worker
    it arrives re-raised by DataLoader (same class, the worker's traceback in the message).
    """


def refusal(cls, head: str, problems: list[Problem], tail: str = ""):
    """``cls`` with a one-line message: ``head: p1; p2. tail``."""
    msg = f"{head}: " + "; ".join(map(str, problems)) + (f". {tail}" if tail else "")
    return cls(msg, problems)


def transform_error(pos: int, step, err: BaseException, where: str = "") -> TransformError:
    """The ``TransformError`` for ``step`` (at ``pos``) having raised ``err``."""
    msg = str(err).strip().splitlines()[0] if str(err).strip() else ""
    at = f" on {where}" if where else ""
    return TransformError(f"transform #{pos} {type(step).__name__} raised "
                          f"{type(err).__name__}: {msg}{at}")
