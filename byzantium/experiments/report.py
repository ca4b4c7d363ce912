"""`byzantium report DIR... [--format md|csv|tex] [--out FILE]`: the papers' tables from sweep or run
directories.

    tables = build_report(["runs/table3"])          # list of Table
    print(render(tables, "md"))

Every accuracy is printed as `61.0 [52.3, 69.7] W`: percent, with a 95 % interval over problems whose
method the tag names (protocols/metrics/intervals.py decides it; each table's legend lists the tags it
uses; "n too small" where none can be given honestly; fixed seeds: the same report every time). Δ, BFTI
and drops are in points, their intervals paired over the problems both sides have. The test-time
scaling table is the paper's mean ± std over bootstrap trials. A sweep's published numbers appear
beside the cells whose params match their `where`.
"""
import csv
import io
from pathlib import Path

from ..commands import Command
from . import report_data as data
from . import report_diagnostics as diag
from .report_frontier import frontier_table
from .report_sample_size import sample_size_table
from .report_scale import scale_table
from .report_cells import format_published, load_cells, matches, metric_name, short_model
from .report_table import Table, num as _num, pct, pts, with_legend

FORMATS = ("md", "csv", "tex")


# ---------------------------------------------------------------------------- tables

def cells_table(cells) -> Table:
    rows = []
    for r in data.cell_rows(cells):
        c = r["cell"]
        total = f"{r['n']}/{r['total']}" if r["total"] is not None else str(r["n"])
        status = c.status + (f": {c.error}" if c.error else "")
        cut = r["truncated"]
        rows.append([c.name, c.method, data.label(cells, c, ("method",)), total, str(r["errors"]),
                     f"{r['parse_final']} / {r['parse_voters']}", diag.answers(c), diag.other_replies(c),
                     "–" if not cut or not cut[1] else f"{100 * cut[0] / cut[1]:.0f}% ({cut[0]}/{cut[1]})",
                     metric_name(c), diag.mark(pct(r["value"]), c), format_published(r["published"]), status])
    notes = ["n: problems with a result (of the run's total); errors: error rows (an instance that raised); "
             "parse failures: unreadable final answers / unreadable answers of voters or agents; truncated: "
             "RR/RRMaj trajectories that reached the length limit L before an agent ended them."]
    notes += [diag.NOTE]
    notes += [f"{r['cell'].name}: {r['idle']}." for r in data.cell_rows(cells) if r["idle"]]
    notes += [n for n in [diag.footnote(cells)] if n]
    return Table("Cells", ["cell", "method", "settings", "n", "errors", "parse failures (final / voters)", "answers",
                           "other replies unparsed", "truncated", "metric", "ours [95% CI]", "paper", "status"], rows,
                 notes)


def published_table(cells, sweeps):
    """Every published number of the sweeps, with the cells it was matched to."""
    rows = []
    for sweep in sweeps:
        mine = [c for c in cells if c.sweep is sweep]
        for p in sweep.get("published") or []:
            matched = [c.name for c in mine if matches(p, c)]
            where = ", ".join(f"{k}={v}" for k, v in (p.get("where") or {}).items()) or "(the whole sweep)"
            if p.get("average"):
                continue  # in "Published averages"
            rows.append([sweep.get("name", ""), p.get("table", ""), p.get("method") or "–", p.get("metric", ""),
                         format_published([p], False), where, ", ".join(matched) or "–"])
    if not rows:
        return None
    return Table("Published numbers", ["sweep", "table", "method", "metric", "paper", "where", "matched cells"], rows,
                 ["an entry is shown beside the cells whose params equal every key of its `where`; one without "
                  "`where` is a headline of the whole sweep."] +
                 (["The Consensus Trap's Tables 1, 2 and 6-9 cannot all come from its stated 128 questions per data "
                   "set: see \"Sample sizes the paper's numbers imply\" for the sizes each table's numbers fit."]
                  if any(s.get("paper") == "consensus-trap" for s in sweeps) else []))


