"""Experiment files: a TOML file names a protocol and the settings it varies; each point is a cell, one
ordinary `byzantium run <method>` into its own directory. Read and checked here, before any model loads.

    paper = "consensus-trap"          # sac | consensus-trap | mas, or a list of them (a file whose
                                      # methods come from several papers, e.g. MAJ beside SAC)
    table = "Table 1"
    method = ["maj", "rrmaj"]         # one method, or several run on the same cells
    data_root = "data"                # optional: where `data` files are (relative to this file);
                                      # `byzantium sweep --data-root PATH` overrides it
    prompt_budget = 512               # optional: prompt tokens assumed when sizing max_model_len
    [analysis]                        # free-form, copied to sweep.json for `byzantium report`
    kind = "corruption"
    [run]                             # one value each, for every cell
    agents = 5
    [axes]                            # lists: their cartesian product makes the cells
    pattern = ["0c5t", "3c2t"]        # c corrupted of N agents (or: corrupt/agents, or
                                      # corrupted = [3, 4], explicit agent indices)
    task = ["gen-track", {name = "gsm8k", task = "gsm8k", data = "gsm8k.jsonl", max_len = 1024}]
                                      # (a task table's max_len / max_tokens: that data set's limit)
    [[cells]]                         # optional: explicit cells (e.g. the conditions of a table), each
                                      # run at every point of the axes
    [models."Qwen/Qwen3-4B"]          # per model: chat_template_kwargs, max_model_len (a server's limit),
    chat_template_kwargs = {enable_thinking = false}   # tensor_parallel_size, quantization ("fp8"): its
                                      # engine's options (`byzantium plan` says which; the sweep's pool
                                      # gives them to that model only; the sweep's own flags win)
    [scale.smoke.run] / [scale.smoke.axes] / [[scale.smoke.cells]]   (and scale.paper): these replace
                                      # the same keys of [run] / [axes] / the [[cells]] list
    [[published]]                     # the paper's numbers, as data (see sweep.json in running.py): one
                                      # number (value, where = {...}), or a table of them: by = ["task",
                                      # "method"], rows = [["gsm8k", "maj", 97.5], ...]; average = true:
                                      # the paper's average over the cells `where` matches (shown beside
                                      # our average of them, never beside one cell)

A key is the long flag of `byzantium run <method>` with `_` for `-` (`F` is --f, `defence` is --defense;
models: `model` for every agent, `models` one per agent, `strong_model`/`weak_model` for SAC). A key
that one of several methods lacks is left out of that method's cells (K for MAJ: MAJ then runs once;
in a file of both families, F for MAJ and K for SAC); a key that none of the file's methods has is
refused. `budget` is one adversary budget for both families: corrupted agents of N (RR's corrupt,
SAC's byzantine).
Each cell is turned into the argv of that parser, so its own checks apply; their errors are mapped
back to the key: `t.toml: [axes].corrupt: 7 is more than agents=5`. Cells that load the same models
are put next to each other (one load each when models do not fit on the device together).
"""
import itertools
from dataclasses import dataclass
from pathlib import Path

from .cell_checks import parse_cell
from .cells import ENGINE_KEYS, FAMILIES, KEYS, METHODS, RES, RR, SAC, ConfigError, make_cell
from .needs import PROMPT_BUDGET

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

QUANTIZATIONS = ("fp8",)  # EngineConfig's (engine/config.py imports torch: not imported here)
PAPERS = {"sac": SAC, "consensus-trap": RR, "mas": RES}
SCALES = ("smoke", "paper")
TOP_KEYS = {"name", "paper", "table", "method", "data_root", "prompt_budget", "analysis", "run", "axes", "cells",
            "models", "scale", "published"}


@dataclass
class Sweep:
    name: str
    paper: str
    table: str
    scale: str
    path: Path
    analysis: dict
    cells: list
    published: list
    models: dict  # model name -> {chat_template_kwargs, max_model_len, tensor_parallel_size, quantization}
    prompt_budget: int


