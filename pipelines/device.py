"""``resolve_device``: the device a backend runs on, with one rule and one warning for all.

``LoaderConfig.device`` defaults to ``"cuda"``. On a machine without CUDA every backend runs on
the CPU instead (``dali`` with its CPU operators, ``pinned`` without pinning or side streams,
``pageable`` as it is) and says so in one ``RuntimeWarning``, rather than failing with the
driver's error at the first batch.
"""
from __future__ import annotations

import warnings

import torch

from pipelines.config import LoaderConfig

# GPUs (by compute capability) with NVJPG hardware JPEG decoder engines, which DALI uses through
# ``hw_decoder_load``; on others it has no effect
HW_JPEG_DECODERS = {(8, 0): "A100/A30", (9, 0): "H100/H200/GH200", (10, 0): "B200/GB200"}

_FALLBACK = {
    "dali": "running DALI's CPU operators",
    "pinned": "running as a plain CPU loader (no pinning, no side streams)",
    "pageable": "returning batches on the CPU",
}


def resolve_device(config: LoaderConfig, backend: str) -> torch.device:
    """The config's device as the loader resolves it (``"cuda"`` is ``cuda:LOCAL_RANK`` under
    torchrun: ``pipelines.placement``), or the CPU (with one warning) when CUDA is asked for
    but absent.

    Raises:
        ValueError: ``device="cuda:N"`` names a GPU this machine does not have.
    """
    dev = config.resolved().torch_device
    if dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        warnings.warn(f"backend={backend!r}: device={config.device!r} but CUDA is not available; "
                      f"{_FALLBACK[backend]}", RuntimeWarning, stacklevel=4)
        return torch.device("cpu")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device={config.device!r}: this machine has "
                         f"{torch.cuda.device_count()} CUDA device(s)")
    return dev
