"""Tasks: records, loaders (local files, hub ids, built-in generators), answer checking.

    load_task("gen-track", limit=20, seed=0)           a built-in generator
    load_task("data/gsm8k.jsonl", limit=100, seed=0)   a local file, format detected
    load_task("data/x.jsonl", format="bbh")            a local file, format named
    load_task("gsm8k")                                  the `datasets` hub (when reachable)
    load_resilience_task("ciar", "data/ciar.jsonl")     the resilience study's tasks (resilience.py)
"""

from pathlib import Path
from types import MappingProxyType

from .answers import KINDS, extract_answer, is_correct, normalize_answer
from .generators import gen_arith, gen_order, gen_sum, gen_track
from .loaders import FORMATS, HUB, detect_format, load_hub, load_jsonl, read_records, sample_tasks
from .record import Task
from .resilience import (BUILTIN_TASKS, RESILIENCE_TASKS, aggregate, gen_code, load_resilience_task, score_output,
                         sniff_resilience_format)

# Built-in generators by name: fn(n, seed, **options) -> list[Task]. Read-only. Their answers are
# checked by `Task.check`; gen-code's are checked by running tests (resilience.score_output), so it
# is loaded by name through `load_task` / `load_resilience_task` but is not listed here.
TASKS = MappingProxyType({"gen-arith": gen_arith, "gen-track": gen_track, "gen-order": gen_order,
                         "gen-sum": gen_sum})
DEFAULT_N = 100


def get_task(name, n=DEFAULT_N, seed=0, **options):
    """n problems of a built-in generator (options: k=... for gen-track / gen-order)."""
    if name not in TASKS:
        raise ValueError(f"unknown generated task {name!r}; known: {sorted(TASKS)}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return TASKS[name](n, seed=seed, **options)


def load_task(name_or_path, limit=None, seed=None, format=None):
    """Tasks by generator name, local file path, or dataset name / hub id.

    For files and the hub, `seed` (when given) shuffles before `limit` picks; for generators it
    is the generator seed (default 0) and `limit` the number of problems (default DEFAULT_N)."""
    name = str(name_or_path)
    if name in TASKS:
        return get_task(name, DEFAULT_N if limit is None else limit, 0 if seed is None else seed)
    if name in BUILTIN_TASKS:
        return load_resilience_task(name, limit=DEFAULT_N if limit is None else limit, seed=seed)
    if Path(name).exists():
        fmt = format or (sniff_resilience_format(name) if Path(name).is_file() else None)
        if fmt in RESILIENCE_TASKS:
            return load_resilience_task(fmt, name, limit=limit, seed=seed)
        return load_jsonl(name, format=format, limit=limit, seed=seed)
    if name.split(":")[0] in HUB or ("/" in name and not name.endswith((".jsonl", ".json", ".gz"))):
        return load_hub(name, format=format, limit=limit, seed=seed)
    raise ValueError(f"unknown task {name!r}: not a generator ({', '.join([*TASKS, 'gen-code'])}), not an existing "
                     f"file, not a dataset name ({', '.join(HUB)})")


__all__ = ["Task", "KINDS", "FORMATS", "HUB", "TASKS", "get_task", "load_task", "load_jsonl", "load_hub",
           "read_records", "sample_tasks", "detect_format", "extract_answer", "is_correct", "normalize_answer",
           "RESILIENCE_TASKS", "load_resilience_task", "score_output", "aggregate", "gen_code"]
