"""The comparison table of "On the Resilience of LLM-Based Multi-Agent Collaboration with Faulty Agents"
from run summaries: per system and task the clean, faulty and defended scores, the drop and the share of
it a defence recovers, and their means by structure beside the paper's average drops.

    print(format_report(resilience_report(["runs/resilience"])))   # every run summary below a directory
"""
import json
from pathlib import Path

from ..protocols.resilience import STRUCTURES, SYSTEMS
from .runner import SUMMARY

PAPER_DROPS = {"hierarchical": 5.5, "flat": 10.5, "linear": 23.7}  # average drop in points, the paper's headline
# Settings that tell the conditions of one system and task apart; the rest must match to compare runs.
FAULT_KEYS = ("fault", "faulty_role", "pm", "pe", "error_type", "fault_max_tokens")
DEFENSE_KEYS = ("defense", "inspector_max_tokens")


def label(fault="none", defense="none") -> str:
    """A run's directory name: clean, autoinject, autoinject+both, clean+inspector."""
    return ("clean" if fault == "none" else fault) + ("" if defense == "none" else f"+{defense}")


def condition(config) -> str | None:
    """clean, faulty or defended; None for a defence on a clean system (not part of the table)."""
    faulty, defended = config["fault"] != "none", config["defense"] != "none"
    return "defended" if faulty and defended else "faulty" if faulty else None if defended else "clean"


def load_summaries(paths) -> list:
    """Run summaries from summary dicts, run directories, summary.json files, or directories above runs
    (a sweep's OUT: every run summary found below it)."""
    summaries = []
    for item in paths:
        if isinstance(item, dict):
            summaries.append(item)
            continue
        path = Path(item)
        files = [path] if path.is_file() else [path / SUMMARY] if _is_run(path / SUMMARY) else \
            sorted(p for p in path.rglob(SUMMARY) if _is_run(p))
        if not files:
            raise ValueError(f"{path}: no resilience run summary there")
        summaries += [json.loads(p.read_text()) for p in files]
    return summaries


def _is_run(path) -> bool:
    if not path.is_file():
        return False
    config = json.loads(path.read_text()).get("config")
    return isinstance(config, dict) and "system" in config and "fault" in config


def _points(summary):
    return None if summary is None or summary.get("score") is None else 100 * summary["score"]


def _key(config, keys):
    return json.dumps({k: config.get(k) for k in keys}, sort_keys=True)


def resilience_report(runs) -> dict:
    """The table from run summaries (see load_summaries for what `runs` may be). Scores are in points
    (100 x the task's score). One row per system, task, fault and defence:
        drop      = clean - faulty
        recovered = (defended - faulty) / (clean - faulty), None when the drop is 0 (undefined)
    Runs are compared only when every other setting (model, problems, seed, rounds, ...) matches. By
    structure: the means of the rows' numbers per (structure, fault, defence), and the recovered share
    of the mean drop."""
    summaries = load_summaries(runs)
    groups, skipped = {}, []
    for s in summaries:
        c = s["config"]
        cond = condition(c)
        if cond is None:
            skipped.append(f"{c['system']} {label(c['fault'], c['defense'])}: a defence without a fault")
            continue
        base = _key(c, [k for k in c if k not in FAULT_KEYS + DEFENSE_KEYS])
        group = groups.setdefault(base, {"clean": None, "faulty": {}, "defended": {}})
        if cond == "clean":
            group["clean"] = s
        elif cond == "faulty":
            group["faulty"][_key(c, FAULT_KEYS)] = s
        else:
            group["defended"].setdefault(_key(c, FAULT_KEYS), {})[_key(c, DEFENSE_KEYS)] = s

    rows = []
    for group in groups.values():
        faults = list(dict.fromkeys(list(group["faulty"]) + list(group["defended"]))) or [None]
        for fk in faults:
            defended = list(group["defended"].get(fk, {}).values()) or [None]
            for d in defended:
                rows.append(_row(group["clean"], group["faulty"].get(fk), d))
    order = {name: i for i, name in enumerate(SYSTEMS)}
    rows.sort(key=lambda r: (r["task"], STRUCTURES.index(r["structure"]), order.get(r["system"], 99),
                             r["fault"] or "", r["defense"] or ""))
    return {"rows": rows, "structures": _by_structure(rows), "skipped": skipped, "paper_drops": PAPER_DROPS}