def averages_table(cells, sweeps, m_max=40, trials=50):
    """The paper's averages beside ours over the same cells (never beside a single cell)."""
    rows = []
    for a in data.published_averages(cells, sweeps, m_max, trials):
        p = a["entry"]
        where = ", ".join(f"{k}={v}" for k, v in p["where"].items())
        ours = a["ours"]
        text = "–" if ours is None or ours[0] is None else pct(ours) if ours[1] is not None else f"{100 * ours[0]:.1f}"
        rows.append([p.get("table", ""), p["method"], p.get("metric", ""), where, f"{len(a['done'])}/{len(a['cells'])}",
                     text, format_published([p], False)])
    if not rows:
        return None
    return Table("Published averages", ["table", "method", "metric", "over the cells with", "cells run", "ours",
                                         "paper"], rows,
                 ["an average of the paper (over data sets, models or both) beside ours over the same cells: "
                  "accuracies averaged with each cell's problems resampled on their own (95% CI); M=k: the mean "
                  "of the cells' scaling curves at M=k. With fewer cells run than the average covers, ours is "
                  "over those run only."])


def sweep_tables(cells) -> list:
    """One table per set of columns (agents N and patterns run): a block of rows per setting, as the paper."""
    tables, members = {}, {}  # members: the cells each table's numbers come from (for its footnote)
    for g in data.corruption_sweep(cells):
        cols = g["columns"]
        labels = [c["label"] + (" (no adversary)" if c["c"] == 0 else " (all corrupted)" if c["c"] == g["n"] else "")
                  for c in cols]
        t = tables.setdefault(tuple(labels), Table(
            f"Corruption sweep: MAJ vs RRMaj (N={g['n']}; {', '.join(c['label'] for c in cols)})",
            ["setting", "method"] + labels, [],
            ["accuracy %, 95% CI over problems; Δ = RRMaj - MAJ in points, paired over problems; 0c (no "
             "corrupted agent) is the reference without an adversary, not a bound: a method may score higher "
             "under some corruption; an average resamples each setting's problems on their own."]))
        t.rows += [[g["label"], "MAJ"] + [diag.mark(pct(c["maj_ci"]), c["maj"]) for c in cols],
                   [g["label"], "RRMaj"] + [diag.mark(pct(c["rrmaj_ci"]), c["rrmaj"]) for c in cols],
                   [g["label"], "Δ (points)"] + [diag.mark(pct(c["delta"], True), c["maj"], c["rrmaj"]) for c in cols]]
        members.setdefault(tuple(labels), []).extend(c[m] for c in cols for m in ("maj", "rrmaj"))
        for method in ("maj", "rrmaj"):
            paper = [format_published(data.published_for(c[method]), False) if c[method] else "" for c in cols]
            if any(paper):
                t.rows.append([g["label"], ("MAJ" if method == "maj" else "RRMaj") + " (paper)"] + paper)
    for key, t in tables.items():
        t.notes += [n for n in [diag.footnote(members[key])] if n]
    return list(tables.values())


def scaling_table(cells, m_max=40, trials=50):
    curves = data.scaling(cells, m_max, trials)
    if not curves:
        return None
    ms = sorted({p["m"] for c in curves for p in c["points"]})
    rows = []
    for c in curves:
        by_m = {p["m"]: p for p in c["points"]}
        rows.append([c["cell"].name, c["method"].upper() if c["method"] == "maj" else "RRMaj", str(c["pool"])] +
                    [f"{100 * by_m[m]['mean']:.1f} ± {100 * by_m[m]['std']:.1f}" if m in by_m else "–" for m in ms])
    return Table("Test-time scaling", ["cell", "method", "pool"] + [f"M={m}" for m in ms], rows,
                 [f"accuracy % of a plurality of M answers drawn from each question's pool, mean ± std over "
                  f"{trials} bootstrap trials (as the paper); MAJ at M=1 is the expected accuracy of one random "
                  "agent, corrupted and clean weighted by their share."])


def final_speaker_table(cells):
    stats = data.final_speaker(cells)
    if not stats:
        return None
    rows = [[s["cell"].name, f"{pct(s['clean'])} ({s['clean_right']}/{s['clean_n']} right)",
             f"{pct(s['corrupt'])} ({s['corrupt_right']}/{s['corrupt_n']} right)",
             f"{s['odds']:.3g}", f"{s['p']:.3g}"] for s in stats]
    return Table("Final speaker", ["cell", "clean agent last", "corrupted agent last", "odds ratio", "Fisher p"],
                 rows, ["trajectory accuracy % by who wrote the final words; two-sided Fisher exact test on "
                        "[[clean right, clean wrong], [corrupt right, corrupt wrong]]."])


