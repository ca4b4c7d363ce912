"""One cell of an experiment file (config.py): the keys a file may set, and the Cell one point of the
settings makes (its argv, the models it loads, a directory name from what varies).

A key is a flag of `byzantium run <method>` that the method's Command declares a sweep may vary
(`sweep_keys`, next to its flags in experiments/*_command.py): its flag, its type and the methods that
have it are read from there, not listed here again; so is a method's default task (its --task default).
The sweep's own keys (pattern, corrupted, budget, method) are below."""
import argparse
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..experiments import resilience_command, rr_command, sac_command
from ..experiments.report_cells import short_model
from ..experiments.run_command import RUN_METHODS

# The families: the methods of one paper, which share its settings (a pattern, a budget, their defaults).
RR, SAC, RES = ({command.name for command in module.RUN_METHODS}
                for module in (rr_command, sac_command, resilience_command))
METHODS = tuple(command.name for command in RUN_METHODS)
FAMILIES = [RR, SAC, RES] + [{m} for m in METHODS if m not in RR | SAC | RES]  # any other method: its own
COMMANDS = {command.name: command for command in RUN_METHODS}  # what each method tells the sweep
SPELLING = {"defense": "defence"}  # a flag's dest -> its key where the files spell it otherwise


def _parser(command):
    ap = argparse.ArgumentParser()
    command.add_args(ap)
    return ap


PARSERS = {command.name: _parser(command) for command in RUN_METHODS}
# The task a cell without one runs: its --task flag's default, else load_questions' (commands.py).
DEFAULT_TASK = {name: ap.get_default("task") or "gen-arith" for name, ap in PARSERS.items()}


def _declared_flags():
    """key -> (its argparse action, the methods that declare it), from each run method's parser."""
    declared = {}
    for command in RUN_METHODS:
        actions = {action.dest: action for action in PARSERS[command.name]._actions}
        for dest in command.sweep_keys:
            action, methods = declared.setdefault(SPELLING.get(dest, dest), (actions[dest], set()))
            if action.option_strings != actions[dest].option_strings:
                raise RuntimeError(f"{dest}: {command.name}'s flag is not the other methods' ({action.option_strings})")
            methods.add(command.name)
    return declared


DECLARED = _declared_flags()
# key -> (its flag, the methods that have it); a flag of None is a key of the sweep's own.
KEYS = {key: (next(o for o in action.option_strings if o.startswith("--")), methods)
        for key, (action, methods) in DECLARED.items()} | {
    "pattern": (None, RR), "corrupted": (None, RR), "method": (None, set(METHODS)),
    "budget": (None, RR | SAC),  # corrupted agents of N: RR's --corrupt, SAC's --byzantine (one scale for both)
}
BOOL_KEYS = tuple(key for key, (action, _) in DECLARED.items() if action.nargs == 0)  # store_true flags
PER_TASK = ("max_len", "max_tokens")  # settings a task table may carry: each data set's own length limit


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


# [models."name"] keys that are engine options, each the sweep flag that sets it for every model instead.
ENGINE_KEYS = {"tensor_parallel_size": "--tensor-parallel-size", "quantization": "--quantization"}
ENGINE_DEFAULTS = {"tensor_parallel_size": 1, "quantization": None}


def model_engine(settings, name):
    """A model's engine settings from the file's [models] tables, defaults filled in."""
    given = settings.get(str(name), {}) if name is not None else {}
    return {key: given.get(key, default) for key, default in ENGINE_DEFAULTS.items()}


def model_options(settings, backend="native", given=()):
    """LLMPool's model_options from the file's [models] tables: {model name: its engine settings} (native
    engines only). A setting named in `given` (the pool's own kwargs: the sweep's --tensor-parallel-size /
    --quantization) wins for every model and is left out."""
    if backend != "native":
        return {}
    options = {}
    for name, settings_ in settings.items():
        own = {key: settings_[key] for key in ENGINE_KEYS if key in settings_ and key not in given}
        if own:
            options[str(name)] = own
    return options


