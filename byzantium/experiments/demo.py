"""`byzantium demo`: MAJ vs RRMaj at N=5 across the corruption sweep (0c5t ... 5c0t) under the strong
injection, on the embedded model and generated one-step sums (nothing downloaded).

Every configuration's instances run at once through one LLM, so the engine batches them all. Agents
sample (temperature 0.7, seeded: a rerun is identical) and each trajectory draws its speaking order, so
RRMaj's M trajectories and MAJ's N answers are distinct samples; summary.md counts how many of them
differ per question. Writes OUT/results.jsonl (one line per configuration and question), OUT/summary.md
(the sweep table, a line saying what it shows, the clean ceiling, distinct samples, the settings and
the engine's counters) and OUT/sweep.png.

    from byzantium.experiments.demo import run_demo
    summary = run_demo(questions=20, out="runs/demo")
"""
import asyncio
import json
import time
from pathlib import Path

from ..commands import Command
from ..protocols.attacks import make_agents
from ..protocols.round_robin import rr_majority
from ..protocols.metrics.rr import config_label, sweep_markdown, sweep_table
from ..protocols.rr_prompts import TEMPERATURE
from ..protocols.voting import majority_vote
from ..tasks import is_correct
from ..tasks.generators import gen_sum
from .rr import engine_stats
from .runner import to_json

DATASET = "gen-sum"
METHODS = ("maj", "rrmaj")
DEMO_QUESTIONS = 20  # `byzantium demo`: questions per configuration (about 2-3 minutes on 2 CPU cores)


def _mean(values):
    return sum(values) / len(values) if values else None


