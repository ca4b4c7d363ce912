"""Draws docs/images/layers.svg: byzantium's top-level packages in layers, with the imports between them.

The arrows are the package's real imports, read with the same parser as tests/test_layers.py (which holds
the layer rule); packages that import each other share a box. Each box sits one row below the lowest box
that imports it, so every arrow points down. Run it again when the packages change:

    python docs/images/draw_layers.py
"""
import importlib.util
import pathlib
import sys
import types

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "layers"})  # text as text; same file each run
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = pathlib.Path(__file__).with_name("layers.svg")

WHAT = {  # a few words for each package
    "cli": "the commands", "server": "OpenAI-compatible HTTP", "sweep": "experiment files, cell by cell",
    "generate": "byzantium generate", "serve_command": "byzantium serve", "eval": "lm-eval model",
    "plan": "GPU plans",
    "commands": "the command registry", "experiments": "runs, reports, plots",
    "protocols": "SAC, CP-WBFT, RR, MAJ, resilience", "backends": "the LLM interface",
    "tasks": "data, answers, sandbox", "engine": "the decoding engine", "kernels": "attention, linears, MoE",
    "paths": "cache folders", "lazy_exports": "names loaded on first use",
}


def layer_rule_parser():
    """tests/test_layers.py's import reader, loaded without pytest."""
    sys.modules.setdefault("pytest", types.SimpleNamespace(
        mark=types.SimpleNamespace(parametrize=lambda *a, **k: (lambda f: f))))
    spec = importlib.util.spec_from_file_location("test_layers", ROOT / "tests" / "test_layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def package_imports(rule):
    packages = {p.stem for p in rule.PACKAGE.iterdir() if p.stem != "__init__" and (p.suffix == ".py" or p.is_dir())
                and not p.name.startswith(("_", "."))}
    edges = {name: set() for name in packages}
    for path in rule.PACKAGE.rglob("*.py"):
        top = path.relative_to(rule.PACKAGE).parts[0].removesuffix(".py")
        if top in packages:
            edges[top] |= (rule.imported_byzantium_modules(path) & packages) - {top}
    return edges


def boxes_of(edges):
    """Packages that reach each other (through imports) share a box; returns {package: box}."""
    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for nxt in edges[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen
    reached = {p: reach(p) for p in edges}
    return {p: tuple(sorted({p} | {q for q in reached[p] if p in reached[q]})) for p in edges}


def rows_of(box_edges):
    """Row 0 at the bottom: each box one row below the lowest box that imports it."""
    importers = {b: {a for a, targets in box_edges.items() if b in targets} for b in box_edges}
    depth = {}

    def of(box):
        if box not in depth:
            depth[box] = 1 + max((of(a) for a in importers[box]), default=-1)
        return depth[box]
    bottom = max(of(b) for b in box_edges)
    return {b: bottom - of(b) for b in box_edges}


def main():
    edges = package_imports(layer_rule_parser())
    box = boxes_of(edges)
    box_edges = {b: set() for b in set(box.values())}
    for p, targets in edges.items():
        box_edges[box[p]] |= {box[t] for t in targets} - {box[p]}
    row = rows_of(box_edges)
    by_row = {}
    for b in sorted(box_edges):
        by_row.setdefault(row[b], []).append(b)
    width, height = 12.0, 1.25 * (max(by_row) + 1) + 0.4
    fig, ax = plt.subplots(figsize=(width, height))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    centre = {}
    for r, boxes in by_row.items():
        for i, b in enumerate(boxes):
            x, y = width * (i + 1) / (len(boxes) + 1), 0.6 + 1.25 * r
            centre[b] = (x, y)
            label = " + ".join(b) + "\n" + "; ".join(WHAT.get(p, "") for p in b if WHAT.get(p))
            ax.text(x, y, label, ha="center", va="center", fontsize=9,
                    bbox=dict(boxstyle="round,pad=0.4", fc="#eef3fb", ec="#4a6fa5"))
    for b, targets in box_edges.items():
        for t in targets:
            (x0, y0), (x1, y1) = centre[b], centre[t]
            ax.annotate("", xy=(x1, y1 + 0.28), xytext=(x0, y0 - 0.28),
                        arrowprops=dict(arrowstyle="->", color="#888888", lw=0.8, shrinkA=2, shrinkB=2))
    ax.set_title("byzantium's packages: each imports only those below it (arrows: the imports)", fontsize=10)
    fig.tight_layout()
    fig.savefig(OUT, format="svg", metadata={"Date": None})
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
