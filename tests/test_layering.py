"""Import rules between the packages, read from the source with ``ast``."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                for a in node.names:
                    yield path, a.name
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield path, node.module


def test_data_gen_stands_alone():
    """data_gen makes datasets for any loader: it imports nothing from pipelines or compare."""
    bad = [f"{p.relative_to(ROOT)}: {m}" for p, m in _imports("data_gen")
           if m.split(".")[0] in ("pipelines", "compare")]
    assert bad == []


def test_pipelines_does_not_import_the_suite():
    bad = [f"{p.relative_to(ROOT)}: {m}" for p, m in _imports("pipelines")
           if m.split(".")[0] in ("compare", "data_gen")]
    assert bad == []


def test_compare_uses_only_the_public_api_of_pipelines():
    """compare imports names from ``pipelines`` itself, each one in ``pipelines.__all__``."""
    import pipelines

    public = set(pipelines.__all__) | {"decode_rgb"}  # decode_rgb: exported lazily
    bad = []
    for path, node in _import_nodes("compare"):
        if isinstance(node, ast.Import):
            bad += [f"{path.relative_to(ROOT)}: import {a.name}" for a in node.names
                    if a.name.startswith("pipelines.")]
        elif node.module and node.module.split(".")[0] == "pipelines":
            if node.module != "pipelines":
                bad.append(f"{path.relative_to(ROOT)}: from {node.module} import ...")
            else:
                bad += [f"{path.relative_to(ROOT)}: {a.name}" for a in node.names
                        if a.name not in public]
    assert bad == []


def _import_nodes(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom)
                                                and node.level == 0):
                yield path, node
