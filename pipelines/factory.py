"""``Backend`` and ``create_loader``: pick a backend by name, get a ``BatchLoader``."""
from __future__ import annotations

import enum
import importlib.util
from typing import cast

from pipelines.config import LoaderConfig
from pipelines.options import DaliOptions, Options, TorchOptions
from pipelines.types import BatchLoader


class Backend(str, enum.Enum):
    """The interchangeable backends.

    * ``DALI``: NVIDIA DALI decodes and augments on the GPU (CPU operators when ``device="cpu"``).
    * ``PINNED``: torch DataLoader, uint8 batches in pinned memory, async H2D on side streams,
      normalisation on the GPU.
    * ``PAGEABLE``: the default recipe (float32 normalise in workers, no pinning, blocking copy);
      the baseline everything is compared against.
    """

    DALI = "dali"
    PINNED = "pinned"
    PAGEABLE = "pageable"

    @classmethod
    def parse(cls, name: str | Backend) -> Backend:
        try:
            return cls(name.value if isinstance(name, Backend) else str(name).lower())
        except ValueError:
            raise ValueError(
                f"backend={name!r} is unknown; valid backends: {', '.join(b.value for b in cls)}"
            ) from None


def dali_available() -> bool:
    """True when ``nvidia.dali`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):
        return False


def available_backends() -> list[Backend]:
    """The backends that can run here (DALI only when installed)."""
    return [b for b in Backend if b is not Backend.DALI or dali_available()]


# The options class of each backend: ``create_loader`` and ``compare --sweep`` read it.
OPTIONS: dict[Backend, type[Options]] = {
    Backend.DALI: DaliOptions, Backend.PINNED: TorchOptions, Backend.PAGEABLE: TorchOptions,
}


def options_for(backend: str | Backend) -> type[Options]:
    """The options class ``backend`` takes (``DaliOptions`` or ``TorchOptions``)."""
    return OPTIONS[Backend.parse(backend)]


def preload(backend: str | Backend) -> None:
    """Import ``backend``'s modules now (e.g. before forking worker processes, so each starts
    warm). ``create_loader`` imports them on first use anyway."""
    backend = Backend.parse(backend)
    if backend is Backend.DALI:
        import nvidia.dali  # noqa: F401 - ImportError here when DALI is not installed

        from pipelines.dali import loader  # noqa: F401
    else:
        import torchvision.transforms.v2  # noqa: F401

        from pipelines.torch_backend import pageable, pinned  # noqa: F401


def create_loader(backend: str | Backend, config: LoaderConfig,
                  options: Options | None = None) -> BatchLoader:
    """Build the loader for ``backend``.

    Heavy dependencies are imported only inside their branch: ``nvidia.dali`` is never imported
    unless the DALI backend is asked for.

    Args:
        backend: a ``Backend`` or its name (``"dali"``, ``"pinned"``, ``"pageable"``).
        config: the ``LoaderConfig`` (what every backend honours).
        options: the backend's own knobs, ``DaliOptions`` for ``dali``, ``TorchOptions`` for
            ``pinned`` and ``pageable`` (default: the class's defaults).

    Returns:
        A ``BatchLoader`` yielding ``Batch(images, labels)``.

    Raises:
        ValueError: unknown backend name, or an option that has no effect on ``backend``.
        TypeError: ``config`` is not a ``LoaderConfig``, or ``options`` is for another backend.
        ImportError: DALI asked for but not installed (the message names the pip extra).
    """
    backend = Backend.parse(backend)
    if not isinstance(config, LoaderConfig):
        raise TypeError(f"config={config!r} must be a LoaderConfig")
    cls = OPTIONS[backend]
    if options is None:
        options = cls()
    elif not isinstance(options, cls):
        raise TypeError(f"options={type(options).__name__}(...) is not for backend "
                        f"{backend.value!r}; pass a {cls.__name__}")
    options.for_backend(backend.value)
    if backend is Backend.DALI:
        if not dali_available():
            raise ImportError(
                "backend='dali' needs NVIDIA DALI: pip install 'gpu-feed[dali]' "
                "(CUDA 12 drivers) or 'gpu-feed[dali-cu13]' (CUDA 13 drivers)"
            )
        from pipelines.dali.loader import DaliLoader

        return DaliLoader(config, cast(DaliOptions, options))  # an OPTIONS[backend]
    if backend is Backend.PINNED:
        from pipelines.torch_backend.pinned import PinnedLoader

        return PinnedLoader(config, cast(TorchOptions, options))
    from pipelines.torch_backend.pageable import PageableLoader

    return PageableLoader(config, cast(TorchOptions, options))
