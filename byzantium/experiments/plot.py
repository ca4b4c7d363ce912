"""`byzantium plot DIR... [--out PLOTDIR]`: the papers' figures as PNGs, from the numbers of the report.

Only the plots the cells support are drawn (no K plot without two chunk sizes of one setting, ...):

    sweep.png       MAJ vs RRMaj across the corruption sweep, 95 % CIs as error bars; a pattern that was
                    not run is a gap in the line, not an interpolation
    scaling.png     test-time scaling: accuracy vs M, mean ± std over bootstrap trials as bands
    rounds.png      weak/strong accuracy per round, SAC vs CP-WBFT, one panel per topology
    resilience.png  drop (clean - faulty) by structure, with the paper's average drops
    k.png           accuracy vs chunk size K (MAJ of the same setting as a line with its 95 % CI as a band)
    cost.png        prefill, decode and cached tokens and wall seconds, MAJ vs RRMaj
    frontier.png    accuracy vs decode / prefill tokens and seconds per problem, per budget (report_frontier)
    sac_scale.png   SAC / CP-WBFT FAA, BFTI, tokens and seconds vs the number of agents (report_scale)
    adversaries.png SAC / CP-WBFT BFTI and H-Majority under each adversary mode, one panel per setting

Accuracy axes are 0-100 % and every band and error bar is clipped to it (a mean ± std can pass 100);
bars carry their values.
"""
from pathlib import Path

from ..commands import Command
from . import report_data as data
from .figures import clip as _clip, count as _count, err as _err, grid as _grid, percent_axis as _percent_axis
from .figures import plt as _plt, save as _save, values as _values
from .report_cells import load_cells
from .report_frontier import plot_frontier
from .report_scale import plot_scale



def plot_sweep(cells, path):
    groups = data.corruption_sweep(cells)
    if not groups:
        return None
    axes, fig = _grid(len(groups))
    for ax, g in zip(axes, groups):
        # Every c from the first run to the last, so that a pattern not run is a NaN: a gap, where a
        # line between its neighbours would show a value nobody measured.
        run = {c["c"]: c for c in g["columns"]}
        xs = list(range(min(run), max(run) + 1))
        for method, name, dx in (("maj", "MAJ", -0.05), ("rrmaj", "RRMaj", 0.05)):
            ys, err = _err([run[x][method + "_ci"] if x in run else None for x in xs])
            if any(y == y for y in ys):
                ax.errorbar([x + dx for x in xs], ys, yerr=err, marker="o", capsize=4, label=name, clip_on=False)
        ax.set_xticks(sorted(run), [run[x]["label"] for x in sorted(run)])
        ax.set_xlabel("corrupted / clean agents")
        ax.set_title(g["label"], fontsize=10)
        _percent_axis(ax)
        ax.legend()
    fig.suptitle("MAJ vs RRMaj across the corruption sweep (95% CI)")
    return _save(fig, path)


