"""Environment metadata recorded with every result."""
from __future__ import annotations

import os
import platform
import subprocess


def _version(mod: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(mod)
    except Exception:
        return None


def environment() -> dict[str, object]:
    import torch

    env: dict[str, object] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": _usable_cores(),
        "cpu_model": _cpu_model(),
        "torch": torch.__version__,
        "torchvision": _version("torchvision"),
        "numpy": _version("numpy"),
        "pillow": _version("pillow"),
        "simplejpeg": _version("simplejpeg"),  # the scaled decode's library when installed
        "dali": None,
        "cuda_available": torch.cuda.is_available(),
    }
    try:
        import nvidia.dali as dali  # only for the version; the backend imports it itself

        env["dali"] = dali.__version__
    except Exception:
        pass
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1),
                   sm_count=p.multi_processor_count, cuda_runtime=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version())
        env["driver"] = nvidia_driver()
    try:
        st = os.statvfs("/dev/shm")
        env["dev_shm_gib"] = round(st.f_blocks * st.f_frsize / 2**30, 2)
    except OSError:
        env["dev_shm_gib"] = None
    return env


def _usable_cores() -> int:
    from pipelines.config import usable_cores  # the rule the loaders use for their defaults

    return usable_cores()


def nvidia_driver() -> str | None:
    """The NVIDIA driver version ``nvidia-smi`` reports, or ``None`` where it cannot say."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:  # no nvidia-smi, a timeout, a broken driver
        return None
    return out.splitlines()[0] if out else None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None
