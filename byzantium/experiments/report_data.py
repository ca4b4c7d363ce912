"""The numbers behind the report's tables and plots, from cells (report_cells.load_cells).

Each analysis returns plain dicts (accuracies as intervals.Interval (point, lo, hi) with a 95 % interval
over problems) or [] / None when the cells do not support it; report.py renders them as tables and plot.py
draws them. The Consensus Trap analyses reuse protocols/rr_metrics.py; resilience reuses
experiments/resilience_table.resilience_report.
"""
import re

from ..protocols.attacks import ATTACK_MODES
from ..protocols.byzantine import ADVERSARY_MODES
from ..protocols.metrics import rr as rr_metrics
from ..protocols.metrics.intervals import diff_ci, mean_ci, mean_of_means_ci, ratio_ci
from .report_cells import BYZANTINE, covers, parse_failures, published_for, sac_metrics, value

RR_ONLY = ("chunk", "trajectories", "order", "attack_mode", "candidates")  # settings MAJ does not have
SWEPT = ("corrupt", "pattern")
ENGINE = ("decode_tokens", "prefill_tokens", "cached_tokens")


def per_problem(cell) -> dict:
    """problem id -> the cell's headline number for it."""
    return {r["id"]: value(cell, r) for r in cell.records}


def ci(cell):
    return mean_ci(per_problem(cell).values())


def _key(params, drop=()):
    return tuple(sorted((k, str(v)) for k, v in params.items() if k not in drop))


def label(cells, cell, drop=()):
    """The cell's params that differ between `cells` of its method (leaving out `drop`), as 'k=v, ...'."""
    peers = [c for c in cells if c.method == cell.method]
    keys = sorted(k for k, v in cell.params.items() if k not in drop and v is not None)
    varying = [k for k in keys if len({str(c.params.get(k)) for c in peers}) > 1]
    return ", ".join(f"{k}={cell.params[k]}" for k in varying) or str(cell.params.get("task") or cell.method)


# ---------------------------------------------------------------------------- every cell

def truncated(cell):
    """(RR/RRMaj trajectories that hit the length limit L, trajectories), or None for other methods."""
    if cell.method not in ("rr", "rrmaj"):
        return None
    ts = [t for r in cell.records for t in (r.get("trajectories") or [r])]
    return sum(t.get("finish_reason") == "length" for t in ts), len(ts)


def idle(cell, fails):
    """Why the cell's number says nothing about the mechanism (every answer unparsed, every score 0), or None."""
    if not cell.records:
        return None
    if cell.method in ("maj", "rr", "rrmaj", "sac", "cpwbft") and all(f[0] for f in fails):
        return "every final answer unparsed"
    values = [v for v in per_problem(cell).values() if v is not None]
    if values and not any(values):
        return "0 on every problem: the model never got one right, the comparison is empty"
    return None


def cell_rows(cells) -> list:
    rows = []
    for c in cells:
        fails = [parse_failures(c, r) for r in c.records]
        rows.append(dict(cell=c, n=len(c.records), errors=c.errors, total=(c.summary or {}).get("total"),
                         parse_final=sum(f[0] for f in fails), parse_voters=sum(f[1] for f in fails),
                         value=ci(c) if c.records else None, published=published_for(c),
                         truncated=truncated(c), idle=idle(c, fails)))
    return rows


# ---------------------------------------------------------------------------- The Consensus Trap

def _consensus(cells, methods=("maj", "rrmaj")):
    return [c for c in cells if c.method in methods and c.records]


def attack_mode(cell):
    """An RR/RRMaj cell's attack mode: how its corrupted agents wrote ("inject", the paper's, when the run
    recorded none); None for other methods."""
    return (cell.params.get("attack_mode") or "inject") if cell.method in ("rr", "rrmaj") else None


def _rr_key(cell, drop=()):
    """_key with the attack mode spelled out (a run of the paper's mode does not record it)."""
    mode = attack_mode(cell)
    return _key(cell.params if mode is None else {**cell.params, "attack_mode": mode}, drop)


