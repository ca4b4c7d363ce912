"""The package's layers import downwards only: the engine knows nothing above it; protocols speak the
LLM interface (backends), not the engine; kernels know nothing of the engine; nothing below the CLI imports it."""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "byzantium"

# layer -> the sibling packages/modules of byzantium it must never import
# On top, beside the CLI: the HTTP server, and sweeps (which run `byzantium run` commands, cell by cell).
TOP = {"server", "sweep", "sweep_config"}
FORBIDDEN = {
    # the engine is below the LLM interface: it defines SamplingParams, which backends re-export
    "engine": {"backends", "protocols", "tasks", "experiments", "eval", "cli", "commands", "plan"} | TOP,
    "protocols": {"engine", "cli", "experiments"} | TOP,
    "kernels": {"engine", "backends", "protocols", "experiments", "cli"} | TOP,
    "backends": {"protocols", "experiments", "cli"} | TOP,
    "tasks": {"engine", "protocols", "experiments", "cli"} | TOP,
    "experiments": {"cli", "engine"} | TOP,
}


def imported_byzantium_modules(path):
    """The top-level byzantium sub-packages a file imports (absolute or relative, at any depth)."""
    tree = ast.parse(path.read_text())
    depth = len(path.relative_to(PACKAGE).parts) - 1  # folders below byzantium/
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] == "byzantium" and len(parts) > 1:
                    found.add(parts[1])
                continue
            if node.level - 1 > depth:
                continue
            # a relative import climbing to byzantium/ names a sibling package first
            base = list(path.relative_to(PACKAGE).parts[:-1])[: depth - (node.level - 1)]
            parts = base + (node.module.split(".") if node.module else [])
            if parts:
                found.add(parts[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "byzantium" and len(parts) > 1:
                    found.add(parts[1])
    return found


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_point_down(layer):
    wrong = []
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        bad = imported_byzantium_modules(path) & FORBIDDEN[layer]
        if bad:
            wrong.append(f"{path.relative_to(PACKAGE)} imports {sorted(bad)}")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_relative_imports(tmp_path):
    # the checker itself must catch the arrows this test exists for
    assert "engine" in imported_byzantium_modules(PACKAGE / "backends" / "native.py")
    assert "tasks" in imported_byzantium_modules(PACKAGE / "protocols" / "voting.py")


def test_one_sampling_params():
    import byzantium
    from byzantium import backends
    from byzantium.engine import sampling
    assert byzantium.SamplingParams is backends.SamplingParams is sampling.SamplingParams


@pytest.mark.parametrize("name", ["stable_seed", "plurality"])
def test_one_definition_of(name):
    # two copies with different results made seeds and tie-breaks depend on which module a protocol used
    defined = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if f"def {name}(" in p.read_text()]
    assert defined == ["protocols/plurality.py"]
