"""Shared test helpers: file corruptions and small dataset builders."""
from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
from PIL import Image


def jpeg(w: int = 48, h: int = 40, seed: int = 0, **kw) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, "JPEG", **kw)
    return buf.getvalue()


def broken_huffman(data: bytes) -> bytes:
    """A JPEG that passes ``check_image_bytes`` but that every decoder rejects: the body of its
    first Huffman table (DHT) is overwritten with 0xFF bytes ("Bogus Huffman table"), within
    its segment (bytes past it would break the marker walk, which the check refuses)."""
    b = bytearray(data)
    i = b.find(b"\xff\xc4")
    assert i > 0
    n = min(36, int.from_bytes(b[i + 2:i + 4], "big") - 2)
    b[i + 4 : i + 4 + n] = b"\xff" * n
    return bytes(b)


def copy_root(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def plan_position(loader_cfg, n: int, index: int, epoch: int = 0) -> int:
    """The batch position of dataset ``index`` in the plan of ``epoch``."""
    from pipelines.epoch_plan import config_batches

    for pos, b in enumerate(config_batches(n, loader_cfg, epoch)):
        if index in b.tolist():
            return pos
    raise AssertionError(f"index {index} not in the plan")


def corrupt_png(w: int = 64, h: int = 48, seed: int = 0) -> bytes:
    """A PNG whose compressed image data (IDAT) has flipped bits: libpng reports an error, which
    crashed torchvision's PNG decoder with a segmentation fault (found by the fuzzer)."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    b = bytearray(buf.getvalue())
    i = b.find(b"IDAT") + 4
    for k in (40, 300, 700, 1500):
        b[i + k] ^= 0x5A
    return bytes(b)


def make(backend, cfg, **options):
    """``create_loader(backend, cfg)`` with ``options`` as the backend's options class."""
    from pipelines import create_loader
    from pipelines.factory import options_for

    return create_loader(backend, cfg, options=options_for(backend)(**options))


def ks(a, b) -> float:
    """The two-sample Kolmogorov-Smirnov statistic of ``a`` and ``b``."""
    a, b = np.sort(np.asarray(a, float)), np.sort(np.asarray(b, float))
    grid = np.concatenate([a, b])
    return float(np.max(np.abs(np.searchsorted(a, grid, side="right") / len(a)
                               - np.searchsorted(b, grid, side="right") / len(b))))


def one_image_copies(src_root: Path, dst: Path, n: int = 64, classes: int = 2) -> Path:
    """``n`` copies of ``src_root``'s first JPEG in ``classes`` class folders of ``dst``: every
    sample decodes to the same pixels, so only the augmentation tells them apart."""
    src = sorted(Path(src_root).glob("class_0000/*.jpg"))[0]
    for k in range(n):
        d = Path(dst) / f"c{k % classes}"
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, d / f"{k:02d}.jpg")
    return Path(dst)


def state_after(loader, k: int, epoch: int = 0) -> dict:
    """``loader.state_dict()`` after the consumer took ``k`` batches of ``epoch``."""
    loader.set_epoch(epoch)
    it = iter(loader)
    for _ in range(k):
        next(it)
    state = loader.state_dict()
    it.close()
    return state