def k_table(cells):
    groups = data.k_ablation(cells)
    if not groups:
        return None
    ks = sorted({p["k"] for g in groups for p in g["points"]})
    rows = []
    for g in groups:
        by_k = {p["k"]: p for p in g["points"]}
        rows.append([g["label"], "RRMaj" if g["method"] == "rrmaj" else "RR"] +
                    [diag.mark(pct(by_k[k]["ci"]), by_k[k]["cell"]) if k in by_k else "–" for k in ks] + [pct(g["maj"])])
    flagged = diag.footnote([p["cell"] for g in groups for p in g["points"]])
    return Table("Chunk size K", ["setting", "method"] + [f"K={k}" for k in ks] + ["MAJ"], rows,
                 ["accuracy %, 95% CI over problems."] + ([flagged] if flagged else []))


def cost_table(cells):
    pairs = data.cost_pairs(cells)
    if not pairs:
        return None
    names = {"decode_tokens": "decode tokens", "prefill_tokens": "prefill tokens",
             "cached_tokens": "prefix-cache hit tokens", "seconds": "wall seconds"}
    rows = []
    for p in pairs:
        for key, name in names.items():
            spec = "{:,.1f}" if key == "seconds" else "{:,.0f}"
            rows.append([p["label"], name, _num(p["sides"]["maj"][key], spec), _num(p["sides"]["rrmaj"][key], spec),
                         _num(p["ratio"][key], "{:.2f}")])
    notes = ["from each run's costs.jsonl: the engine's counters and wall seconds summed over every invocation of "
             "the run (a resumed run counts each instance once, in the invocation that ran it). Cells of one sweep share an engine: its prefix "
             "cache carries over from earlier cells, so prefill and cache hits depend on the order they ran in."]
    last = sorted({name for p in pairs for name in p["last_only"]})
    if last:
        notes.append(f"{', '.join(last)}: written before costs.jsonl: the last invocation's counters only.")
    old = sorted({name for p in pairs for name in p["cumulative"]})
    if old:
        notes.append(f"{', '.join(old)}: written before counters were kept per run; an engine shared with earlier "
                     "runs counts theirs too.")
    return Table("Cost parity (measured)", ["setting", "quantity", "MAJ", "RRMaj", "RRMaj/MAJ"], rows, notes)


def byzantine_tables(cells) -> list:
    runs = data.byzantine(cells)
    if not runs:
        return []
    rows, rounds = [], []
    for r in runs:
        c = r["cell"]
        topo = str(c.params.get("topology", "–"))
        paper = "; ".join(format_published(v) for v in r["published"].values() if v)
        rows.append([c.name, c.method.upper(), topo] +
                    [diag.mark(pct(r["metrics"][k], k == "BFTI"), c) for k in data.HEADLINE] +
                    [diag.answers(c), diag.other_replies(c), diag.filter_drops(c), diag.on_adversary(c), paper])
        for g, values in r["rounds"].items():
            rounds.append([c.name, c.method.upper(), topo, g] + [pct(v) for v in values])
    width = max(len(r) for r in rounds) if rounds else 4
    rounds = [r + ["–"] * (width - len(r)) for r in rounds]
    headline = Table("SAC / CP-WBFT", ["cell", "protocol", "topology", "IAA", "FAA", "BFTI", "RA", "H-Majority",
                                       "answers", "other replies unparsed", "filter dropped (dropped/judged)",
                                       "honest on adversary's answer", "paper"], rows,
                     ["%, 95% CI over problems; BFTI = FAA - IAA in points, paired over problems; RA is the paper's "
                      "(SAC: honest agents' plurality; CP-WBFT: the global decision).", diag.NOTE,
                      "filter dropped: SAC's filter, per role of the judged neighbour, times it dropped that neighbour "
                      "of the times it judged one; honest on adversary's answer: honest agents' final (read) answers "
                      "that are an adversary's wrong answer."] + [n for n in [diag.footnote([r["cell"] for r in runs])]
                                                                   if n])
    out = [headline]
    if rounds:
        out.append(Table("Weak / strong accuracy per round", ["cell", "protocol", "topology", "group"] +
                         [f"Rnd {t}" for t in range(width - 4)], rounds,
                         ["%, 95% CI over problems; a run that stopped early repeats its last round."]))
    return out