def plot_sweep(table, path, ceiling=None):
    """Accuracy (%) per corruption level, one line per method, from `sweep_table`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = table["n"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for row in table["rows"][:2]:  # the dataset's MAJ and RRMaj rows
        points = [(c, 100 * v) for c, v in enumerate(row["values"]) if v is not None]
        ax.plot([c for c, _ in points], [v for _, v in points], marker="o", label=row["method"])
    if ceiling is not None:
        ax.axhline(100 * ceiling, color="gray", linestyle="--", linewidth=1, label="one clean agent")
    ax.set_xticks(range(n + 1), [f"{c}c{n - c}t" for c in range(n + 1)])
    ax.set_xlabel("corrupted / clean agents")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"MAJ vs RRMaj, N={n}, strong injection")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def verdict(table, questions):
    """One sentence on what the sweep shows, from its Δ row (RRMaj − MAJ per corruption level)."""
    n = table["n"]
    delta = [(c, d) for c, d in enumerate(table["rows"][2]["values"]) if d is not None]
    if not delta:
        return "No corruption level has both MAJ and RRMaj results."
    wins, losses = sum(d > 0 for _, d in delta), sum(d < 0 for _, d in delta)
    best = max(delta, key=lambda cd: cd[1])
    worst = min(delta, key=lambda cd: cd[1])
    return (f"RRMaj beats MAJ at {wins} of {len(delta)} corruption levels, loses at {losses} and ties at "
            f"{len(delta) - wins - losses}; Δ runs from {100 * worst[1]:+.1f} points ({config_label(worst[0], n)}) "
            f"to {100 * best[1]:+.1f} ({config_label(best[0], n)}), where one question is "
            f"{100 / questions:.1f} points.")


def distinct(records, method, c):
    """Mean number of distinct texts per question: RRMaj's trajectories or MAJ's replies."""
    items = "trajectories" if method == "rrmaj" else "agents"
    return _mean([len({x["text"] for x in r[items]}) for r in records if r["method"] == method and r["c"] == c])


def run_demo(questions=DEMO_QUESTIONS, out="runs/demo", model=None, corrupt=range(6), n=5, k=8, max_len=24, m=None,
             temperature=TEMPERATURE, seed=0, progress=True, order="shuffle") -> dict:
    """Run the sweep; print the table; write OUT/summary.md, sweep.png and results.jsonl.
    Returns {"table", "ceiling", "single_clean_agent", "distinct", "verdict", "seconds", "engine",
    "markdown"}; distinct: {(method, c): mean distinct texts per question}."""
    from tqdm.auto import tqdm

    from ..backends import DEFAULT_MODEL, LLMPool

    if questions < 1:
        raise ValueError(f"--questions must be >= 1, got {questions}")
    tasks = gen_sum(questions, seed)
    m = n if m is None else m
    jobs = [(method, c, task) for c in corrupt for method in METHODS for task in tasks]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with LLMPool("native") as pool:
        llm = pool.get(model)
        bar = tqdm(total=len(jobs), desc=f"MAJ+RRMaj, {len(list(corrupt))} configs", unit="inst",
                   disable=not progress, dynamic_ncols=True)

        async def one(method, c, task):
            agents = make_agents(llm, c, n)
            if method == "maj":
                result = await majority_vote(task, agents, "strong", max_len, temperature, seed)
            else:
                result = await rr_majority(task, agents, m, k, max_len, "strong", temperature, seed, order=order)
            bar.update(1)
            return {"method": method, "c": c, "gold": task.gold, **to_json(result)}

        async def everything():  # all configurations in flight at once: one batch for the engine
            return await asyncio.gather(*(one(*job) for job in jobs))

        try:
            records = asyncio.run(everything())
        finally:
            bar.close()
        engine = engine_stats([llm])
    seconds = time.perf_counter() - start

    with open(out / "results.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    acc = {}
    for method in METHODS:
        for c in corrupt:
            acc[(DATASET, method, c)] = _mean([r["correct"] for r in records if r["method"] == method and r["c"] == c])
    table = sweep_table(acc, n)
    table["rows"] = [r for r in table["rows"] if r["dataset"] != "Average"]  # one dataset: no average
    gold = {r["task_id"]: r["gold"] for r in records}
    single = _mean([is_correct(a["answer"], gold[r["task_id"]], "number")
                    for r in records if r["method"] == "maj" and r["c"] == 0 for a in r["agents"]])
    ceiling = acc.get((DATASET, "maj", 0))
    markdown = sweep_markdown(table)
    says = verdict(table, questions)
    spread = {(method, c): distinct(records, method, c) for method in METHODS for c in corrupt}
    def pct(x):
        return "–" if x is None else f"{100 * x:.1f} %"
    def per_level(method):
        return ", ".join(f"{config_label(c, n)} {spread[(method, c)]:.1f}" for c in corrupt)
    lines = [
        f"# MAJ vs RRMaj under the strong injection (N={n})\n",
        f"{questions} generated one-step sums ({DATASET}, seed {seed}) on {model or DEFAULT_MODEL}; "
        f"RRMaj: M={m} trajectories, K={k}, L={max_len}, speaking order {order}; MAJ answers up to {max_len} "
        f"tokens; temperature {temperature}, every request seeded. Accuracy in %, Δ = RRMaj − MAJ in points.\n",
        markdown,
        says + "\n",
        f"Clean ceiling (0c{n}t): MAJ {pct(ceiling)}, RRMaj {pct(acc.get((DATASET, 'rrmaj', 0)))}; "
        f"one clean agent alone {pct(single)}.\n",
        f"Distinct trajectories per question (RRMaj, of M={m}): {per_level('rrmaj')}. "
        f"Distinct replies per question (MAJ, of N={n}): {per_level('maj')}.\n",
        f"{len(jobs)} instances in {seconds:.0f} s; engine: prefill {engine['prefill_tokens']} tokens, "
        f"decode {engine['decode_tokens']} tokens, {engine['cached_tokens']} from the prefix cache, "
        f"batch of up to {engine['max_batch_seqs']} sequences.\n",
    ]
    text = "\n".join(lines)
    (out / "summary.md").write_text(text)
    plot_sweep(table, out / "sweep.png", single)
    print("\n" + text)
    print(f"written: {out / 'summary.md'}, {out / 'sweep.png'}, {out / 'results.jsonl'}")
    return dict(table=table, ceiling=ceiling, single_clean_agent=single, distinct=spread, verdict=says,
                seconds=seconds, engine=engine, markdown=markdown)


def add_demo_args(ap):
    ap.add_argument("--questions", type=int, default=DEMO_QUESTIONS, help=f"generated sums (default {DEMO_QUESTIONS})")
    ap.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")


def cmd_demo(args):
    run_demo(questions=args.questions, out=args.out, progress=not args.no_progress)


COMMAND = Command("demo", "MAJ vs RRMaj across the corruption sweep on the embedded model (a few minutes)",
                  add_demo_args, cmd_demo)


__all__ = ["run_demo", "plot_sweep", "verdict"]
