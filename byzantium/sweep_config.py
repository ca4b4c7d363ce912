"""Experiment files: a TOML file names a protocol and the settings it varies; each point is a cell, one
ordinary `byzantium run <method>` into its own directory. Read and checked here, before any model loads.

    paper = "consensus-trap"          # sac | consensus-trap | mas
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
    [models."Qwen/Qwen3-4B"]          # per model: chat_template_kwargs, max_model_len (a server's limit)
    chat_template_kwargs = {enable_thinking = false}
    [scale.smoke.run] / [scale.smoke.axes] / [[scale.smoke.cells]]   (and scale.paper): these replace
                                      # the same keys of [run] / [axes] / the [[cells]] list
    [[published]]                     # the paper's numbers, as data (see sweep.json in sweep.py): one
                                      # number (value, where = {...}), or a table of them: by = ["task",
                                      # "method"], rows = [["gsm8k", "maj", 97.5], ...]; average = true:
                                      # the paper's average over the cells `where` matches (shown beside
                                      # our average of them, never beside one cell)

A key is the long flag of `byzantium run <method>` with `_` for `-` (`F` is --f, `defence` is --defense;
models: `model` for every agent, `models` one per agent, `strong_model`/`weak_model` for SAC). A key
that one of several methods lacks is left out of that method's cells (K for MAJ: MAJ then runs once).
Each cell is turned into the argv of that parser, so its own checks apply; their errors are mapped
back to the key: `t.toml: [axes].corrupt: 7 is more than agents=5`. Cells that load the same models
are put next to each other (one load each when models do not fit on the device together).
"""
import functools
import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from .experiments.report_cells import short_model

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

RR, SAC, RES = {"maj", "rr", "rrmaj"}, {"sac", "cpwbft"}, {"resilience"}
METHODS = ("maj", "rr", "rrmaj", "sac", "cpwbft", "resilience")
PAPERS = {"sac": SAC, "consensus-trap": RR, "mas": RES}
SCALES = ("smoke", "paper")
PROMPT_BUDGET = 512  # prompt tokens assumed per request when sizing max_model_len (prompt_budget = ...)
ANSWER_BUDGET = 64  # tokens per neighbour's final answer in a SAC refine prompt (only answers travel)
HISTORY_TURNS = 4  # resilience: earlier messages an agent reads, at max_tokens each (a rough estimate)

# key -> (its flag, the methods that have it); a flag of None is a key of the sweep's own.
KEYS = {
    "agents": ("--agents", RR | SAC), "corrupt": ("--corrupt", RR), "chunk": ("--chunk", {"rr", "rrmaj"}),
    "trajectories": ("--trajectories", {"rrmaj"}), "max_len": ("--max-len", RR), "attack": ("--attack", RR),
    "order": ("--order", RR), "models": ("--models", RR), "allow_identical": ("--allow-identical", RR),
    "model": ("--model", RR | RES),
    "weak": ("--weak", SAC), "byzantine": ("--byzantine", SAC), "adversary": ("--adversary", SAC),
    "F": ("--f", SAC), "topology": ("--topology", SAC), "strong_model": ("--strong-model", SAC),
    "weak_model": ("--weak-model", SAC), "adversary_model": ("--adversary-model", SAC),
    "score_mode": ("--score-mode", SAC), "judge_max_tokens": ("--judge-max-tokens", {"sac"}),
    "logprob_kind": ("--logprob-kind", {"sac"}), "ra_ties": ("--ra-ties", {"sac"}),
    "all_rounds": ("--all-rounds", {"cpwbft"}),
    "rounds": ("--rounds", SAC | RES), "max_tokens": ("--max-tokens", SAC | RES),
    "system": ("--system", RES), "fault": ("--fault", RES), "defence": ("--defense", RES), "pm": ("--pm", RES),
    "pe": ("--pe", RES), "error_type": ("--error-type", RES), "faulty_role": ("--faulty-role", RES),
    "fault_max_tokens": ("--fault-max-tokens", RES), "inspector_max_tokens": ("--inspector-max-tokens", RES),
    "task": ("--task", RR | SAC | RES), "data": ("--data", RR | SAC | RES), "limit": ("--limit", RR | SAC | RES),
    "sample": ("--sample", RR | SAC), "sample_seed": ("--sample-seed", RR | SAC),
    "seed": ("--seed", RR | SAC | RES), "temperature": ("--temperature", RR | SAC),
    "concurrency": ("--concurrency", RR | SAC | RES),
    "pattern": (None, RR), "corrupted": (None, RR), "method": (None, RR | SAC | RES),
}
BOOL_KEYS = ("allow_identical", "all_rounds")
PER_TASK = ("max_len", "max_tokens")  # settings a task table may carry: each data set's own length limit
TOP_KEYS = {"name", "paper", "table", "method", "data_root", "prompt_budget", "analysis", "run", "axes", "cells",
            "models", "scale", "published"}


