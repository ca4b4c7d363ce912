"""Analyses of "The Consensus Trap" (MAJ vs RR/RRMaj): corruption sweep, test-time scaling by bootstrap,
final-speaker Fisher tests, chunk-size K sweep.

Inputs are the protocols' results — `MajResult` (its `agents`: `AgentAnswer`s), `RRMajResult` (its
`trajectories`) or bare `Trajectory`s — either as the dataclasses or as their `dataclasses.asdict`
forms read back from the runner's JSONL; both give identical numbers. Accuracies are fractions in
[0, 1]; the markdown renderers print percentages (Δ in points).

Bootstrap choices (the paper draws M of a pool of 50 per question, 50 trials):
- each trial draws M of the question's pool of M* answers WITHOUT replacement (M <= M*; larger M are
  left out of the curve and listed under "skipped");
- the vote is `voting.plurality`, the protocols' own rule (normalised answers, abstentions dropped,
  no votes = wrong); its tie key includes the trial and M, so a tie is drawn afresh in each trial but
  the same for the same seed;
- mean and std (ddof=0) are over trials of the accuracy over all questions;
- M=1 is by default the paper's exact baseline instead of a draw: MAJ = expectation of one random
  agent's correctness, corrupted and clean answers weighted by their share; RR = expected accuracy of
  one trajectory. Sampling one answer has this expectation, so the bootstrap converges to it.
"""
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ...tasks import is_correct, normalize_answer
from ..plurality import plurality

SCALING_MS = (1, 5, 10, 20, 30, 40)
K_SWEEP = (10, 30, 75, 150, 300, 500)


