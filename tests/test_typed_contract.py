"""The documented contract is the typed contract (issue 58).

* The README's Python snippets type-check under ``mypy --strict`` against the package as
  installed: what a user copies from the guide passes their type checker.
* ``create_loader`` returns ``BatchLoader``, which carries exactly the documented members
  (iteration, ``len``, ``set_epoch``, ``epoch``, ``state_dict``/``load_state_dict``,
  ``set_resolution``, ``close``, the context manager, the listing), and no benchmark hook.
* The constructors declared for type checkers (``LoaderConfig`` and ``AugmentSpec`` take an
  enum or its name) match the dataclass fields they stand for, so the two cannot drift.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import typing
import warnings
from pathlib import Path

import pytest

from pipelines import AugmentSpec, BatchLoader, LoaderConfig, create_loader
from pipelines.types import Measured

ROOT = Path(__file__).resolve().parents[1]

# names a README snippet uses without defining them (it continues the one before it)
PRELUDE = """\
import torch
from pipelines import AugmentSpec, LoaderConfig, create_loader
root: str = "data/val"
model: torch.nn.Module = torch.nn.Identity()
"""


def _snippets() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return [b for b in blocks if "create_loader" in b or "LoaderConfig" in b]


def test_the_readme_snippets_pass_mypy_strict(tmp_path):
    api = pytest.importorskip("mypy.api")
    snippets = _snippets()
    assert len(snippets) >= 2, "README.md: the loader and evaluation snippets are gone"
    files = []
    for i, code in enumerate(snippets):
        f = tmp_path / f"readme_snippet_{i}.py"
        f.write_text(code if code.lstrip().startswith(("import", "from")) else PRELUDE + code)
        files.append(str(f))
    out, err, status = api.run(["--strict", "--no-error-summary", "--python-version", "3.10",
                                "--cache-dir", str(ROOT / ".mypy_cache"), *files])
    assert status == 0, f"README snippets fail mypy --strict:\n{out}{err}"


DOCUMENTED = {"__iter__", "__len__", "set_epoch", "epoch", "state_dict", "load_state_dict",
              "set_resolution", "resolution", "close", "__enter__", "__exit__", "classes",
              "paths", "stats", "last_indices", "last_batch_indices"}


def test_batchloader_is_the_documented_contract_and_nothing_else():
    members = set(typing.get_protocol_members(BatchLoader)) if hasattr(
        typing, "get_protocol_members") else {
        n for n in vars(BatchLoader) if not n.startswith("_abc") and n not in (
            "__doc__", "__module__", "__dict__", "__weakref__", "__parameters__", "__init__",
            "__protocol_attrs__", "__non_callable_proto_members__", "__subclasshook__",
            "_is_protocol", "_is_runtime_protocol", "__annotations__", "__static_attributes__",
            "__firstlineno__", "__orig_bases__", "__slots__", "__abstractmethods__")}
    members |= set(typing.get_type_hints(BatchLoader))
    assert members == DOCUMENTED
    assert "h2d_bytes_per_sample" not in members  # the suite's hook: pipelines.types.Measured
    assert inspect.signature(create_loader).return_annotation in ("BatchLoader", BatchLoader)


@pytest.mark.parametrize("backend", ["pinned", "pageable", "dali"])
def test_every_backend_is_a_batchloader_and_measured(tiny_root, backend):
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    cfg = LoaderConfig(root=str(tiny_root), batch_size=4, device="cpu", num_workers=0 if
                       backend != "dali" else 1, augment=AugmentSpec(size=16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no CUDA here: the loader says so once
        with create_loader(backend, cfg) as loader:
            for name in DOCUMENTED:
                assert hasattr(loader, name), f"{backend} lacks {name}"
            assert isinstance(loader, BatchLoader) and isinstance(loader, Measured)


def _declared_init(cls: type) -> list[tuple[str, str | None]]:
    """``(name, default source)`` of each parameter of the ``__init__`` that ``cls`` declares
    under ``TYPE_CHECKING``, read from its source."""
    tree = ast.parse(inspect.getsource(cls))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            args = node.args.args[1:]
            defaults = [None] * (len(args) - len(node.args.defaults)) + node.args.defaults
            return [(a.arg, None if d is None else ast.unparse(d)) for a, d in zip(args, defaults)]
    raise AssertionError(f"{cls.__name__} declares no __init__ for type checkers")


@pytest.mark.parametrize("cls", [LoaderConfig, AugmentSpec])
def test_the_declared_constructor_matches_the_fields(cls):
    declared = _declared_init(cls)
    fields = dataclasses.fields(cls)
    assert [n for n, _ in declared] == [f.name for f in fields]
    module = inspect.getmodule(cls)
    scope = vars(module)
    for (name, src), f in zip(declared, fields):
        if f.default is dataclasses.MISSING:
            assert src in (None, "..."), f"{name}: the dataclass has no default, the stub {src}"
            continue
        assert src is not None, f"{name}: the stub has no default, the dataclass {f.default!r}"
        assert eval(src, scope) == f.default, f"{name}: stub {src} != field {f.default!r}"
