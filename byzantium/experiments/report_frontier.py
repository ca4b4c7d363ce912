"""The accuracy / cost frontier under attack (issue 36 item 3): MAJ, RR, RRMaj, SAC and CP-WBFT at each
adversary budget (b corrupted agents of N), each cell's accuracy (95% CI over problems) beside what it
paid per problem: decode tokens, prefill tokens and wall seconds, as the engine counted them.

    points = frontier(cells)              # one dict per cell, grouped by setting and budget
    table = frontier_table(cells)         # the report's table (report.Table), or None
    plot_frontier(cells, "frontier.png")  # accuracy against each cost, one row of panels per budget

Cells come from sweeps whose analysis kind is "frontier" (frontier.toml) and from plain run
directories when at least two methods share a setting and a budget. Accuracy is the system's answer:
MAJ's and RRMaj's plurality, CP-WBFT's global decision, and for SAC the plurality of all its agents'
final answers (RA-all: adversaries counted, as MAJ counts its corrupted voters; SAC's own RA counts
honest agents only, which a user cannot pick out).
"""
from ..protocols.metrics.intervals import mean_ci
from . import figures
from .report_cells import sac_metrics, short_model, value
from .report_table import Table, num, pct

METHODS = ("maj", "rr", "rrmaj", "sac", "cpwbft")
NAMES = {"maj": "MAJ", "rr": "RR", "rrmaj": "RRMaj", "sac": "SAC", "cpwbft": "CP-WBFT"}
COSTS = (("decode_tokens", "decode tokens"), ("prefill_tokens", "prefill tokens"), ("seconds", "seconds"))


def budget(cell):
    """(corrupted agents, N): MAJ/RR/RRMaj's corrupt, SAC/CP-WBFT's byzantine; None when unknown."""
    p = cell.params
    b = p.get("byzantine") if cell.method in ("sac", "cpwbft") else p.get("corrupt")
    return None if b is None or p.get("agents") is None else (b, p["agents"])


def correct(cell, record):
    """1.0 when the system's answer is right (SAC: RA-all, see the module's note)."""
    return sac_metrics(record)["RA-all"] if cell.method == "sac" else value(cell, record)


def per_problem_cost(cell):
    """{decode_tokens, prefill_tokens, cached_tokens, seconds} per problem: costs.jsonl's totals over every
    invocation of the run (summary.json's "cost"), else its engine counters and seconds; None without them."""
    s = cell.summary or {}
    total = s.get("cost") or {**(s.get("engine") or {}), "seconds": s.get("seconds"),
                              "instances": s.get("instances")}
    n = total.get("instances")
    if not n:
        return None
    return {k: None if total.get(k) is None else total[k] / n for k in ("decode_tokens", "prefill_tokens",
                                                                        "cached_tokens", "seconds")}


def setting(cell):
    """What the methods of one comparison share: the task and the model (MAJ/RR's model(s), SAC's strong model)."""
    p = cell.params
    model = p.get("model") or p.get("strong_model") or p.get("models")
    names = model if isinstance(model, list) else str(model).split(",") if model else [None]
    return f"{p.get('task') or '–'}, {'+'.join(short_model(m) for m in names)}"


def _wanted(cell):
    kind = ((cell.sweep or {}).get("analysis") or {}).get("kind")
    return cell.method in METHODS and cell.records and (kind == "frontier" or cell.sweep is None)


def frontier(cells) -> list:
    """One dict per cell (setting, budget, method, cell, n, accuracy CI, per-problem costs), ordered by
    setting, budget and method; plain run directories only where two methods meet."""
    points = []
    for c in cells:
        if not _wanted(c) or budget(c) is None:
            continue
        points.append(dict(setting=setting(c), budget=budget(c), method=c.method, cell=c, n=len(c.records),
                           accuracy=mean_ci([correct(c, r) for r in c.records]), cost=per_problem_cost(c)))
    groups = {}
    for p in points:
        groups.setdefault((p["setting"], p["budget"]), []).append(p)
    keep = [p for p in points if p["cell"].sweep is not None
            or len({q["method"] for q in groups[(p["setting"], p["budget"])]}) > 1]
    order = {m: i for i, m in enumerate(METHODS)}
    keep.sort(key=lambda p: (p["setting"], p["budget"][0] / p["budget"][1], order[p["method"]], p["cell"].name))
    for p in keep:
        p["frontier"] = [key for key, _ in COSTS if _on_frontier(p, groups[(p["setting"], p["budget"])], key)]
    return keep


