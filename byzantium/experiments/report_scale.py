"""SAC at scale (issue 36 item 2): SAC's and CP-WBFT's accuracy, BFTI and H-Majority as the number of agents
n grows, per topology, beside what each run paid: decode and prefill tokens and seconds per problem, and the
share of the judges' prompts that shared a forward pass with another (summary.json's scoring_batches).

    rows = scale_rows(cells)            # one dict per cell, by method, setting, topology and n
    table = scale_table(cells)          # the report's table (report.Table), or None
    plot_scale(cells, "sac_scale.png")  # accuracy, BFTI and cost vs n

A cell counts when its summary.json says how its graph was certified ("graph": runs since --f auto) and
another cell of its method, setting and topology has another n (a sweep over n, or run directories side
by side). F and the line-up are the run's own (with --f auto, the graph's certified robustness - 1).
"""
from ..protocols.metrics.intervals import mean_ci
from . import figures
from .report_cells import sac_metrics, short_model
from .report_table import Table, num, pct

METHODS = ("sac", "cpwbft")
NAMES = {"sac": "SAC", "cpwbft": "CP-WBFT"}
METRICS = ("FAA", "BFTI", "H-Majority")


def setting(cell):
    """What the cells of one curve share besides the topology: the task, the strong model, the scoring."""
    p, c = cell.params, (cell.summary or {}).get("config") or {}
    model = p.get("strong_model") or p.get("model") or (c.get("models") or {}).get("strong")
    mode = c.get("score_mode")
    return f"{p.get('task') or c.get('task') or '–'}, {short_model(model)}" + (f", {mode} scoring" if mode else "")


def per_problem(summary, key):
    """A cost per problem: costs.jsonl's totals over every invocation (summary's "cost"), else this run's
    engine counters and seconds; None without them."""
    total = summary.get("cost") or {**(summary.get("engine") or {}), "seconds": summary.get("seconds"),
                                    "instances": summary.get("instances")}
    n = total.get("instances")
    return None if not n or total.get(key) is None else total[key] / n


def _row(cell):
    s = cell.summary
    c, g, b = s.get("config") or {}, s["graph"], s.get("scoring_batches") or {}
    metrics = [sac_metrics(r) for r in cell.records]
    return dict(cell=cell, method=cell.method, setting=setting(cell), topology=c.get("topology"),
                n=c.get("agents"), F=g["F"], r=g["r"], check=g["check"], exact=g["exact"], edges=g["edges"],
                weak=c.get("weak"), byzantine=c.get("byzantine"), problems=len(cell.records),
                **{m: mean_ci([x[m] for x in metrics]) for m in METRICS},
                decode=per_problem(s, "decode_tokens"), prefill=per_problem(s, "prefill_tokens"),
                seconds=per_problem(s, "seconds"), batched=b.get("share_prompts_batched"),
                rows_batched=b.get("share_batched"), rows_per_pass=b.get("mean_rows_per_pass"))


def scale_rows(cells) -> list:
    """One dict per qualifying cell, ordered by method, setting, topology and n."""
    rows = [_row(c) for c in cells if c.method in METHODS and c.records and (c.summary or {}).get("graph")]
    ns = {}
    for r in rows:
        ns.setdefault((r["method"], r["setting"], r["topology"]), set()).add(r["n"])
    rows = [r for r in rows if len(ns[(r["method"], r["setting"], r["topology"])]) > 1]
    rows.sort(key=lambda r: (METHODS.index(r["method"]), r["setting"], str(r["topology"]), r["n"]))
    return rows


