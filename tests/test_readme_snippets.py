"""The README's evaluation snippet runs as written, on one process, and counts every sample once."""
from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def _snippet(marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"README.md: expected one python block with {marker!r}"
    return found[0]


@pytest.mark.parametrize("backend", ["dali", "pinned"])
def test_the_masked_evaluation_snippet_runs_and_counts_each_sample_once(tiny_root, backend):
    code = _snippet("batch.valid").replace('create_loader("dali"', f'create_loader("{backend}"')
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(3, 3))
    from pipelines import AugmentSpec, LoaderConfig, create_loader

    scope = {"root": str(tiny_root), "model": model, "torch": torch, "AugmentSpec": AugmentSpec,
             "LoaderConfig": LoaderConfig, "create_loader": create_loader}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no CUDA here: the loader says so once
        exec(compile(code, "README.md", "exec"), scope)
    samples, correct = (int(x) for x in scope["count"])
    assert samples == 37  # tiny_root's every image, once
    assert 0 <= correct <= samples