class ConfigError(ValueError):
    """A bad experiment file; the message names the file and the key."""


@dataclass
class Cell:
    name: str
    method: str
    params: dict  # the contract's params: only the keys that apply to this method
    argv: list  # `run <method> ...` without --out and the sweep's own flags
    models: list  # every model name the cell loads
    sources: dict = field(default_factory=dict)  # key -> where it was set ("[axes]")


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
    models: dict  # model name -> {chat_template_kwargs, max_model_len}
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
    if paper not in PAPERS:
        fail("paper", f"{paper!r}; choose one of {', '.join(PAPERS)}")
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
    for point, sources in points:
        cell = _cell(point, sources, names, root, check_files, where)
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


CONFIGS = Path(__file__).parent / "experiments" / "configs"  # the shipped experiment files, one per paper table


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
            elif key == "max_model_len" and (not isinstance(value, int) or value < 1):
                fail(f'[models."{name}"].{key}', f"a positive integer, got {value!r}")
            elif key not in ("chat_template_kwargs", "max_model_len"):
                fail(f'[models."{name}"].{key}', "unknown key; known: chat_template_kwargs, max_model_len")
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


# ------------------------------------------------------------------------------------------ one cell

def _cell(point, sources, axis_names, root, check_files, where):
    """The Cell of one point (its settings checked; the keys its method does not have left out)."""
    method = point.get("method")

    def fail(key, message):
        raise ConfigError(f"{where}: {sources.get(key, '[run]')}.{key}: {message}")

    if method not in METHODS:
        fail("method", f"{method!r}; choose one of {', '.join(METHODS)}")
    family = next(f for f in (RR, SAC, RES) if method in f)
    task = point.get("task")
    for key in PER_TASK:  # a task table's own length limit (L per data set) beats [run]'s
        if isinstance(task, dict) and key in task:
            if not sources.get(key, "[run]").endswith("run]"):  # an axis or a cell sets it too
                fail(key, f"set both by the task table ({task.get('name')}) and by {sources[key]}; set it in one place")
            point[key], sources[key] = task[key], sources.get("task", "[axes]")
            point["task"] = task = {k: v for k, v in task.items() if k != key}
    for key in point:
        if not KEYS[key][1] & family:
            fail(key, f"does not apply to {method}")
    point = {k: v for k, v in point.items() if method in KEYS[k][1]}  # e.g. chunk for maj: not its key
    point.pop("method", None)
    if "pattern" in point:
        m = re.fullmatch(r"(\d+)c(\d+)t", str(point.pop("pattern")))
        if not m:
            fail("pattern", 'a corruption pattern like "3c2t" (3 corrupted, 2 honest)')
        for key in ("agents", "corrupt", "corrupted"):
            if key in point:
                fail(key, "give pattern or agents/corrupt, not both")
        point["corrupt"], point["agents"] = int(m[1]), int(m[1]) + int(m[2])
        sources["corrupt"] = sources["agents"] = sources["pattern"]
    for key, value in point.items():
        _check_type(key, value, fail)
    default_agents = (len(point["models"]) if isinstance(point.get("models"), list) else 5) if family is RR else 7
    agents = point.get("agents", default_agents)  # one agent per named model unless agents says otherwise
    if family is RR and "models" in point and "agents" not in point:
        point["agents"], sources["agents"] = agents, sources.get("models", "[run]")
    if "corrupted" in point:
        idx = point["corrupted"]
        if "corrupt" in point:
            fail("corrupted", "give corrupted (agent indices) or corrupt (a count), not both")
        if len(set(idx)) != len(idx) or any(not 0 <= i < agents for i in idx):
            fail("corrupted", f"distinct agent indices in 0..{agents - 1}, got {idx}")
    if point.get("corrupt", 0) > agents:
        fail("corrupt", f"{point['corrupt']} is more than agents={agents}")
    if family is SAC and point.get("weak", 2) + point.get("byzantine", 1) > agents:
        fail("weak", f"weak {point.get('weak', 2)} plus byzantine {point.get('byzantine', 1)} is more than "
                     f"agents={agents}")
    if "models" in point and len(point["models"]) != agents:
        fail("models", f"names {len(point['models'])} models for agents={agents}; give one per agent")

    data_key = "task" if isinstance(point.get("task"), dict) and "data" in point["task"] else "data"
    task, label, data = _task(point, fail)
    if data is not None:
        data_path = Path(data) if Path(data).is_absolute() else root / data
        if check_files and not data_path.exists():
            fail(data_key, f"data file {data!r} not found in {root}; pass --data-root DIR (where the data files are)")
        point["data"] = str(data_path)
    if task is not None:
        point["task"] = task
    else:
        point.pop("task", None)

    params = {k: v for k, v in point.items() if k not in ("data", "task", "concurrency")}  # how, not what
    params.update(task=label)
    if data is not None:
        params["data"] = data
    if family is RR:
        params.setdefault("agents", agents)
        params.setdefault("corrupt", len(point.get("corrupted", [])))
        params["pattern"] = f"{params['corrupt']}c{params['agents'] - params['corrupt']}t"
    if family is RES and "defence" not in params:
        params["defence"] = "none"
    if family is RES and "fault" not in params:
        params["fault"] = "none"

    argv = ["run", method] + _flags(point, agents)
    name = _name(method, params, axis_names)
    return Cell(name, method, params, argv, _models(method, point, agents), dict(sources))


