"""The cells a report reads: run directories, from a sweep (DIR/sweep.json) or given plainly.

    cells, sweeps = load_cells(["runs/table3", "runs/my-rrmaj"])

A sweep DIR holds sweep.json (name, paper, table, analysis, cells with dir/method/params/status,
published numbers) and one run directory per cell. A plain run directory (results.jsonl +
summary.json, as `byzantium run ...` writes it) is one cell whose method and params are read from its
summary's "config"; a directory above run directories (e.g. a resilience sweep's OUT) gives one cell
per run found below it. Each cell carries its records (error rows counted, not kept).
"""
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..protocols.metrics.sac import instance_metrics
from .runner import RESULTS, SUMMARY, is_error, read_results

SWEEP = "sweep.json"
CONSENSUS = ("maj", "rr", "rrmaj")
BYZANTINE = ("sac", "cpwbft")


def short_model(name):
    """A model's part of a cell name: the last path part, without .gguf and an -Instruct[-date] tail."""
    if name is None:
        return "default"
    return re.sub(r"-Instruct(-\d+)?$", "", Path(str(name).rstrip("/")).name.removesuffix(".gguf"))


@dataclass
class Cell:
    name: str
    method: str
    params: dict
    dir: Path | None = None
    status: str = "done"
    error: str | None = None
    summary: dict | None = None
    records: list = field(default_factory=list)  # results, error rows left out
    errors: int = 0  # error rows in results.jsonl
    sweep: dict | None = None  # the sweep.json it came from (None for a plain run directory)


def params_from_config(config) -> tuple[str, dict]:
    """(method, params in sweep.json's vocabulary) from a run summary's "config"."""
    c = dict(config)
    if "system" in c and "fault" in c:  # resilience
        keys = ("system", "structure", "task", "fault", "seed", "rounds", "model", "data", "faulty_role", "max_tokens")
        params = {k: c.get(k) for k in keys}
        params["defence"] = c.get("defense")  # the sweep files' spelling
        return "resilience", {k: v for k, v in params.items() if v is not None}
    if "protocol" in c:  # sac / cpwbft
        models = c.get("models") or {}
        params = dict(model=models.get("strong"), task=c.get("task"), data=c.get("data"), agents=c.get("agents"),
                      weak=c.get("weak"), byzantine=c.get("byzantine"), F=c.get("F"), rounds=c.get("T"),
                      topology=c.get("topology"), adversary=c.get("adversary"), max_tokens=c.get("max_tokens"),
                      judge_max_tokens=c.get("judge_max_tokens"), score_mode=c.get("score_mode"),
                      temperature=c.get("temperature"), seed=c.get("seed"), limit=c.get("problems"))
        if models.get("weak") not in (None, models.get("strong")):
            params["weak_model"] = models["weak"]
        return c["protocol"], {k: v for k, v in params.items() if v is not None}
    if c.get("method") in CONSENSUS:
        n, corrupt = c["agents"], c["corrupt"]
        models = c.get("models") or []
        params = dict(task=c.get("task"), data=c.get("data"), corrupt=corrupt, agents=n,
                      pattern=f"{corrupt}c{n - corrupt}t", chunk=c.get("k"), trajectories=c.get("m"),
                      max_len=c.get("max_len"), attack=c.get("attack"), attack_mode=c.get("attack_mode"),
                      candidates=c.get("candidates"), temperature=c.get("temperature"), seed=c.get("seed"))
        if len(set(models)) == 1:
            params["model"] = models[0]
        elif models:
            params["models"] = ",".join(models)
        return c["method"], {k: v for k, v in params.items() if v is not None}
    raise ValueError(f"unknown run configuration (keys: {', '.join(sorted(c))})")


def _read_run(cell):
    """Fill the cell's records, error count and summary from its directory (when it has them)."""
    if cell.dir is None or not cell.dir.is_dir():
        return cell
    rows = read_results(cell.dir)
    cell.records = [r for r in rows if not is_error(r)]
    cell.errors = len(rows) - len(cell.records)
    path = cell.dir / SUMMARY
    if path.is_file():
        cell.summary = json.loads(path.read_text())
    return cell


def _is_run(path):
    return (path / RESULTS).is_file()  # a sweep's OUT may hold a summary.json of its own, without results


def _plain(path, base):
    summary = json.loads((path / SUMMARY).read_text()) if (path / SUMMARY).is_file() else None
    if summary is None or not isinstance(summary.get("config"), dict):
        raise ValueError(f"{path}: no summary.json with the run's configuration (method and settings unknown)")
    method, params = params_from_config(summary["config"])
    if "limit" not in params and summary.get("total") is not None:
        params["limit"] = summary["total"]
    name = str(path.relative_to(base)) if path != base else path.name
    return _read_run(Cell(name=name, method=method, params=params, dir=path))