def adversary_table(cells):
    """SAC's and CP-WBFT's BFTI and H-Majority under each adversary mode run, per setting and topology."""
    groups = data.by_adversary(cells)
    if not groups:
        return None
    modes = [m for m in data.ADVERSARY_MODES if any(m in g["modes"] for g in groups)]
    rows = [[g["label"], g["method"].upper(), str(g["topology"] or "–"), metric] +
            [diag.mark(pct(g["modes"][m][metric], metric == "BFTI"), g["cells"][m]) if m in g["modes"] else "–"
             for m in modes]
            for g in groups for metric in data.ADVERSARY_METRICS]
    flagged = diag.footnote([c for g in groups for c in g["cells"].values()])
    return Table("SAC / CP-WBFT by adversary", ["setting", "protocol", "topology", "metric"] + modes, rows,
                 ["%, 95% CI over problems; BFTI = FAA - IAA in points, paired over problems; a setting's cells differ "
                  "only in the adversary (fixed: the paper's replayed wrong answer; judge-targeted: the same answer "
                  "with text aimed at the judges; adaptive: the wrong answer its own judge scores highest each "
                  "round)."] + ([flagged] if flagged else []))


def resilience_tables(cells) -> list:
    report = data.resilience(cells)
    if report is None:
        return []

    def share(x, note):
        return "n/a (no drop)" if note else "–" if x is None else f"{100 * x:.0f}%"

    several = len({r.get("model") for r in report["rows"]}) > 1  # two backbones: say which row is which

    def system(r):
        fault = (r.get("fault_settings") or {}).get("error_type") if r["fault"] == "autoinject" else None
        return r["system"] + "".join(f" ({x})" for x in (short_model(r.get("model")) if several else None, fault) if x)

    rows = [[system(r), r["structure"], r["task"], r["fault"] or "–", r["defense"] or "–",
             diag.mark(pts(r["clean_ci"]), r["clean_cell"]), diag.mark(pts(r["faulty_ci"]), r["faulty_cell"]),
             diag.mark(pts(r["defended_ci"]), r["defended_cell"]),
             diag.mark(pts(r["drop_ci"], True), r["clean_cell"], r["faulty_cell"]), share(r["recovered"], r["note"]),
             " / ".join(diag.answers(r[k + "_cell"]) if r[k + "_cell"] else "–" for k in ("clean", "faulty", "defended")),
             diag.other_replies(r["defended_cell"]) if r["defended_cell"] else "–",
             format_published(r["published"])] for r in report["rows"]]
    structures = [[s["structure"], s["task"], s["fault"] or "–", s["defense"] or "–", str(len(s["systems"])),
                   pts(s["clean_ci"]), pts(s["faulty_ci"]), pts(s["defended_ci"]), pts(s["drop_ci"], True),
                   share(s["recovered"], s["note"]), _num(s["paper_drop"], "{:.1f}")] for s in report["structures"]]
    inert = sorted({f"{r['system']} ({r['task']}: {r['inert']})" for r in report["rows"] if r.get("inert")})
    notes = ["points (HumanEval: pass@1 %; CIAR, FairEval: accuracy %; CommonMT: sentence chrF, not BLEURT-20 as "
             "in the paper, so CommonMT scores are not comparable with the paper's), 95% CI over problems; drop = "
             "clean - faulty (paired over problems); recovered = (defended - faulty) / (clean - faulty)."]
    notes.append("answers (clean / faulty / defended): the final outputs read again with the answer reader, "
                 "unread or ambiguous (code and translations are scored whole: 0 replies); Inspector: its decisions "
                 "that were not valid JSON, in the defended run.")
    flagged = diag.footnote([r[k + "_cell"] for r in report["rows"] for k in ("clean", "faulty", "defended")])
    notes += [flagged] if flagged else []
    if inert:
        notes.append(f"AutoInject rewrote no piece of any message in {', '.join(inert)}: the faulty run is the clean "
                     "one, so its drop is 0 by construction and says nothing about resilience.")
    return [Table("Resilience by system", ["system", "structure", "task", "fault", "defence", "clean", "faulty",
                                           "defended", "drop", "recovered", "answers", "other replies unparsed",
                                           "paper"], rows, notes),
            Table("Resilience by structure", ["structure", "task", "fault", "defence", "systems", "clean", "faulty",
                                              "defended", "drop", "recovered", "paper drop"], structures,
                  ["means over the structure's systems, CI over problems (systems' scores averaged per problem).",
                   "paper drop: the paper's headline, an average over both backbones, both fault methods and all "
                   "four tasks, not this row's task and fault; CommonMT: chrF here, BLEURT-20 in the paper."])]