def _check_type(key, value, fail):
    ints = ("agents", "corrupt", "chunk", "trajectories", "max_len", "weak", "byzantine", "F", "rounds",
            "max_tokens", "judge_max_tokens", "fault_max_tokens", "inspector_max_tokens", "limit", "seed",
            "concurrency", "sample", "sample_seed")
    if key in ints and (not isinstance(value, int) or isinstance(value, bool)):
        fail(key, f"an integer, got {value!r}")
    if key in ("temperature", "pm", "pe") and (not isinstance(value, (int, float)) or isinstance(value, bool)):
        fail(key, f"a number, got {value!r}")
    if key in BOOL_KEYS and not isinstance(value, bool):
        fail(key, f"true or false, got {value!r}")
    if key in ("models", "corrupted") and not (isinstance(value, list) and value):
        fail(key, f"a non-empty list, got {value!r}")
    if key == "models" and not all(isinstance(m, str) and m for m in value):
        fail(key, "model names (strings)")
    if key == "corrupted" and not all(isinstance(i, int) for i in value):
        fail(key, "agent indices (integers)")
    if key in ("model", "strong_model", "weak_model", "adversary_model", "attack", "order", "adversary", "topology",
               "score_mode", "logprob_kind", "ra_ties", "system", "fault", "defence", "error_type", "faulty_role",
               "data") and not isinstance(value, str):
        fail(key, f"a string, got {value!r}")


