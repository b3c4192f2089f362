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


CONVERTER = ROOT / "data_gen" / "convert"


def test_data_gen_stands_alone():
    """data_gen makes datasets for any loader: it imports nothing from pipelines or compare.
    The one exception is the converter (data_gen/convert/, issue 59): it must read every source
    the loader reads, so it imports the loader's source layer, ``pipelines.sources``, and
    nothing else of pipelines."""
    bad = [f"{p.relative_to(ROOT)}: {m}" for p, m in _imports("data_gen")
           if m.split(".")[0] in ("pipelines", "compare")
           and not (p.is_relative_to(CONVERTER) and m.split(".")[:2] == ["pipelines", "sources"])]
    assert bad == []
    assert any(m.startswith("pipelines.sources") for p, m in _imports("data_gen")
               if p.is_relative_to(CONVERTER))  # the exception is still needed


def test_pipelines_does_not_import_the_suite():
    bad = [f"{p.relative_to(ROOT)}: {m}" for p, m in _imports("pipelines")
           if m.split(".")[0] in ("compare", "data_gen")]
    assert bad == []


def test_installed_packages_do_not_import_the_tools():
    """tools/ (the microbenchmarks, the fuzzer) is run from a clone and not installed: it may
    import pipelines and compare, but nothing installed imports it (issue 42)."""
    bad = [f"{p.relative_to(ROOT)}: {m}" for pkg in ("pipelines", "compare", "data_gen")
           for p, m in _imports(pkg) if m.split(".")[0] == "tools"]
    assert bad == []


def _is_module(dotted: str) -> bool:
    rel = ROOT.joinpath(*dotted.split("."))
    return rel.with_suffix(".py").is_file() or (rel / "__init__.py").is_file()


def test_compare_imports_modules_not_the_roots_internals():
    """The suite and tools/ import modules, not the package root's internals: from
    ``pipelines`` itself only the names in ``pipelines.__all__`` (or a submodule); anything
    else from the module that holds it (``from pipelines.torch_backend.shm import
    fit_to_shm``), and never a private name or module (``_x``)."""
    import pipelines

    bad = []
    for path, node in [n for pkg in ("compare", "tools") for n in _import_nodes(pkg)]:
        where = path.relative_to(ROOT)
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names if a.name.split(".")[0] == "pipelines"]
            bad += [f"{where}: import {m} (private)" for m in mods
                    if any(part.startswith("_") for part in m.split("."))]
            continue
        if not node.module or node.module.split(".")[0] != "pipelines":
            continue
        if any(part.startswith("_") for part in node.module.split(".")):
            bad.append(f"{where}: from {node.module} import ... (a private module)")
        elif not _is_module(node.module):
            bad.append(f"{where}: from {node.module} import ... (no such module)")
        for a in node.names:
            if node.module == "pipelines":
                if a.name not in pipelines.__all__ and not _is_module(f"pipelines.{a.name}"):
                    bad.append(f"{where}: {a.name} is not in pipelines.__all__; import it from "
                               "its module")
            elif a.name.startswith("_"):
                bad.append(f"{where}: from {node.module} import {a.name} (private)")
    assert bad == []


def _import_nodes(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom)
                                                and node.level == 0):
                yield path, node


def _pipelines_import_graph() -> dict[str, set[str]]:
    """Module -> the pipelines modules it imports, lazy (in-function) imports included; the
    package root (the public API's aggregator) and a package's implicit parents left out."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / "pipelines").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name == "pipelines":
            continue
        package = parts[:-1]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
                module = ".".join(p for p in (base, node.module or "") if p)
                if not module.startswith("pipelines"):
                    continue
                deps |= {f"{module}.{a.name}" if _is_module(f"{module}.{a.name}") else module
                         for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("pipelines")}
        graph[name] = deps - {name, "pipelines"}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a path (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(v: str, path: list[str]) -> list[str] | None:
        state[v] = 1
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state and (found := visit(w, path + [w])):
                return found
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v, [v])):
            return found
    return None


def test_pipelines_modules_import_no_cycle():
    """No module of pipelines reaches itself through imports, lazy ones included (issue 42:
    config and distributed imported each other; placement now holds what both need)."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the finder finds
    assert _cycle(_pipelines_import_graph()) is None