def plot_scaling(cells, path, m_max=40, trials=50):
    curves = data.scaling(cells, m_max, trials)
    if not curves:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for c in curves:
        ms = [p["m"] for p in c["points"]]
        mean = [100 * p["mean"] for p in c["points"]]
        std = [100 * p["std"] for p in c["points"]]
        name = ("MAJ" if c["method"] == "maj" else "RRMaj") + f" ({c['cell'].name})"
        line, = ax.plot(ms, mean, marker="o", label=name, linestyle="--" if c["method"] == "maj" else "-",
                        clip_on=False)
        ax.fill_between(ms, [_clip(m - s) for m, s in zip(mean, std)], [_clip(m + s) for m, s in zip(mean, std)],
                        color=line.get_color(), alpha=0.2)
    ax.set_xlabel("M (answers voted)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    _percent_axis(ax)
    ax.set_title(f"Test-time scaling (mean ± std over {trials} bootstrap trials)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_rounds(cells, path):
    runs = data.byzantine(cells)
    if not runs:
        return None
    topologies = list(dict.fromkeys(str(r["cell"].params.get("topology")) for r in runs))
    axes, fig = _grid(len(topologies))
    styles = {"weak": "--", "strong": "-"}
    for ax, topo in zip(axes, topologies):
        mine = [r for r in runs if str(r["cell"].params.get("topology")) == topo]
        for i, r in enumerate(mine):  # a colour per run, a line style per group
            for g, values in r["rounds"].items():
                ys, err = _err(values)
                ax.errorbar(range(len(ys)), ys, yerr=err, marker="o" if g == "strong" else "s", capsize=3,
                            linestyle=styles[g], color=f"C{i}", clip_on=False,
                            label=f"{r['cell'].method.upper()} {g} ({r['cell'].name})")
        ax.set_xlabel("round")
        ax.set_title(f"topology: {topo}")
        ax.xaxis.get_major_locator().set_params(integer=True)
        _percent_axis(ax)
        ax.legend(fontsize=8)
    fig.suptitle("Weak / strong accuracy per round, SAC vs CP-WBFT (95% CI)")
    return _save(fig, path)


def plot_resilience(cells, path):
    report = data.resilience(cells)
    structures = [s for s in (report or {}).get("structures", []) if s.get("drop_ci")]
    if not structures:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(structures) + 2), 4.2))
    names = [f"{s['structure']}\n{s['task']}, {s['fault']}" + (f"\n+{s['defense']}" if s["defense"] else "")
             for s in structures]
    drops = [s["drop_ci"] for s in structures]
    ys = [d[0] for d in drops]
    drops = [d if d[1] is not None else (d[0], d[0], d[0]) for d in drops]  # "n too small": no error bar
    err = [[d[0] - d[1] for d in drops], [d[2] - d[0] for d in drops]]
    bars = ax.bar(range(len(ys)), ys, yerr=err, capsize=5, color="tab:red", alpha=0.7, label="ours (95% CI)")
    _values(ax, bars, lambda v: f"{v:+.1f}")
    paper = [(i, s["paper_drop"]) for i, s in enumerate(structures) if s.get("paper_drop") is not None]
    if paper:
        ax.scatter([i for i, _ in paper], [v for _, v in paper], marker="D", color="black", zorder=3,
                   label="paper (average drop)")
    ax.axhline(0, color="gray", linewidth=1)
    ax.set_xticks(range(len(ys)), names, fontsize=8)
    ax.set_xlabel("structure, task, fault (+ defence)")
    ax.set_ylabel("drop, clean - faulty (points)")
    top = max([30, max(d[2] for d in drops) + 5] + [v for _, v in paper])
    ax.set_ylim(min(-10, min(d[1] for d in drops) - 5), 1.35 * top)  # headroom: the legend sits above the data
    ax.set_title("Resilience: drop by structure")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper right")
    return _save(fig, path)