def _task(point, fail):
    """(the --task value or None, the cell's task label, the data file as written or None)."""
    task, data = point.get("task"), point.get("data")
    if isinstance(task, dict):
        for key in task:
            if key not in ("name", "task", "data"):
                fail("task", f"unknown key {key!r} in a task table (name, task, data, {', '.join(PER_TASK)})")
        if data is not None and "data" in task:
            fail("data", "given both in the task table and as a key")
        data = task.get("data", data)
        label = task.get("name") or task.get("task") or (Path(data).name.split(".")[0] if data else None)
        task = task.get("task")
        if not isinstance(label, str) or (task is not None and not isinstance(task, str)):
            fail("task", "a task table needs a name (and optionally task = FORMAT, data = FILE)")
        return task, label, data
    if task is not None and not isinstance(task, str):
        fail("task", f"a task name or a table {{name, task, data}}, got {task!r}")
    label = task or (Path(data).name.split(".")[0] if data else "gen-arith")
    return task, label, data


def _flags(point, agents):
    argv = []
    if "corrupted" in point:  # explicit corrupted agents: they go first (the runner corrupts agents 0..c-1)
        idx = point["corrupted"]
        order = idx + [i for i in range(agents) if i not in idx]
        if "models" in point:
            point = {**point, "models": [point["models"][i] for i in order]}
        point = {**point, "corrupt": len(idx)}
    for key, value in point.items():
        flag = KEYS[key][0]
        if flag is None:
            continue
        if key in BOOL_KEYS:
            argv += [flag] if value else []
        elif key == "models":
            argv += [flag, ",".join(value)]
        else:
            argv += [flag, str(value)]
    return argv


def _models(method, point, agents):
    """Every model name the cell loads (None: the embedded default)."""
    if method in RR:
        return list(dict.fromkeys(point.get("models") or [point.get("model")]))
    if method in RES:
        return [point.get("model")]
    strong = point.get("strong_model")
    names = [strong, point.get("weak_model", strong) if point.get("weak", 2) else None,
             point.get("adversary_model", strong) if point.get("adversary") == "decoy" else None]
    return list(dict.fromkeys(n for n in names if n is not None)) or [None]


def _name(method, params, axis_names):
    """A short, deterministic, filesystem-safe directory name from the method and the varied keys."""
    parts = [SHORT.get(method, method)] + ([] if "task" in axis_names else [_part("task", params["task"])])
    done = set()
    for key in axis_names:
        if key in ("method",) or key in done:
            continue
        if key in ("pattern", "agents", "corrupt") and "pattern" in params:
            key = "pattern"  # a round-robin cell's agents and corrupt show as 3c2t
        if key not in params or key in done:
            continue
        done.add(key)
        parts.append(_part(key, params[key]))
    text = "-".join(p for p in parts if p)
    text = re.sub(r"[^A-Za-z0-9._+=-]+", "-", text).strip("-.")
    if len(text) > 100:  # still unique: a hash of the whole name
        text = text[:90] + "-" + hashlib.sha1(text.encode()).hexdigest()[:8]
    return text


SHORT = {"resilience": "res"}
PREFIX = {"chunk": "K", "trajectories": "M", "max_len": "L", "F": "F", "rounds": "T", "weak": "w",
          "byzantine": "b", "temperature": "t", "seed": "s", "limit": "n", "agents": "N", "max_tokens": "mt",
          "judge_max_tokens": "jt", "pm": "pm", "pe": "pe"}


def _part(key, value):
    if key == "models":
        counts = {}
        for m in value:
            counts[short_model(m)] = counts.get(short_model(m), 0) + 1
        return "+".join(f"{n}x{m}" for m, n in counts.items())
    if key in ("model", "strong_model", "weak_model", "adversary_model"):
        return short_model(value)
    if key == "corrupted":
        return "c" + ".".join(map(str, value))
    if key == "defence":
        return "" if value == "none" else f"def-{value}"
    if key == "fault" and value == "none":
        return "clean"
    if isinstance(value, bool):
        return key.replace("_", "-") if value else ""
    return f"{PREFIX.get(key, '')}{value}"


