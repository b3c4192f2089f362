import subprocess
import sys

import pytest

from pipelines import Backend, LoaderConfig, create_loader, factory


def test_unknown_backend_lists_valid_names():
    with pytest.raises(ValueError, match="dali, pinned, pageable"):
        create_loader("ffcv", LoaderConfig(root="x"))


def test_missing_dali_names_the_extra(monkeypatch, tiny_root):
    monkeypatch.setattr(factory, "dali_available", lambda: False)
    with pytest.raises(ImportError, match=r"gpu-feed\[dali\]"):
        create_loader(Backend.DALI, LoaderConfig(root=tiny_root, device="cpu"))


def test_torch_backends_never_import_dali(tiny_root):
    code = (
        "import sys; from pipelines import create_loader, LoaderConfig;"
        f"l = create_loader('pageable', LoaderConfig(root={str(tiny_root)!r}, device='cpu', num_workers=0));"
        "next(iter(l)); assert 'nvidia.dali' not in sys.modules, 'dali imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