def build_report(dirs) -> list:
    """Every table the cells of DIRs support, in the papers' shapes."""
    cells, sweeps = load_cells(dirs)
    analysis = next((s.get("analysis") for s in sweeps if s.get("analysis")), {}) or {}
    tables = [cells_table(cells)] + sweep_tables(cells)
    tables += [scaling_table(cells, analysis.get("m_max", 40), analysis.get("trials", 50)),
               final_speaker_table(cells), k_table(cells), cost_table(cells)]
    tables += byzantine_tables(cells) + [adversary_table(cells)] + resilience_tables(cells)
    tables.append(frontier_table(cells))
    tables.append(scale_table(cells))
    tables += [averages_table(cells, sweeps, analysis.get("m_max", 40), analysis.get("trials", 50)),
               published_table(cells, sweeps), sample_size_table(sweeps)]
    return [with_legend(t) for t in tables if t is not None]


# ---------------------------------------------------------------------------- rendering

def _md(t):
    lines = [f"### {t.title}", "", "| " + " | ".join(t.header) + " |", "|" + "---|" * len(t.header)]
    lines += ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in t.rows]
    return "\n".join(lines + [""] + t.notes) + "\n"


TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
       "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}", "Δ": r"$\Delta$", "±": r"$\pm$", "–": "--"}


def tex_escape(text):
    return "".join(TEX.get(ch, ch) for ch in str(text))


def _tex(t):
    lines = [f"% {tex_escape(t.title)}", r"\begin{table}[ht]", r"\centering", r"\small",
             r"\begin{tabular}{" + "l" * len(t.header) + "}", r"\hline",
             " & ".join(tex_escape(h) for h in t.header) + r" \\", r"\hline"]
    lines += [" & ".join(tex_escape(v) for v in row) + r" \\" for row in t.rows]
    lines += [r"\hline", r"\end{tabular}", r"\caption{" + tex_escape(" ".join([t.title + "."] + t.notes)) + "}",
              r"\end{table}"]
    return "\n".join(lines) + "\n"


def _csv(tables):
    """One block per table, blank line between: header `table, <columns>`, each row led by the title."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for i, t in enumerate(tables):
        if i:
            w.writerow([])
        w.writerow(["table"] + t.header)
        w.writerows([t.title] + list(row) for row in t.rows)
    return buf.getvalue()


def render(tables, fmt="md") -> str:
    if fmt not in FORMATS:
        raise ValueError(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "csv":
        return _csv(tables)
    return "\n".join((_md if fmt == "md" else _tex)(t) for t in tables)


def add_report_args(ap):
    ap.add_argument("dirs", nargs="+", metavar="DIR", help="sweep directories (sweep.json) or run directories")
    ap.add_argument("--format", default="md", help="md (default), csv or tex")
    ap.add_argument("--out", default=None, metavar="FILE", help="write the report here (default: print it)")


def cmd_report(args):
    if args.format not in FORMATS:
        raise ValueError(f"unknown --format {args.format!r}; choose one of {', '.join(FORMATS)}")
    text = render(build_report(args.dirs), args.format)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(f"report written to {args.out}")
    else:
        print(text, end="")


COMMAND = Command("report", "the papers' tables from sweep or run directories (md, csv or tex)",
                  add_report_args, cmd_report)


__all__ = ["FORMATS", "Table", "pct", "build_report", "render", "tex_escape", "cmd_report"]