# ------------------------------------------------------------------------------- what a cell needs

def needed_len(cell, prompt_budget=PROMPT_BUDGET):
    """The max_model_len a cell needs: the longest prompt plus what is generated after it (an estimate:
    the prompt is prompt_budget tokens). RR: the shared answer of L tokens follows each agent's prompt;
    SAC: a refine prompt holds the neighbours' final answers (only answers travel, not reasoning), then
    max_tokens (or a judgement of judge_max_tokens); resilience: a few earlier messages, then max_tokens."""
    p = cell.params
    if cell.method in RR:
        return prompt_budget + p.get("max_len", 512)
    if cell.method in SAC:
        generated = max(p.get("max_tokens", 1000), p.get("judge_max_tokens", 1000) if cell.method == "sac" else 0)
        return prompt_budget + p.get("agents", 7) * ANSWER_BUDGET + generated
    return prompt_budget + (HISTORY_TURNS + 1) * p.get("max_tokens", 1024)


def model_context(name, settings):
    """The context the engine gets for a model: [models."name"].max_model_len, else the checkpoint's
    max_position_embeddings when it is here; None when unknown (a model not on this machine)."""
    limit = settings.get(str(name), {}).get("max_model_len") if name is not None else None
    if limit is not None:
        return limit
    where = local_model(name)
    try:
        if where == "hub cache":  # read from the cache as it is: no hub call
            from huggingface_hub import try_to_load_from_cache
            path = Path(try_to_load_from_cache(str(name), "config.json"))
        elif where is not None:
            from .engine.loader import resolve_model
            path = Path(resolve_model(name)) / "config.json"
        else:
            return None
        config = json.loads(path.read_text())
    except Exception:  # an unreadable config: the engine will say
        return None
    config = config.get("text_config", config)
    return config.get("max_position_embeddings")


def local_model(name):
    """Where a model is on this machine, without any network call: "embedded", "path", "hub cache";
    None when it is not here (it needs a server or a download)."""
    from .engine.loader import EMBEDDED, _HUB_ID
    if name is None or str(name).lower() in EMBEDDED:
        return "embedded"
    if Path(name).expanduser().exists():
        return "path"
    if _HUB_ID.match(str(name)):
        try:
            from huggingface_hub import try_to_load_from_cache
            if isinstance(try_to_load_from_cache(str(name), "config.json"), str):
                return "hub cache"
        except Exception:
            return None
    return None


# ------------------------------------------------------------------- the run parser's own checks

# The settings every cell's params show (with the parser's defaults), so that `published` entries and
# the report can match them whether or not the file spelled them out.
SHOWN = {"maj": ("agents", "corrupt", "max_len", "attack", "temperature", "seed", "limit"),
         "rr": ("agents", "corrupt", "chunk", "max_len", "attack", "temperature", "seed", "limit"),
         "rrmaj": ("agents", "corrupt", "chunk", "trajectories", "max_len", "attack", "temperature", "seed", "limit"),
         "sac": ("agents", "weak", "byzantine", "adversary", "F", "rounds", "topology", "max_tokens",
                 "judge_max_tokens", "score_mode", "temperature", "seed", "limit"),
         "cpwbft": ("agents", "weak", "byzantine", "adversary", "F", "rounds", "topology", "max_tokens",
                    "temperature", "seed", "limit"),
         "resilience": ("system", "fault", "defence", "seed", "limit", "max_tokens")}


@functools.cache
def run_parser():
    """The CLI's parser, built once (a sweep parses every cell with it)."""
    from .cli import parser
    return parser()