def plot_k(cells, path):
    groups = data.k_ablation(cells)
    if not groups:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for g in groups:
        ks = [p["k"] for p in g["points"]]
        ys, err = _err([p["ci"] for p in g["points"]])
        name = ("RRMaj" if g["method"] == "rrmaj" else "RR") + f" ({g['label']})"
        bars = ax.errorbar(ks, ys, yerr=err, marker="o", capsize=4, label=name, clip_on=False)
        if g["maj"] is not None:  # the reference with its interval: is RRMaj's K within MAJ's noise?
            point, lo, hi = (100 * v for v in g["maj"])
            color = bars[0].get_color()
            ax.axhline(point, linestyle=":", color=color, label=f"MAJ ({g['label']})")
            ax.axhspan(_clip(lo), _clip(hi), color=color, alpha=0.12, label=f"MAJ 95% CI ({g['label']})")
    ax.set_xscale("log")
    ax.set_xticks(sorted({p["k"] for g in groups for p in g["points"]}))
    from matplotlib.ticker import NullFormatter, ScalarFormatter
    ax.get_xaxis().set_major_formatter(ScalarFormatter())  # plain K values on the log axis
    ax.get_xaxis().set_minor_formatter(NullFormatter())
    ax.set_xlabel("chunk size K (tokens per turn)")
    _percent_axis(ax)
    ax.set_title("Accuracy vs chunk size K (95% CI)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_cost(cells, path):
    pairs = data.cost_pairs(cells)
    if not pairs:
        return None
    plt = _plt()
    fig, (tok, sec) = plt.subplots(1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    keys = [("prefill_tokens", "prefill"), ("decode_tokens", "decode"), ("cached_tokens", "cache hits")]
    runs = []  # (name, numbers), each run once (one MAJ run may pair with several RRMaj runs)
    for p in pairs:
        for method in ("maj", "rrmaj"):
            name = ("MAJ " if method == "maj" else "RRMaj ") + p[method].name
            if name not in [n for n, _ in runs]:
                runs.append((name, p["sides"][method]))
    width = 0.8 / len(runs)
    for i, (name, side) in enumerate(runs):
        off = i * width - 0.4 + width / 2
        _values(tok, tok.bar([x + off for x in range(len(keys))], [side[k] or 0 for k, _ in keys], width,
                             label=name), _count)
        _values(sec, sec.bar([off], [side["seconds"] or 0], width, label=name), lambda v: f"{v:.1f}")
    tok.set_xticks(range(len(keys)), [name for _, name in keys])
    tok.set_xlabel("engine counter")
    tok.set_ylabel("tokens")
    tok.set_title("Tokens per run")
    tok.legend(fontsize=8)
    sec.set_xticks([])
    sec.set_xlabel("wall time of each run")
    sec.set_ylabel("seconds")
    sec.set_title("Seconds per run")
    for ax in (tok, sec):
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("Cost: MAJ vs RRMaj on the same settings (measured)")
    return _save(fig, path)


def plot_adversaries(cells, path):
    groups = data.by_adversary(cells)
    if not groups:
        return None
    axes, fig = _grid(len(groups), ncols=2)
    for ax, g in zip(axes, groups):
        metrics = data.ADVERSARY_METRICS
        width = 0.8 / len(g["modes"])
        for i, (mode, values) in enumerate(g["modes"].items()):
            # BFTI is a signed difference in points, H-Majority a share: both drawn in points, bars on 0
            nan = float("nan")
            ys = [100 * values[m][0] if values[m] and values[m][0] is not None else nan for m in metrics]
            err = [[100 * (values[m][0] - values[m][1]) if values[m] and values[m][0] is not None else nan
                    for m in metrics],
                   [100 * (values[m][2] - values[m][0]) if values[m] and values[m][0] is not None else nan
                    for m in metrics]]
            off = i * width - 0.4 + width / 2
            bars = ax.bar([x + off for x in range(len(metrics))], ys, width, yerr=err, capsize=3, label=mode)
            _values(ax, bars, lambda v: f"{v:+.0f}" if v < 0 else f"{v:.0f}")
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(metrics)), ["BFTI (points)", "H-Majority (%)"])
        ax.set_ylim(-100, 100)
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_title(f"{'SAC' if g['method'] == 'sac' else 'CP-WBFT'}, {g['topology']}, {g['label']}", fontsize=10)
        ax.legend(fontsize=8, title="adversary", title_fontsize=8)
    fig.suptitle("SAC / CP-WBFT under each adversary (95% CI)")
    return _save(fig, path)


PLOTS = {"adversaries.png": plot_adversaries, "sweep.png": plot_sweep, "scaling.png": plot_scaling,
         "rounds.png": plot_rounds, "resilience.png": plot_resilience, "k.png": plot_k, "cost.png": plot_cost, "frontier.png": plot_frontier,
         "sac_scale.png": plot_scale}


def make_plots(dirs, out=None) -> list:
    """Write every plot the cells of DIRs support into OUT (default: DIR/plots of the first DIR);
    returns the paths written."""
    cells, sweeps = load_cells(dirs)
    analysis = next((s.get("analysis") for s in sweeps if s.get("analysis")), {}) or {}
    out = Path(out) if out else Path(dirs[0]) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fn in PLOTS.items():
        extra = dict(m_max=analysis.get("m_max", 40), trials=analysis.get("trials", 50)) if fn is plot_scaling else {}
        path = fn(cells, out / name, **extra)
        if path is not None:
            written.append(path)
    return written


def add_plot_args(ap):
    ap.add_argument("dirs", nargs="+", metavar="DIR", help="sweep directories (sweep.json) or run directories")
    ap.add_argument("--out", default=None, metavar="PLOTDIR", help="where the PNGs go (default: the first DIR/plots)")


def cmd_plot(args):
    written = make_plots(args.dirs, args.out)
    if not written:
        print("no plot: the directories hold nothing that can be plotted")
    for path in written:
        print(f"wrote {path}")


COMMAND = Command("plot", "the papers' figures (PNG) from sweep or run directories", add_plot_args, cmd_plot)


__all__ = ["PLOTS", "make_plots", "cmd_plot"]