def scale_table(cells):
    """The report's "SAC at scale" table (None when no cell qualifies)."""
    rows = scale_rows(cells)
    if not rows:
        return None
    out = [[NAMES[r["method"]], r["setting"], str(r["topology"]), str(r["n"]), str(r["F"]),
            f"{r['r']}-robust: {r['check']}" + ("" if r["exact"] else " (lower bound)"),
            f"{r['weak']} + {r['byzantine']}", str(r["problems"]),
            pct(r["FAA"]), pct(r["BFTI"], True), pct(r["H-Majority"]),
            num(r["decode"], "{:,.0f}"), num(r["prefill"], "{:,.0f}"), num(r["seconds"], "{:,.1f}"),
            "–" if r["batched"] is None else
            f"{100 * r['batched']:.0f}% (rows {100 * r['rows_batched']:.0f}%, {r['rows_per_pass']:.1f}/pass)"]
           for r in rows]
    return Table("SAC at scale", ["protocol", "setting", "topology", "n", "F", "robustness (check)",
                                  "weak + byzantine", "problems", "FAA", "BFTI", "H-Majority", "decode tok/problem",
                                  "prefill tok/problem", "seconds/problem", "scoring batched"], out,
                 ["FAA, H-Majority %, BFTI = FAA - IAA in points, 95% CI over problems. F: the F the run used (with "
                  "--f auto the certified robustness - 1, below every degree); robustness: how it was certified "
                  "(a proof for the construction, exact search, the MILP, or a proven lower bound, with which F is "
                  "conservative).",
                  "costs per problem over the run's invocations (costs.jsonl): the engine's counters and wall seconds "
                  "over the problems, which ran concurrently (seconds/problem is throughput, not latency); cells of one "
                  "sweep share an engine, so prefix-cache hits carry over between them.",
                  "scoring batched: the share of the judge prompts that shared a forward pass with another one: "
                  "those that rode on an identical prompt's row (the same answer judged by the same model is computed "
                  "once) and those whose prefill row (a prompt, or a chunk of a long one) ran in a pass with another "
                  "scoring row; in brackets the share of scoring rows in such passes and their mean number a pass. "
                  "From the engine's step records (native backend only)."])


def plot_scale(cells, path):
    """FAA, BFTI, tokens and seconds per problem against n: a line per protocol and topology, 95% CIs as
    error bars, costs on log axes (they grow with the edges, ~n^2 on MERG)."""
    from matplotlib import ticker

    rows = scale_rows(cells)
    if not rows:
        return None
    axes, fig = figures.grid(4, ncols=2)
    curves = list(dict.fromkeys((r["method"], r["setting"], r["topology"]) for r in rows))
    for i, key in enumerate(curves):
        mine = [r for r in rows if (r["method"], r["setting"], r["topology"]) == key]
        ns = [r["n"] for r in mine]
        style = dict(color=f"C{i % 10}", marker="o", capsize=3, linestyle="-" if key[0] == "sac" else "--",
                     label=f"{NAMES[key[0]]} {key[2]}" + (f" ({key[1]})" if len({c[1] for c in curves}) > 1 else ""))
        ys, err = figures.err([r["FAA"] for r in mine])
        axes[0].errorbar(ns, ys, yerr=err, clip_on=False, **style)
        bfti = [r["BFTI"] for r in mine]
        axes[1].errorbar(ns, [100 * t[0] for t in bfti], yerr=[[100 * (t[0] - t[1]) for t in bfti],
                                                               [100 * (t[2] - t[0]) for t in bfti]], **style)
        style.pop("capsize")
        axes[2].plot(ns, [r["decode"] + r["prefill"] if None not in (r["decode"], r["prefill"]) else float("nan")
                          for r in mine], **style)
        axes[3].plot(ns, [float("nan") if r["seconds"] is None else r["seconds"] for r in mine], **style)
    figures.percent_axis(axes[0], "FAA (%)")
    axes[1].axhline(0, color="grey", linewidth=0.8)
    axes[1].set_ylabel("BFTI (points)")
    axes[1].grid(True, alpha=0.3)
    axes[2].set_ylabel("prefill + decode tokens per problem")
    axes[3].set_ylabel("seconds per problem")
    for ax in axes[2:]:
        if any(y > 0 for line in ax.get_lines() for y in line.get_ydata()):
            ax.set_yscale("log")  # nothing positive (no costs recorded): a log axis has nothing to show
            for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
                axis(ticker.FuncFormatter(lambda v, _: figures.count(v) if v >= 10 else f"{v:g}"))  # 2k, not 2x10^3
        ax.grid(True, which="both", alpha=0.3)
    for ax, title in zip(axes, ("final agent accuracy", "BFTI = FAA - IAA", "tokens", "wall time")):
        ax.set_xticks(sorted({r["n"] for r in rows}))
        ax.set_xlabel("agents n")
        ax.set_title(title, fontsize=10)
    axes[-1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle("SAC at scale: accuracy and measured cost vs n (95% CI)")
    return figures.save(fig, path)


__all__ = ["METHODS", "setting", "per_problem", "scale_rows", "scale_table", "plot_scale"]