def parse_cell(cell, where, extra=()):
    """The cell's argv through `byzantium run`'s parser and its checks that load nothing (no questions,
    no model); fills the params' defaults. Returns the argparse namespace; errors name the key."""
    import contextlib
    import io
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = run_parser().parse_args(cell.argv + list(extra))
    except SystemExit:
        lines = err.getvalue().strip().splitlines() or ["refused by the run parser"]
        raise ConfigError(_blame(cell, where, lines[-1].split("error: ", 1)[-1])) from None
    try:
        _static_checks(cell.method, args)
    except ValueError as error:
        raise ConfigError(_blame(cell, where, str(error))) from None
    for key in SHOWN[cell.method]:
        if key not in cell.params:
            value = getattr(args, {"defence": "defense"}.get(key, key), None)
            if key == "trajectories" and value is None:
                value = args.agents  # RRMaj's default M = N
            if key == "topology" and value is None:
                value = "merg"
            if key == "max_tokens" and value is None:
                continue
            cell.params[key] = value
    if cell.method in RR and cell.params.get("corrupted"):
        cell.params["pattern"] = f"{cell.params['corrupt']}c{cell.params['agents'] - cell.params['corrupt']}t"
    return args


def _blame(cell, where, message):
    """`file: [axes].corrupt: message` for the first key whose flag the message names."""
    for key, source in cell.sources.items():
        flag = KEYS.get(key, (None,))[0]
        if flag and re.search(re.escape(flag) + r"(?![\w-])", message):
            return f"{where}: {source}.{key}: {message} (cell {cell.name})"
        if key == "pattern" and re.search(r"--(agents|corrupt)(?![\w-])", message):
            return f"{where}: {source}.pattern: {message} (cell {cell.name})"
    return f"{where}: cell {cell.name}: {message}"


def _static_checks(method, args):
    """What prepare_run / prepare_sac / prepare_resilience check, without loading questions or models."""
    from .tasks import FORMATS, HUB, TASKS
    for flag in ("limit", "sample", "concurrency", "max_tokens", "judge_max_tokens", "fault_max_tokens",
                 "inspector_max_tokens", "rounds"):
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    if method in RES:
        from .experiments.resilience import make_system
        from .tasks.resilience import BUILTIN_TASKS, DATA_FILES
        for flag in ("pm", "pe"):
            if not 0.0 <= getattr(args, flag) <= 1.0:
                raise ValueError(f"--{flag} must be a probability in [0, 1], got {getattr(args, flag)}")
        if args.system == "all":
            raise ValueError("--system all: a sweep names its systems as an axis, one per cell")
        make_system(args.system, args.faulty_role, args.rounds)
        if args.task not in BUILTIN_TASKS and args.data is None:
            raise ValueError(f"--task {args.task} needs its data: --data {DATA_FILES[args.task]}")
        return
    if args.data is None and (args.task or "gen-arith") not in TASKS and args.task.split(":")[0] not in HUB:
        raise ValueError(f"unknown --task {args.task!r}; choose one of {', '.join(TASKS)}, a dataset name "
                         f"({', '.join(HUB)}), or a format with --data FILE")
    if args.data is not None and args.task is not None and args.task not in FORMATS:
        raise ValueError(f"unknown --task {args.task!r} for --data; dataset formats: {', '.join(FORMATS)}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")
    if method in SAC:
        from .experiments.sac import check_config
        check_config(method, args.agents, args.weak, args.byzantine, args.adversary, args.F, args.rounds,
                     args.topology or "merg", args.seed, args.score_mode, None)
        return
    from .engine.loader import DEFAULT_MODEL
    from .experiments.rr import check_config
    m = args.trajectories if args.trajectories is not None or method != "rrmaj" else args.agents
    models = args.models.split(",") if args.models else [args.model] * args.agents
    check_config(method, args.agents, args.corrupt, args.chunk, m, args.max_len, args.attack, args.temperature,
                 args.order, [n or DEFAULT_MODEL for n in models], allow_identical=args.allow_identical)