def _get(obj, name, default=None):
    """A field of a dataclass or of its asdict() form."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _items(record):
    """The voters of one result: MAJ agents, RRMaj trajectories, or the record itself (a trajectory)."""
    for name in ("agents", "trajectories"):
        items = _get(record, name)
        if items is not None:
            return list(items)
    return [record]


def accuracy(results):
    """Share of results marked correct (None for no results)."""
    results = list(results)
    return sum(bool(_get(r, "correct")) for r in results) / len(results) if results else None


# ---------------------------------------------------------------------------- 1. corruption sweep

def config_label(c, n):
    return f"{c}c{n - c}t"


def _rows(acc):
    """(dataset, method, c, n or None, accuracy) from rows (dicts/objects) or {(dataset, method, c[, n]): acc}."""
    if isinstance(acc, dict):
        for key, value in acc.items():
            dataset, method, c, *rest = key
            yield dataset, method, c, (rest[0] if rest else None), value
    else:
        for r in acc:
            yield _get(r, "dataset"), _get(r, "method"), _get(r, "c"), _get(r, "n"), _get(r, "accuracy")


def _method(name):
    m = str(name).lower()
    if m not in ("maj", "rrmaj"):
        raise ValueError(f"method must be MAJ or RRMaj, got {name!r}")
    return m


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def sweep_table(acc, n=5):
    """The paper's corruption sweep: columns 0cNt (no adversary) … Nc0t (all corrupted), rows MAJ, RRMaj and
    Δ = RRMaj − MAJ per dataset, then the same averaged over datasets (a cell's average is over the
    datasets that have it; Δ's average is the mean of the datasets' Δ). Rows whose n differs are ignored.
    Returns {"n", "columns", "rows": [{"dataset", "method", "values"}]} (values None when missing)."""
    cells = {}
    for dataset, method, c, rn, value in _rows(acc):
        if rn is not None and rn != n:
            continue
        if not 0 <= c <= n:
            raise ValueError(f"c={c} outside 0..{n}")
        cells[(dataset, _method(method), c)] = value
    datasets = list(dict.fromkeys(d for d, _, _ in cells))
    cs = range(n + 1)
    rows = []
    per = defaultdict(list)  # (method, c) -> values over datasets, for the averages
    for d in datasets:
        maj = [cells.get((d, "maj", c)) for c in cs]
        rr = [cells.get((d, "rrmaj", c)) for c in cs]
        delta = [None if a is None or b is None else b - a for a, b in zip(maj, rr)]
        rows += [dict(dataset=d, method="MAJ", values=maj), dict(dataset=d, method="RRMaj", values=rr),
                 dict(dataset=d, method="Δ", values=delta)]
        for c in cs:
            for name, vals in (("MAJ", maj), ("RRMaj", rr), ("Δ", delta)):
                per[(name, c)].append(vals[c])
    if datasets:
        rows += [dict(dataset="Average", method=m, values=[_mean(per[(m, c)]) for c in cs])
                 for m in ("MAJ", "RRMaj", "Δ")]
    columns = [config_label(c, n) + (" (no adversary)" if c == 0 else " (all corrupted)" if c == n else "") for c in cs]
    return dict(n=n, columns=columns, rows=rows)


def _pct(x, signed=False):
    if x is None:
        return "–"
    return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def _markdown(header, lines):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out) + "\n"


def sweep_markdown(table):
    """Render `sweep_table` (accuracy %, Δ in points)."""
    lines = [[r["dataset"], r["method"]] + [_pct(v, r["method"] == "Δ") for v in r["values"]]
             for r in table["rows"]]
    return _markdown(["Dataset", "Method"] + table["columns"], lines)


# ---------------------------------------------------------------------------- 2. test-time scaling

@dataclass
class _Voter:
    answer: object
    correct: bool
    corrupted: object  # bool for MAJ agents; None for trajectories (no single author)


def _pools(results, kind, golds):
    """task_id -> list of voters, records of the same task pooled in input order."""
    pools = defaultdict(list)
    for r in results:
        task_id = _get(r, "task_id")
        gold = (golds or {}).get(task_id)
        for item in _items(r):
            answer = _get(item, "answer")
            if gold is not None:
                correct = is_correct(answer, gold, kind)
            elif _get(item, "correct") is not None:
                correct = bool(_get(item, "correct"))
            else:
                raise ValueError(f"task {task_id!r}: no gold given and its answers carry no 'correct' flag "
                                 "(MAJ agents need golds)")
            pools[task_id].append(_Voter(answer, correct, _get(item, "corrupted")))
    return pools


def _winner_correct(winner, pool, gold, kind):
    if winner is None:
        return False
    if gold is not None:
        return is_correct(winner, gold, kind)
    # Without a gold, a vote is right when the pool's answers with its normal form were marked right.
    return any(v.correct for v in pool if normalize_answer(v.answer, kind) == winner)


def _single_answer_accuracy(pool, corrupt_share=None):
    """Expected correctness of one answer drawn from `pool` (the paper's M=1). With `corrupt_share`,
    corrupted and clean answers are weighted by that share instead of their share of the pool."""
    if corrupt_share is None:
        return sum(v.correct for v in pool) / len(pool)
    bad = [v.correct for v in pool if v.corrupted is True]
    good = [v.correct for v in pool if v.corrupted is False]
    if len(bad) + len(good) != len(pool):
        raise ValueError("corrupt_share needs answers with a corrupted flag (MAJ agents)")
    if (corrupt_share > 0 and not bad) or (corrupt_share < 1 and not good):
        raise ValueError("corrupt_share weights a group the pool does not have")
    return (corrupt_share * (_mean(bad) or 0.0)) + (1 - corrupt_share) * (_mean(good) or 0.0)


def scaling_curve(results, kind, ms=SCALING_MS, trials=50, seed=0, golds=None, corrupt_share=None,
                  analytic_m1=True):
    """Accuracy of a plurality of M answers for each M in `ms`, by bootstrap from each question's pool.

    results: MajResults (pool = agent answers) or RRMajResults / Trajectories (pool = trajectory
    answers); several records of one task_id are pooled. golds: task_id -> gold answer, required for
    MAJ (agents carry no correctness), optional for trajectories (their `correct` flags are used).
    Returns {"points": [{"m", "mean", "std", "trials"}], "skipped": [m > smallest pool], "pool": min M*}.
    """
    pools = _pools(results, kind, golds)
    if not pools:
        raise ValueError("no results")
    if trials < 1 or any(m < 1 for m in ms):
        raise ValueError("need trials >= 1 and every M >= 1")
    tasks = sorted(pools)  # a fixed order: the same draws whatever the input order
    smallest = min(len(pools[t]) for t in tasks)
    rng = np.random.default_rng(seed)
    points, skipped = [], []
    for m in ms:
        if m > smallest:
            skipped.append(m)
            continue
        if m == 1 and analytic_m1:
            mean = _mean([_single_answer_accuracy(pools[t], corrupt_share) for t in tasks])
            points.append(dict(m=1, mean=mean, std=0.0, trials=0))
            continue
        accs, seen = [], {}  # seen: (task, winner) -> right, since is_correct may parse maths
        for trial in range(trials):
            right = 0
            for t in tasks:
                pool = pools[t]
                drawn = [pool[i] for i in rng.choice(len(pool), size=m, replace=False)]
                vote = plurality([v.answer for v in drawn], kind, f"boot:{seed}:{t}:{m}:{trial}")
                key = (t, vote.answer)
                if key not in seen:
                    seen[key] = _winner_correct(vote.answer, pool, (golds or {}).get(t), kind)
                right += seen[key]
            accs.append(right / len(tasks))
        points.append(dict(m=m, mean=float(np.mean(accs)), std=float(np.std(accs)), trials=trials))
    return dict(points=points, skipped=skipped, pool=smallest)


def scaling_markdown(curves):
    """Render {label: scaling_curve(...)} as rows of mean ± std (%) per M."""
    ms = sorted({p["m"] for c in curves.values() for p in c["points"]})
    lines = []
    for label, curve in curves.items():
        by_m = {p["m"]: p for p in curve["points"]}
        lines.append([label] + [f"{_pct(by_m[m]['mean'])} ± {_pct(by_m[m]['std'])}" if m in by_m else "–"
                                for m in ms])
    return _markdown(["Method"] + [f"M={m}" for m in ms], lines)


# ---------------------------------------------------------------------------- 3. final speaker

def final_chunk(traj):
    """The chunk of the trajectory's final speaker, or None: the last chunk that wrote any text. Its
    recorded author is the agent that really spoke (the order varies per trajectory, so never turn
    mod N); a last turn that only ended the text (end of sequence, nothing written) leaves the final
    words to the one before."""
    chunks = _get(traj, "chunks") or []
    return next((c for c in reversed(chunks) if (_get(c, "text") or "").strip()), None)


def final_speaker(results):
    """Accuracy of trajectories whose final words (`final_chunk`) a clean vs a corrupted agent wrote,
    with a two-sided Fisher exact test on [[clean right, clean wrong], [corrupt right, corrupt wrong]].
    results: RRMajResults or Trajectories. Trajectories with no text are counted under "skipped"."""
    table = [[0, 0], [0, 0]]
    skipped = 0
    for r in results:
        for traj in _items(r):
            last = final_chunk(traj)
            if last is None:
                skipped += 1
                continue
            row = 1 if _get(last, "corrupted") else 0
            table[row][0 if _get(traj, "correct") else 1] += 1
    from scipy.stats import fisher_exact  # here: scipy costs `report --help` a second at import
    odds, p = fisher_exact(table)
    n_clean, n_bad = sum(table[0]), sum(table[1])
    return dict(table=table, clean_n=n_clean, corrupt_n=n_bad,
                clean_accuracy=table[0][0] / n_clean if n_clean else None,
                corrupt_accuracy=table[1][0] / n_bad if n_bad else None,
                odds_ratio=float(odds), p_value=float(p), skipped=skipped)


def final_speaker_by_group(groups):
    """{dataset/config label: results} -> {label: final_speaker(results)}."""
    return {label: final_speaker(results) for label, results in groups.items()}


def final_speaker_markdown(stats):
    """Render final_speaker_by_group(...)."""
    lines = [[label, _pct(s["clean_accuracy"]) + f" (n={s['clean_n']})",
              _pct(s["corrupt_accuracy"]) + f" (n={s['corrupt_n']})", f"{s['odds_ratio']:.3g}", f"{s['p_value']:.3g}"]
             for label, s in stats.items()]
    return _markdown(["Group", "Clean last", "Corrupt last", "Odds ratio", "Fisher p"], lines)


# ---------------------------------------------------------------------------- 4. chunk-size sweep

def k_sweep_table(acc, maj=None):
    """Accuracy per chunk size K per dataset, plus the MAJ reference line.
    acc: rows with dataset, k, accuracy (dicts/objects) or {(dataset, k): accuracy};
    maj: {dataset: MAJ accuracy} (optional). Returns {"ks", "rows": [{"dataset", "values", "maj"}]}
    with an "Average" row over the datasets that have each cell."""
    if isinstance(acc, dict):
        items = [(d, k, v) for (d, k), v in acc.items()]
    else:
        items = [(_get(r, "dataset"), _get(r, "k"), _get(r, "accuracy")) for r in acc]
    if any(k < 1 for _, k, _ in items):
        raise ValueError("chunk size K must be >= 1")
    cells = {(d, k): v for d, k, v in items}
    ks = sorted({k for _, k, _ in items})
    datasets = list(dict.fromkeys(d for d, _, _ in items))
    maj = maj or {}
    rows = [dict(dataset=d, values=[cells.get((d, k)) for k in ks], maj=maj.get(d)) for d in datasets]
    if rows:
        rows.append(dict(dataset="Average", values=[_mean([r["values"][i] for r in rows]) for i in range(len(ks))],
                         maj=_mean([r["maj"] for r in rows])))
    return dict(ks=ks, rows=rows)


def k_sweep_markdown(table):
    lines = [[r["dataset"]] + [_pct(v) for v in r["values"]] + [_pct(r["maj"])] for r in table["rows"]]
    return _markdown(["Dataset"] + [f"K={k}" for k in table["ks"]] + ["MAJ"], lines)


__all__ = ["SCALING_MS", "K_SWEEP", "accuracy", "config_label", "sweep_table", "sweep_markdown",
           "scaling_curve", "scaling_markdown", "final_chunk", "final_speaker",
           "final_speaker_by_group", "final_speaker_markdown", "k_sweep_table", "k_sweep_markdown"]