def _on_frontier(p, group, key):
    """No other cell of its setting and budget is at least as accurate for at most its cost, and better in
    one (point estimates: the intervals are in the table beside it)."""
    cost, acc = (p["cost"] or {}).get(key), p["accuracy"][0]
    if cost is None or acc is None:
        return False
    for q in group:
        c, a = (q["cost"] or {}).get(key), q["accuracy"][0]
        if q is not p and c is not None and a is not None and c <= cost and a >= acc and (c < cost or a > acc):
            return False
    return True


def frontier_table(cells):
    """The report's table (None when no cell qualifies)."""
    points = frontier(cells)
    if not points:
        return None
    rows = []
    for p in points:
        cost = p["cost"] or {}
        b, n = p["budget"]
        rows.append([p["setting"], f"{b} of {n}", NAMES[p["method"]], p["cell"].name, str(p["n"]), pct(p["accuracy"]),
                     num(cost.get("decode_tokens"), "{:,.0f}"), num(cost.get("prefill_tokens"), "{:,.0f}"),
                     num(cost.get("cached_tokens"), "{:,.0f}"), num(cost.get("seconds"), "{:,.2f}"),
                     ", ".join(name.split()[0] for key, name in COSTS if key in p["frontier"]) or "–"])
    return Table("Accuracy / cost frontier under attack",
                 ["setting", "corrupted", "method", "cell", "n", "accuracy [95% CI]", "decode tok/problem",
                  "prefill tok/problem", "cache-hit tok/problem", "seconds/problem", "on the frontier"], rows,
                 ["accuracy %, 95% CI over problems, of the system's answer: MAJ's and RRMaj's plurality, CP-WBFT's "
                  "global decision, SAC's plurality of all agents' final answers (RA-all; its paper's RA, honest agents "
                  "only, is in the SAC tables). corrupted: MAJ/RRMaj agents with the injection, SAC/CP-WBFT byzantine "
                  "agents, of N.",
                  "costs per problem from each run's costs.jsonl (every invocation of a resumed run): the engine's "
                  "counters and the run's wall seconds over its problems, which ran concurrently (seconds/problem is "
                  "throughput, not latency). Cells of one sweep share an engine, so prefix-cache hits carry over from "
                  "earlier cells and prefill depends on the order they ran in. No interval on costs: the counters are "
                  "per run, not per problem.",
                  "on the frontier: no other method at this setting and budget is at least as accurate for at most "
                  "this cost (point estimates; read them with the intervals)."])


def plot_frontier(cells, path):
    """Accuracy (95% CI error bars) against decode tokens, prefill tokens and seconds per problem (log
    axes: the methods' costs differ by orders of magnitude), one row of panels per setting and budget."""
    from matplotlib import ticker

    points = frontier(cells)
    if not points:
        return None
    rows = list(dict.fromkeys((p["setting"], p["budget"]) for p in points))
    axes, fig = figures.grid(len(rows) * len(COSTS), ncols=len(COSTS))
    colours = {m: f"C{i}" for i, m in enumerate(METHODS)}
    for r, (name, (b, n)) in enumerate(rows):
        mine = [p for p in points if (p["setting"], p["budget"]) == (name, (b, n))]
        for ax, (key, label) in zip(axes[r * len(COSTS):], COSTS):
            for p in mine:
                x = (p["cost"] or {}).get(key)
                if not x:
                    continue  # no cost recorded (or 0 on a log axis): not placed
                ys, err = figures.err([p["accuracy"]])
                ax.errorbar([x], ys, yerr=err, marker="o", capsize=4, color=colours[p["method"]],
                            label=NAMES[p["method"]], clip_on=False)
            ax.set_xscale("log")
            plain = ticker.FuncFormatter(lambda v, _: figures.count(v) if v >= 10 else f"{v:g}")  # 2k, not 2x10^3
            lo, hi = ax.get_xlim()
            ax.xaxis.set_major_formatter(plain)
            ax.xaxis.set_minor_formatter(plain if hi < 20 * lo else ticker.NullFormatter())  # wide: decades only
            ax.tick_params(axis="x", which="both", labelsize=7)
            ax.set_xlabel(f"{label} per problem")
            ax.set_title(f"{name}: {b} of {n} corrupted", fontsize=10)
            figures.percent_axis(ax)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))  # beside the row: never on a point
    fig.suptitle("Accuracy vs measured cost under attack (95% CI)")
    return figures.save(fig, path)


__all__ = ["METHODS", "budget", "correct", "per_problem_cost", "frontier", "frontier_table", "plot_frontier"]