def load_dir(path) -> tuple[list, dict | None]:
    """(cells, the sweep.json dict or None) of one DIR."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path}: no such directory")
    if (path / SWEEP).is_file():
        sweep = json.loads((path / SWEEP).read_text())
        if not isinstance(sweep.get("cells"), list):
            raise ValueError(f"{path / SWEEP}: no list of cells")
        cells = []
        for c in sweep["cells"]:
            cells.append(_read_run(Cell(name=c.get("name") or c["dir"], method=c["method"], params=c.get("params") or {},
                                        dir=path / c["dir"] if c.get("dir") else None,
                                        status=c.get("status", "done"), error=c.get("error"), sweep=sweep)))
        if not any(c.records or c.errors for c in cells):
            raise ValueError(f"{path}: no results yet in any of its {len(cells)} cells")
        return cells, sweep
    if _is_run(path):
        return [_plain(path, path)], None
    runs = sorted({p.parent for p in path.rglob(SUMMARY)} | {p.parent for p in path.rglob(RESULTS)})
    cells = [_plain(p, path) for p in runs if (p / SUMMARY).is_file() and "config" in json.loads((p / SUMMARY).read_text())]
    if not cells:
        raise ValueError(f"{path}: no results (no {SWEEP}, and no run directory with {SUMMARY} and {RESULTS})")
    return cells, None


def load_cells(dirs) -> tuple[list, list]:
    """(every cell of every DIR, the sweep.json dicts found). Cell names are prefixed with their DIR
    when several DIRs are given."""
    if not dirs:
        raise ValueError("no directory given")
    cells, sweeps = [], []
    for d in dirs:
        got, sweep = load_dir(d)
        if len(dirs) > 1:
            for c in got:
                c.name = f"{Path(d).name}/{c.name}"
        cells += got
        if sweep is not None:
            sweeps.append(sweep)
    return cells, sweeps


# ---------------------------------------------------------------------------- per-record numbers

def _sac_metrics(record):
    if "_metrics" not in record:  # computed once: votes and answer checks are not free
        record["_metrics"] = instance_metrics(record)
    return record["_metrics"]


def value(cell, record):
    """The record's headline number in [0, 1]: correct (MAJ/RR/RRMaj), RA (SAC/CP-WBFT), score (resilience)."""
    if cell.method in BYZANTINE:
        return _sac_metrics(record)["RA"]
    if cell.method == "resilience":
        return (record.get("score") or {}).get("score")
    return float(bool(record.get("correct")))


def metric_name(cell):
    if cell.method in BYZANTINE:
        return "RA"
    if cell.method == "resilience":
        return (cell.summary or {}).get("metric") or "score"
    return "accuracy"


def parse_failures(cell, record) -> tuple[int, int]:
    """(final answer unreadable: 0/1, unreadable answers of voters/agents)."""
    if cell.method in BYZANTINE:
        return 0, _sac_metrics(record)["answer_parse_failures"]
    if cell.method == "resilience":
        detail = (record.get("score") or {}).get("detail") or {}
        return int("answer" in detail and detail["answer"] is None), 0
    voters = record.get("agents") or record.get("trajectories") or []
    return int(record.get("answer") is None), sum(v.get("answer") is None for v in voters)


def sac_metrics(record):
    return _sac_metrics(record)


# ---------------------------------------------------------------------------- published numbers

def _same(a, b):
    return a == b or str(a) == str(b)


def matches(entry, cell) -> bool:
    """Does a published entry belong to this cell: method equal (when given) and every key of a
    non-empty `where` equal to the cell's params (a key the cell lacks does not match)? An entry with
    no `where` is a sweep-wide headline: it is listed on its own (report's "Published numbers"); one with
    `average = true` is an average over cells, shown beside our average of them, never beside one cell."""
    return not entry.get("average") and covers(entry, cell)


def covers(entry, cell) -> bool:
    """Is the cell one of those a published entry describes (for an average: one it averages over)?"""
    where = entry.get("where") or {}
    return bool(where) and entry.get("method") in (None, cell.method) and \
        all(k in cell.params and _same(cell.params[k], v) for k, v in where.items())


def published_for(cell, metric=None) -> list:
    """The sweep's published entries that match this cell (of `metric`, when given)."""
    return [p for p in (cell.sweep or {}).get("published") or []
            if matches(p, cell) and (metric is None or p.get("metric") == metric)]


def format_published(entries, with_metric=True) -> str:
    """'BFTI 5.4-6.5 % (SAC paper Table 3)'; '' when none."""
    parts = []
    for p in entries:
        value = f"{p['value']:g}" + (f" to {p['value_max']:g}" if p.get("value_max") is not None else "")
        unit = f" {p['unit']}" if p.get("unit") else ""
        metric = f"{p.get('metric')} " if with_metric and p.get("metric") else ""
        source = p.get("source") or p.get("table") or ""
        parts.append(f"{metric}{value}{unit}" + (f" ({source})" if source else ""))
    return "; ".join(parts)