def _row(clean, faulty, defended) -> dict:
    some = clean or faulty or defended
    c = some["config"]
    fc = (faulty or defended or {}).get("config", {})
    row = {"system": c["system"], "structure": c["structure"], "task": c["task"], "model": c.get("model"),
           "metric": some.get("metric"),
           "fault": fc.get("fault"), "fault_settings": {k: fc.get(k) for k in FAULT_KEYS} if fc else None,
           "defense": defended["config"]["defense"] if defended else None,
           "clean": _points(clean), "faulty": _points(faulty), "defended": _points(defended),
           "complete": all(s["complete"] for s in (clean, faulty, defended) if s is not None)}
    row["drop"], row["recovered"], row["note"] = _drop_and_share(row["clean"], row["faulty"], row["defended"])
    return row


def _drop_and_share(clean, faulty, defended):
    """(drop, recovered share, note); the share is undefined (None) when there is no drop to recover."""
    if clean is None or faulty is None:
        return None, None, None
    drop = clean - faulty
    if defended is None:
        return drop, None, None
    if drop == 0:
        return drop, None, "no drop: recovered share undefined"
    return drop, (defended - faulty) / drop, None


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _by_structure(rows) -> list:
    groups = {}
    for r in rows:
        groups.setdefault((r["task"], r["structure"], r["fault"], r["defense"]), []).append(r)
    out = []
    for (task, structure, fault, defense), rs in groups.items():
        mean = {k: _mean(r[k] for r in rs) for k in ("clean", "faulty", "defended", "drop")}
        full = [r for r in rs if None not in (r["clean"], r["faulty"], r["defended"])]
        # The share of the mean drop recovered on average (not a mean of shares: one tiny drop would
        # dominate it); over the rows that have all three numbers.
        drop = _mean(r["drop"] for r in full)
        share, note = None, None
        if full:
            if drop == 0:
                note = "no drop: recovered share undefined"
            else:
                share = (_mean(r["defended"] for r in full) - _mean(r["faulty"] for r in full)) / drop
        out.append({"task": task, "structure": structure, "fault": fault, "defense": defense,
                    "systems": sorted({r["system"] for r in rs}), **mean, "recovered": share, "note": note,
                    "paper_drop": PAPER_DROPS.get(structure)})
    return out


def _num(x, signed=False):
    return "-" if x is None else f"{x:+.1f}" if signed else f"{x:.1f}"


def _share(x, note):
    return "n/a (no drop)" if note else "-" if x is None else f"{100 * x:.0f}%"


def _table(header, rows) -> list:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def format_report(report) -> str:
    """The report as markdown: the per-run table, then the means by structure."""
    rows = report["rows"]
    if not rows:
        return "no runs to report"
    lines = ["Scores in points (pass@1 or accuracy in %, or sentence chrF); drop = clean - faulty; "
             "recovered = (defended - faulty) / (clean - faulty).", ""]
    lines += _table(["system", "structure", "task", "fault", "defence", "clean", "faulty", "defended", "drop",
                     "recovered"],
                    [[r["system"] + ("" if r["complete"] else " *"), r["structure"], r["task"], r["fault"] or "-",
                      r["defense"] or "-", _num(r["clean"]), _num(r["faulty"]), _num(r["defended"]),
                      _num(r["drop"], True), _share(r["recovered"], r["note"])] for r in rows])
    if not all(r["complete"] for r in rows):
        lines.append("\n\\* a run of this row has not finished every problem")
    paper = ", ".join(f"{k} {v}" for k, v in PAPER_DROPS.items())
    lines += ["", f"Means by structure (paper, average drop in points: {paper}):", ""]
    lines += _table(["structure", "task", "fault", "defence", "systems", "clean", "faulty", "defended", "drop",
                     "recovered", "paper drop"],
                    [[s["structure"], s["task"], s["fault"] or "-", s["defense"] or "-", str(len(s["systems"])),
                      _num(s["clean"]), _num(s["faulty"]), _num(s["defended"]), _num(s["drop"], True),
                      _share(s["recovered"], s["note"]), _num(s["paper_drop"])] for s in report["structures"]])
    if report.get("skipped"):
        lines += ["", "Not in the table: " + "; ".join(report["skipped"])]
    return "\n".join(lines)


def print_report(runs):
    """Print the table for run directories, sweep directories or summaries."""
    print(format_report(resilience_report(runs)))


__all__ = ["PAPER_DROPS", "FAULT_KEYS", "DEFENSE_KEYS", "label", "condition", "load_summaries", "resilience_report",
           "format_report", "print_report"]