def corruption_sweep(cells) -> list:
    """One group per setting (task, attack, model, ..., and for RRMaj its K, M and attack mode): MAJ and
    RRMaj by number of corrupted agents c, and Δ = RRMaj - MAJ paired over problems. Groups with fewer than
    two values of c are left out (no sweep). MAJ has no attack mode: one MAJ setting is the baseline of
    each RRMaj attack mode's group; when several modes were run, the groups go by setting, then by mode,
    their labels name the mode and each mode gets its own average."""
    cs = _consensus(cells)
    rr = [c for c in cs if c.method == "rrmaj"]
    maj = [c for c in cs if c.method == "maj"]
    heads = {}  # group key -> the RRMaj setting (or MAJ's alone when no RRMaj shares its base)
    for c in rr:
        heads.setdefault(_rr_key(c, SWEPT), c)
    for c in maj:
        if not any(_key(r.params, SWEPT + RR_ONLY) == _key(c.params, SWEPT + RR_ONLY) for r in rr):
            heads.setdefault(_key(c.params, SWEPT), c)
    groups = []
    for key, head in heads.items():
        base = _key(head.params, SWEPT + RR_ONLY)
        mine = [c for c in rr if _rr_key(c, SWEPT) == key]
        theirs = [c for c in maj if _key(c.params, SWEPT + RR_ONLY) == base]
        n = head.params.get("agents")
        by_c = {}
        for c in mine + theirs:
            by_c.setdefault(c.params.get("corrupt"), {})[c.method] = c
        if len({c.params.get("corrupt") for c in (mine or theirs)}) < 2 or n is None:
            continue  # no sweep: the group's own method was run at one corruption level
        cols = []
        for k in sorted(by_c):
            m, r = by_c[k].get("maj"), by_c[k].get("rrmaj")
            cols.append(dict(c=k, label=rr_metrics.config_label(k, n), maj=m, rrmaj=r,
                             maj_ci=ci(m) if m else None, rrmaj_ci=ci(r) if r else None,
                             delta=diff_ci(per_problem(m), per_problem(r)) if m and r else None))
        groups.append(dict(head=head, n=n, columns=cols, mode=attack_mode(head)))
    modes = list(dict.fromkeys(g["mode"] for g in groups if g["mode"] is not None))
    for g in groups:
        g["label"] = label([h["head"] for h in groups], g["head"], SWEPT + ("attack_mode", "candidates"))
        if len(modes) > 1 and g["mode"] is not None:
            extra = f" x{g['head'].params['candidates']}" if g["mode"] == "logprob" and \
                g["head"].params.get("candidates") else ""
            g["label"] += f", attack mode={g['mode']}{extra}"
    if len(modes) > 1:  # by setting, then by mode in ATTACK_MODES' order
        order = {m: i for i, m in enumerate(ATTACK_MODES)}
        groups.sort(key=lambda g: (g["label"].rsplit(", attack mode=", 1)[0], order.get(g["mode"], len(order))))
    same_n = [g for g in groups if g["n"] == groups[0]["n"]] if groups else []
    for mode in (modes if len(modes) > 1 else [None]):
        mine = [g for g in same_n if mode is None or g["mode"] == mode]
        if len(mine) > 1:
            groups.append(_average(mine, mode if len(modes) > 1 else None))
    return groups


def _average(groups, mode=None):
    """The groups' mean per column (as the paper's Average rows), each group's problems resampled on
    their own; Δ averages the groups' paired differences. mode: the attack mode they share, named in the
    label when several were run."""
    cols = []
    for k in sorted({c["c"] for g in groups for c in g["columns"]}):
        mine = [c for g in groups for c in g["columns"] if c["c"] == k]
        col = dict(c=k, label=mine[0]["label"], maj=None, rrmaj=None)
        for m in ("maj", "rrmaj"):
            have = [c[m] for c in mine if c[m]]
            col[m + "_ci"] = mean_of_means_ci([per_problem(x).values() for x in have]) if have else None
        pairs = [(per_problem(c["maj"]), per_problem(c["rrmaj"])) for c in mine if c["maj"] and c["rrmaj"]]
        col["delta"] = mean_of_means_ci([[b[i] - a[i] for i in a if i in b] for a, b in pairs]) if pairs else None
        cols.append(col)
    return dict(head=None, n=groups[0]["n"], columns=cols, mode=mode,
                label=f"Average of {len(groups)}" + (f", attack mode={mode}" if mode else ""))


