"""Generate real-JPEG ImageFolder datasets: ``python -m data_gen --out DIR``."""
from .generate import GenConfig, generate, read_manifest

__all__ = ["GenConfig", "generate", "read_manifest"]
