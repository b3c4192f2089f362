"""``Backend`` and ``create_loader``: pick a backend by name, get a ``BatchLoader``."""
from __future__ import annotations

import enum
import importlib.util

from .config import LoaderConfig
from .types import BatchLoader


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
    def parse(cls, name: "str | Backend") -> "Backend":
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


def create_loader(backend: "str | Backend", config: LoaderConfig) -> BatchLoader:
    """Build the loader for ``backend``.

    Heavy dependencies are imported only inside their branch: ``nvidia.dali`` is never imported
    unless the DALI backend is asked for.

    Args:
        backend: a ``Backend`` or its name (``"dali"``, ``"pinned"``, ``"pageable"``).
        config: the ``LoaderConfig``.

    Returns:
        A ``BatchLoader`` yielding ``Batch(images, labels)``.

    Raises:
        ValueError: unknown backend name.
        ImportError: DALI asked for but not installed (the message names the pip extra).
    """
    backend = Backend.parse(backend)
    if not isinstance(config, LoaderConfig):
        raise TypeError(f"config={config!r} must be a LoaderConfig")
    if backend is Backend.DALI:
        if not dali_available():
            raise ImportError(
                "backend='dali' needs NVIDIA DALI: pip install 'gpu-feed[dali]' "
                "(CUDA 12 drivers) or 'gpu-feed[dali-cu13]' (CUDA 13 drivers)"
            )
        from .dali.loader import DaliLoader

        return DaliLoader(config)
    if backend is Backend.PINNED:
        from .torch_backend.pinned import PinnedLoader

        return PinnedLoader(config)
    from .torch_backend.pageable import PageableLoader

    return PageableLoader(config)
