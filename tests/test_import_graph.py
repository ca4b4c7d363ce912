"""No import circles inside the package, and no private name imported from another module.

Function-level imports count: they hide a circle from Python's loader, not from a reader."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "byzantium"


def module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules():
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def resolve(path, node):
    """The absolute dotted module an ImportFrom names."""
    if node.level == 0:
        return node.module or ""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path, modules):
    """(module imported, names taken from it) for each byzantium import in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, ()) for a in node.names if a.name.startswith("byzantium")]
        elif isinstance(node, ast.ImportFrom):
            target = resolve(path, node)
            if not target.startswith("byzantium"):
                continue
            names = []
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:  # `from package import submodule`
                    found.append((f"{target}.{alias.name}", ()))
                else:
                    names.append(alias.name)
            if names:
                found.append((target, tuple(names)))
    return found


def import_graph():
    modules = all_modules()
    graph = {}
    for name, path in modules.items():
        graph[name] = {target for target, _ in imports_of(path, modules) if target in modules and target != name}
    return graph


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert cycles(import_graph()) == []


def test_the_circle_finder_finds_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_function_level_and_relative_imports():
    graph = import_graph()
    assert "byzantium.engine.async_engine" in graph["byzantium.backends.native"]  # relative, ..engine.async_engine
    assert "byzantium.engine.sampling" in graph["byzantium.engine.engine"]
    assert "byzantium.engine.layers.linear" in graph["byzantium.engine.model_setup"]
    assert "byzantium.kernels.linear_choice" in graph["byzantium.kernels.cpu"]  # inside a function


def test_no_private_names_imported_across_modules():
    modules = all_modules()
    wrong = []
    for name, path in sorted(modules.items()):
        for target, names in imports_of(path, modules):
            for imported in names:
                if imported.startswith("_") and not imported.startswith("__"):
                    wrong.append(f"{name} imports {target}.{imported}")
    assert wrong == []