def scaling(cells, m_max=40, trials=50, seed=0) -> list:
    """Test-time scaling per cell (of sweeps whose analysis is "scaling", and of plain run directories):
    accuracy of a plurality of M answers drawn from each question's pool
    (RRMaj: its M* trajectories; MAJ: its N agents), M = 1..min(m_max, pool), mean ± std over trials
    (rr_metrics.scaling_curve; MAJ's M=1 is the expected accuracy of one random agent)."""
    out = []
    for c in _consensus(cells):
        kind = ((c.sweep or {}).get("analysis") or {}).get("kind")
        if kind not in (None, "scaling"):
            continue  # a paper-scale sweep of hundreds of cells would spend minutes on curves nobody asked for
        pool = min(len(r.get("trajectories") or r.get("agents") or []) for r in c.records)
        top = min(m_max, pool)
        if top < 2:
            continue
        ms = list(range(1, top + 1)) if top <= 10 else sorted({m for m in rr_metrics.SCALING_MS if m <= top} | {top})
        kind = c.records[0]["kind"]  # the task's answer kind
        if c.method == "maj":
            golds = {r["task_id"]: r["gold"] for r in c.records}
            share = c.params.get("corrupt", 0) / c.params.get("agents", pool)
            curve = rr_metrics.scaling_curve(c.records, kind, ms, trials, seed, golds=golds, corrupt_share=share)
        else:
            curve = rr_metrics.scaling_curve(c.records, kind, ms, trials, seed)
        out.append(dict(cell=c, method=c.method, pool=pool, points=curve["points"], trials=trials))
    return out


def final_speaker(cells) -> list:
    """Per RR/RRMaj cell with clean and corrupted agents: accuracy of trajectories whose last words a
    clean vs a corrupted agent wrote, with the Fisher exact test (rr_metrics.final_speaker)."""
    out = []
    for c in _consensus(cells, ("rr", "rrmaj")):
        n, k = c.params.get("agents"), c.params.get("corrupt")
        if not (n and k and 0 < k < n):
            continue
        fs = rr_metrics.final_speaker(c.records)
        groups = {True: [], False: []}  # corrupted last -> per-problem (right, trajectories)
        for r in c.records:
            counts = {True: [0, 0], False: [0, 0]}
            for t in rr_metrics._items(r):
                last = rr_metrics.final_chunk(t)
                if last is not None:
                    counts[bool(last["corrupted"])][0] += bool(t["correct"])
                    counts[bool(last["corrupted"])][1] += 1
            for side in counts:
                groups[side].append(counts[side])
        out.append(dict(cell=c, clean=ratio_ci(groups[False]), corrupt=ratio_ci(groups[True]),
                        clean_n=fs["clean_n"], corrupt_n=fs["corrupt_n"], clean_right=fs["table"][0][0],
                        corrupt_right=fs["table"][1][0], odds=fs["odds_ratio"], p=fs["p_value"]))
    return out


def k_ablation(cells) -> list:
    """Accuracy per chunk size K for settings run at two or more K, with MAJ of the same setting."""
    rr = _consensus(cells, ("rr", "rrmaj"))
    maj = _consensus(cells, ("maj",))
    groups = {}
    for c in rr:
        groups.setdefault((c.method, _key(c.params, ("chunk",))), []).append(c)
    out = []
    for (method, _), cs in groups.items():
        if len({c.params.get("chunk") for c in cs}) < 2:
            continue
        cs = sorted(cs, key=lambda c: c.params.get("chunk"))
        ref = next((m for m in maj if _key(m.params, RR_ONLY) == _key(cs[0].params, RR_ONLY)), None)
        out.append(dict(label=label(rr, cs[0], ("chunk",)), method=method,
                        points=[dict(k=c.params["chunk"], cell=c, ci=ci(c)) for c in cs],
                        maj=ci(ref) if ref else None))
    return out