def make_cell(point, sources, axis_names, root, check_files, where):
    """The Cell of one point (its settings checked; the keys its method does not have left out)."""
    method = point.get("method")

    def fail(key, message):
        raise ConfigError(f"{where}: {sources.get(key, '[run]')}.{key}: {message}")

    if method not in METHODS:
        fail("method", f"{method!r}; choose one of {', '.join(METHODS)}")
    family = next(f for f in FAMILIES if method in f)
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
    if "budget" in point:  # the same adversary budget for both families, each in its own flag
        own = "corrupt" if family is RR else "byzantine"
        if any(key in point for key in (own, "pattern", "corrupted")):
            fail("budget", f"give budget or {own}, not both")
        point[own], sources[own] = point.pop("budget"), sources.get("budget", "[run]")
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
    task, label, data = _task(point, fail, DEFAULT_TASK[method])
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
    """The value's type is the one its flag parses (int, float, a switch, a string; a flag's own type
    function, such as SAC's count-or-share, is called on it); the run parser checks the value itself."""
    if key in ("models", "corrupted"):
        if not (isinstance(value, list) and value):
            fail(key, f"a non-empty list, got {value!r}")
        if key == "models" and not all(isinstance(m, str) and m for m in value):
            fail(key, "model names (strings)")
        if key == "corrupted" and not all(isinstance(i, int) for i in value):
            fail(key, "agent indices (integers)")
        return
    if key not in DECLARED or key == "task":  # the sweep's own keys; a task may be a table (_task)
        return
    action = DECLARED[key][0]
    if action.nargs == 0:
        if not isinstance(value, bool):
            fail(key, f"true or false, got {value!r}")
    elif isinstance(value, bool):
        fail(key, f"not a switch: give a value, got {value!r}")
    elif action.type is int:
        if not isinstance(value, int):
            fail(key, f"an integer, got {value!r}")
    elif action.type is float:
        if not isinstance(value, (int, float)):
            fail(key, f"a number, got {value!r}")
    elif action.type is None:
        if not isinstance(value, str):
            fail(key, f"a string, got {value!r}")
    elif not isinstance(value, (int, float, str)):
        fail(key, f"a value of {action.option_strings[-1]}, got {value!r}")
    else:  # e.g. a count or a share of the agents (0.286), F or "auto"
        try:
            parsed = action.type(str(value))
        except (argparse.ArgumentTypeError, ValueError) as error:
            fail(key, str(error))
        if isinstance(value, str) and not isinstance(parsed, str):  # "2": a number, written as one
            fail(key, f"a number, not the string {value!r}")


def _task(point, fail, default_task):
    """(the --task value or None, the cell's task label, the data file as written or None); a cell with
    neither task nor data runs (and is labelled) its method's default task."""
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
    label = task or (Path(data).name.split(".")[0] if data else default_task)
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
    if method in SAC:
        strong = point.get("strong_model")
        names = [strong, point.get("weak_model", strong) if point.get("weak", 2) else None,
                 # a decoy writes with its model, an adaptive adversary judges with it (run sac|cpwbft's rule)
                 point.get("adversary_model", strong)
                 if point.get("byzantine", 1) and point.get("adversary") in ("decoy", "adaptive") else None]
        return list(dict.fromkeys(n for n in names if n is not None)) or [None]
    return [point.get("model")]  # resilience, and any method of one --model


def _name(method, params, axis_names):
    """A short, deterministic, filesystem-safe directory name from the method and the varied keys."""
    parts = [SHORT.get(method, method)] + ([] if "task" in axis_names else [_part("task", params["task"])])
    done = set()
    for key in axis_names:
        if key in ("method",) or key in done:
            continue
        if key in ("pattern", "agents", "corrupt", "budget") and "pattern" in params:
            key = "pattern"  # a round-robin cell's agents and corrupt show as 3c2t
        elif key == "budget":
            key = "byzantine"  # a SAC / CP-WBFT cell's as b2
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
          "judge_max_tokens": "jt", "pm": "pm", "pe": "pe", "candidates": "cand", "robustness": "r"}


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