def load_sweep(path, scale="smoke", data_root=None, check_files=True) -> Sweep:
    """Read and check an experiment file at a scale. data_root: the --data-root flag (relative to the
    current directory); check_files: whether `data` files must exist (False: only the settings)."""
    path = find_file(path)
    where = path.name
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{where}: not valid TOML: {error}") from None
    if scale not in SCALES:
        raise ConfigError(f"unknown scale {scale!r}; choose one of {', '.join(SCALES)}")

    def fail(key, message):
        raise ConfigError(f"{where}: {key}: {message}")

    for key in raw:
        if key not in TOP_KEYS:
            fail(key, f"unknown key; known: {', '.join(sorted(TOP_KEYS))}")
    paper = raw.get("paper")
    papers = paper if isinstance(paper, list) and paper else [paper]
    if any(p not in PAPERS for p in papers):
        fail("paper", f"{paper!r}; choose one of {', '.join(PAPERS)}, or a list of them")
    paper = " + ".join(papers)
    for key in ("table", "name"):
        if not isinstance(raw.get(key, ""), str):
            fail(key, "must be a string")
    analysis = raw.get("analysis", {})
    if not isinstance(analysis, dict) or not isinstance(analysis.get("kind"), str):
        fail("[analysis]", 'a table with kind = "..." (e.g. "corruption", "scaling", "sac", "resilience")')
    budget = raw.get("prompt_budget", PROMPT_BUDGET)
    if not isinstance(budget, int) or budget < 1:
        fail("prompt_budget", f"must be a positive integer, got {budget!r}")
    models = _model_settings(raw.get("models", {}), fail)

    # The settings at this scale: fixed ones, axes and explicit cells, each key with where it was set.
    scales = raw.get("scale", {})
    if not isinstance(scales, dict) or any(s not in SCALES for s in scales):
        fail("[scale]", f"scales are {', '.join(SCALES)}")
    if scales and scale not in scales:
        fail(f"[scale.{scale}]", f"missing (this file has {', '.join(scales)})")
    chosen = scales.get(scale, {})
    for key in chosen:
        if key not in ("run", "axes", "cells"):
            fail(f"[scale.{scale}].{key}", "unknown key; a scale has run, axes and cells")
    fixed, axes = {}, {}
    if "method" in raw:
        (axes if isinstance(raw["method"], list) else fixed)["method"] = (raw["method"], "method")
    for section, prefix in ((raw, ""), (chosen, f"scale.{scale}.")):
        run, ax = section.get("run", {}), section.get("axes", {})
        if not isinstance(run, dict) or not isinstance(ax, dict):
            fail(f"[{prefix}run] / [{prefix}axes]", "tables of settings")
        for key, value in run.items():
            axes.pop(key, None)
            fixed[key] = (value, f"[{prefix}run]")
        for key, values in ax.items():
            if not isinstance(values, list) or not values:
                fail(f"[{prefix}axes].{key}", "an axis is a non-empty list of values")
            fixed.pop(key, None)
            axes[key] = (values, f"[{prefix}axes]")
    cells = chosen.get("cells", raw.get("cells"))
    cells_where = f"[[scale.{scale}.cells]]" if "cells" in chosen else "[[cells]]"
    for key, (_, source) in {**fixed, **axes}.items():
        if key not in KEYS:
            fail(f"{source}.{key}", "unknown key")
    if "method" not in fixed and "method" not in axes and not (cells and all("method" in c for c in cells)):
        fail("method", f"missing; one of {', '.join(METHODS)} or a list of them")

    # The points: the cartesian product of the axes, times each explicit cell when there are cells.
    combos = [dict(zip(axes, combo)) for combo in itertools.product(*(values for values, _ in axes.values()))]
    base_sources = {k: s for k, (_, s) in fixed.items()} | {k: s for k, (_, s) in axes.items()}
    names = list(axes)
    if cells is None:
        points = [({k: v for k, (v, _) in fixed.items()} | combo, dict(base_sources)) for combo in combos]
    else:
        if not isinstance(cells, list) or not cells or not all(isinstance(c, dict) for c in cells):
            fail(cells_where, "a non-empty list of tables")
        for i, c in enumerate(cells, 1):
            for key in c:
                if key not in KEYS:
                    fail(f"{cells_where} #{i}.{key}", "unknown key")
                if key in axes:
                    fail(f"{cells_where} #{i}.{key}", f"also an axis ({axes[key][1]}); set it in one place")
        points = [({k: v for k, (v, _) in fixed.items()} | combo | c,
                   base_sources | {k: f"{cells_where} #{i}" for k in c})
                  for combo in combos for i, c in enumerate(cells, 1)]
        names += list(dict.fromkeys(k for c in cells for k in c))

    root = _data_root(path, raw.get("data_root"), data_root, fail)
    built, seen = [], {}
    for point, sources in _own_keys(points):
        cell = make_cell(point, sources, names, root, check_files, where)
        if cell.name in seen:
            if seen[cell.name] != cell.params:
                raise ConfigError(f"{where}: two cells are both named {cell.name!r}; give them different settings")
            continue  # the same run twice (e.g. MAJ over a K axis it does not have): once
        seen[cell.name] = dict(cell.params)
        parse_cell(cell, where)
        built.append(cell)
    if not built:
        fail("[axes]", "no cell applies to the methods")
    # Cells of one model set run one after another, so that models which do not fit on the device
    # together are loaded once each (stable: the file's order otherwise).
    first = {}
    for cell in built:
        first.setdefault(tuple(cell.models), len(first))
    built.sort(key=lambda cell: first[tuple(cell.models)])
    published = _published(raw.get("published", []), fail)
    return Sweep(raw.get("name") or path.stem, paper, raw.get("table", ""), scale, path, analysis, built, published,
                 models, budget)
def _own_keys(points):
    """In a file whose methods come from several families (MAJ beside SAC), each point without the keys
    of the other families' methods (F for MAJ, K for SAC): [run] and [axes] then serve both. A key that
    none of the file's methods has stays, for make_cell to refuse."""
    families = [f for f in FAMILIES if any(p.get("method") in f for p, _ in points)]
    if len(families) < 2:
        return points
    scope = set().union(*families)
    out = []
    for point, sources in points:
        own = next((f for f in families if point.get("method") in f), scope)
        out.append(({k: v for k, v in point.items()
                     if k not in KEYS or KEYS[k][1] & own or not KEYS[k][1] & scope}, sources))
    return out