def cost_pairs(cells) -> list:
    """MAJ and RRMaj cells whose settings differ only in the method (and RRMaj's own K, M, order):
    decode, prefill and prefix-cache tokens (summary.json's "engine"), wall seconds, RRMaj/MAJ ratios."""
    maj = [c for c in cells if c.method == "maj" and c.summary and c.summary.get("engine")]
    out = []
    for r in cells:
        if r.method != "rrmaj" or not (r.summary and r.summary.get("engine")):
            continue
        m = next((m for m in maj if _key(m.params, RR_ONLY) == _key(r.params, RR_ONLY)), None)
        if m is None:
            continue
        sides = {}
        for name, c in (("maj", m), ("rrmaj", r)):
            # costs.jsonl's sum over every invocation (a resumed run); older runs: their last invocation only
            e = c.summary.get("cost") or c.summary["engine"]
            sides[name] = {k: e.get(k) for k in ENGINE} | {"seconds": e.get("seconds", c.summary.get("seconds"))}
        ratio = {k: sides["rrmaj"][k] / sides["maj"][k] if sides["maj"][k] else None for k in sides["maj"]}
        out.append(dict(label=f"{r.name} / {m.name}", maj=m, rrmaj=r, sides=sides, ratio=ratio,
                        cumulative=[c.name for c in (m, r) if not c.summary.get("cost")
                                    and not c.summary["engine"].get("since_start")],
                        last_only=[c.name for c in (m, r) if not c.summary.get("cost")]))
    return out


# ---------------------------------------------------------------------------- SAC and CP-WBFT

HEADLINE = ("IAA", "FAA", "BFTI", "RA", "H-Majority")


def byzantine(cells) -> list:
    """Per SAC/CP-WBFT cell: the headline metrics and weak/strong accuracy per round (rounds of a run
    that stopped early repeat its last round, as metrics.summarize does)."""
    out = []
    for c in cells:
        if c.method not in BYZANTINE or not c.records:
            continue
        ms = [sac_metrics(r) for r in c.records]
        rounds = max(len(m["acc"]["all"]) for m in ms)
        per_round = {g: [mean_ci([m["acc"][g][min(t, len(m["acc"][g]) - 1)] for m in ms]) for t in range(rounds)]
                     for g in ("weak", "strong") if any(m["acc"][g][0] is not None for m in ms)}
        metrics = {k: mean_ci([m[k] for m in ms]) for k in HEADLINE}
        # BFTI = FAA - IAA per problem: a difference, so a paired interval
        metrics["BFTI"] = diff_ci({i: m["IAA"] for i, m in enumerate(ms)}, {i: m["FAA"] for i, m in enumerate(ms)})
        out.append(dict(cell=c, metrics=metrics, rounds=per_round,
                        published={k: published_for(c, k) for k in HEADLINE}))
    return out


ADVERSARY_METRICS = ("BFTI", "H-Majority")


def by_adversary(cells) -> list:
    """SAC/CP-WBFT settings run under two or more adversary modes (every other param equal, the topology
    included, so one group per topology): per group its modes in ADVERSARY_MODES' order, each with BFTI
    and H-Majority (95% CI over problems)."""
    runs = byzantine(cells)
    groups = {}
    for r in runs:
        c = r["cell"]
        key = (c.method, _key(c.params, ("adversary", "adversary_model")))
        mode = c.params.get("adversary") or ("none" if c.params.get("byzantine") == 0 else "fixed")
        groups.setdefault(key, {})[mode] = r
    order = {m: i for i, m in enumerate(ADVERSARY_MODES)}
    heads = [r["cell"] for g in groups.values() for r in g.values()]
    out = []
    for (method, _), g in groups.items():
        if len(g) < 2:
            continue
        head = next(iter(g.values()))["cell"]
        out.append(dict(method=method, topology=head.params.get("topology"),
                        label=label(heads, head, ("adversary", "adversary_model", "topology")),
                        modes={m: {k: g[m]["metrics"][k] for k in ADVERSARY_METRICS}
                               for m in sorted(g, key=lambda m: order.get(m, len(order)))},
                        cells={m: g[m]["cell"] for m in g}))
    return out


# ---------------------------------------------------------------------------- resilience

def _points(t):
    """An interval of a [0, 1] score in points (computed on the score, so that pass@1 gets its Wilson
    interval; scaled here, once)."""
    return None if t is None or t[0] is None else t.scaled(100)


