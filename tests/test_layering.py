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


def test_compare_imports_no_private_name_from_pipelines():
    bad = []
    for path in sorted((ROOT / "compare").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (isinstance(node, ast.ImportFrom) and node.module
                    and node.module.split(".")[0] == "pipelines"):
                bad += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names
                        if a.name.startswith("_")]
    assert bad == []