CONFIGS = Path(__file__).parents[1] / "experiments" / "configs"  # the shipped experiment files, one per paper table


def find_file(name) -> Path:
    """An experiment file: a path, or the name of a shipped one (`ct_table1`, `ct_table1.toml`)."""
    path = Path(name)
    if path.is_file():
        return path
    shipped = CONFIGS / (path.name if path.suffix == ".toml" else f"{path.name}.toml")
    if path.parent == Path(".") and shipped.is_file():
        return shipped
    names = ", ".join(sorted(p.stem for p in CONFIGS.glob("*.toml")))
    raise ConfigError(f"{name}: no such experiment file (shipped ones, by name: {names})")


def _model_settings(models, fail):
    if not isinstance(models, dict):
        fail("[models]", 'a table of [models."<name>"] tables')
    for name, s in models.items():
        if not isinstance(s, dict):
            fail(f'[models."{name}"]', "a table")
        for key, value in s.items():
            if key == "chat_template_kwargs" and not isinstance(value, dict):
                fail(f'[models."{name}"].{key}', "a table, e.g. {enable_thinking = false}")
            elif key in ("max_model_len", "tensor_parallel_size") and (
                    not isinstance(value, int) or isinstance(value, bool) or value < 1):
                fail(f'[models."{name}"].{key}', f"a positive integer, got {value!r}")
            elif key == "quantization" and value not in QUANTIZATIONS:
                fail(f'[models."{name}"].{key}', f"{value!r}; known: {', '.join(QUANTIZATIONS)} (leave it out for "
                                                 "the checkpoint's own weights)")
            elif key not in ("chat_template_kwargs", "max_model_len") + tuple(ENGINE_KEYS):
                fail(f'[models."{name}"].{key}', "unknown key; known: chat_template_kwargs, max_model_len, "
                                                 "tensor_parallel_size, quantization")
    return models


def _data_root(path, in_file, flag, fail):
    if flag is not None:
        root = Path(flag).expanduser()
        if not root.is_dir():
            raise ConfigError(f"--data-root {flag}: no such directory")
        return root
    if in_file is not None:
        if not isinstance(in_file, str):
            fail("data_root", "a path (relative to this file)")
        return path.parent / in_file
    return path.parent


def _published(entries, fail):
    """The [[published]] entries, each checked; an entry with `by` and `rows` (a table of the paper's
    numbers, one row a number) becomes one plain entry per row."""
    if not isinstance(entries, list):
        fail("[[published]]", "a list of tables")
    out = []
    for i, p in enumerate(entries, 1):
        where = f"[[published]] #{i}"
        if not isinstance(p, dict):
            fail(where, "a table")
        out += [_published_entry(e, where, fail) for e in _published_rows(p, where, fail)]
    return out


def _published_rows(p, where, fail):
    if "rows" not in p and "by" not in p:
        return [p]
    by, rows = p.get("by"), p.get("rows")
    if not (isinstance(by, list) and by and all(isinstance(k, str) for k in by)) or not isinstance(rows, list):
        fail(f"{where}.by", 'by = ["key", ...] names the columns of rows = [[v1, ..., value], ...]')
    base = {k: v for k, v in p.items() if k not in ("by", "rows")}
    out = []
    for j, row in enumerate(rows, 1):
        if not isinstance(row, list) or len(row) != len(by) + 1:
            fail(f"{where}.rows #{j}", f"{len(by)} values ({', '.join(by)}) and the number, got {row!r}")
        keys = dict(zip(by, row[:-1]))
        entry = {**base, "where": {**(base.get("where") or {}), **keys}, "value": row[-1]}
        for key in ("method", "metric"):  # the entry's own fields, not cell parameters
            if key in keys:
                entry[key] = entry["where"].pop(key)
        out.append(entry)
    return out


def _published_entry(p, where, fail):
    for key, kind in (("table", str), ("method", str), ("metric", str), ("value", (int, float)),
                      ("where", dict), ("source", str)):
        if not isinstance(p.get(key), kind) or isinstance(p.get(key), bool):
            fail(f"{where}.{key}", "missing or of the wrong type")
    if p["method"] not in METHODS:
        fail(f"{where}.method", f"{p['method']!r}; choose one of {', '.join(METHODS)}")
    for key in p["where"]:
        if key not in KEYS or KEYS[key][0] is None and key not in ("pattern", "corrupted"):
            fail(f"{where}.where.{key}", "not a cell parameter")
    for key in p:
        if key not in ("table", "method", "metric", "value", "value_max", "unit", "where", "source", "note", "average"):
            fail(f"{where}.{key}", "unknown key")
    if not isinstance(p.get("average", False), bool):
        fail(f"{where}.average", "true (an average over every cell its `where` matches) or false")
    return p