def resilience(cells):
    """resilience_report's rows and means by structure, each score with its interval (points), or None."""
    from .resilience_table import FAULT_KEYS, resilience_report
    runs = [c for c in cells if c.method == "resilience" and c.summary]
    if not runs:
        return None
    report = resilience_report([c.summary for c in runs])

    def find(row, faulty, defense):
        """The run of a row's condition: same system, task and model (two backbones are two rows), and
        for a faulty or defended run the row's own fault settings (semantic and syntactic apart)."""
        for c in runs:
            cfg = c.summary["config"]
            if (cfg["system"], cfg["task"], cfg.get("model"), cfg["defense"]) != \
                    (row["system"], row["task"], row.get("model"), defense):
                continue
            if faulty and {k: cfg.get(k) for k in FAULT_KEYS} == row["fault_settings"]:
                return c
            if not faulty and cfg["fault"] == "none":
                return c
        return None

    def scores(cell):
        return per_problem(cell) if cell else {}

    for row in report["rows"]:
        clean = find(row, False, "none")
        faulty = find(row, True, "none") if row["fault"] else None
        defended = find(row, True, row["defense"]) if row["defense"] else None
        for name, cell in (("clean", clean), ("faulty", faulty), ("defended", defended)):
            row[name + "_ci"] = _points(mean_ci(per_problem(cell).values())) if cell else None
            row[name + "_cell"] = cell
        # AutoInject that rewrote no piece left the faulty run clean: its drop is 0 by construction
        m = ((faulty.summary or {}).get("messages") or {}) if faulty else {}
        row["inert"] = (f"selected {m.get('inject_selected', 0)} message(s), chose {m.get('inject_pieces_chosen', 0)} "
                        f"piece(s), {m.get('inject_json_failures', 0)} unreadable JSON replies"
                        if row["fault"] == "autoinject" and faulty is not None and not m.get("inject_pieces_rewritten")
                        else None)
        # drop = clean - faulty, paired over problems
        row["drop_ci"] = _points(diff_ci(scores(faulty), scores(clean))) if clean and faulty else None
        row["published"] = list({id(p): p for cell in (clean, faulty, defended) if cell
                                 for p in published_for(cell)}.values())  # once each

    def averaged(rows, name):
        """problem id -> mean over the rows' systems (the structure's mean, resampled by problem)."""
        dicts = [scores(r[name + "_cell"]) for r in rows if r[name + "_cell"] is not None]
        ids = set.intersection(*(set(d) for d in dicts)) if dicts else set()
        return {i: sum(d[i] for d in dicts) / len(dicts) for i in ids if all(d[i] is not None for d in dicts)}

    for s in report["structures"]:
        rows = [r for r in report["rows"] if (r["task"], r["structure"], r["fault"], r["defense"]) ==
                (s["task"], s["structure"], s["fault"], s["defense"])]
        avg = {name: averaged(rows, name) for name in ("clean", "faulty", "defended")}
        for name, values in avg.items():
            s[name + "_ci"] = _points(mean_ci(values.values())) if values else None
        s["drop_ci"] = _points(diff_ci(avg["faulty"], avg["clean"])) if avg["clean"] and avg["faulty"] else None
    return report


# ---------------------------------------------------------------------------- the paper's averages

def published_averages(cells, sweeps, m_max=40, trials=50) -> list:
    """Each published average (`average = true`) with ours over the same cells: the mean of the cells'
    accuracies (each cell's problems resampled on their own), or for "accuracy at M=k" the mean of the
    cells' test-time scaling curves at M=k; for "clean-last / corrupt-last accuracy" the trajectories
    pooled over the cells. Cells the sweep did not run are counted, not guessed."""
    out = []
    curves = None
    for sweep in sweeps:
        mine = [c for c in cells if c.sweep is sweep]
        for p in sweep.get("published") or []:
            if not p.get("average"):
                continue
            over = [c for c in mine if covers(p, c)]
            done = [c for c in over if c.records]
            m = re.fullmatch(r"accuracy at M=(\d+)", p.get("metric", ""))
            last = re.fullmatch(r"(clean|corrupt)-last accuracy", p.get("metric", ""))
            if last:  # trajectories pooled over the cells, as the paper's counts are
                stats = final_speaker(done)
                right, n = (sum(s[f"{last[1]}_{k}"] for s in stats) for k in ("right", "n"))
                ours = (right / n, None, None) if n else None
            elif m:
                curves = scaling(cells, m_max, trials) if curves is None else curves
                at = [pt["mean"] for cv in curves if cv["cell"] in done for pt in cv["points"]
                      if pt["m"] == int(m[1])]
                ours = (sum(at) / len(at), None, None) if at and len(at) == len(done) else None
            else:
                ours = mean_of_means_ci([per_problem(c).values() for c in done]) if done else None
            out.append(dict(entry=p, sweep=sweep, cells=over, done=done, ours=ours))
    return out
