"""`byzantium demo`: MAJ vs RRMaj at N=5 across the corruption sweep (0c5t ... 5c0t) under the strong
injection, on the embedded model and generated one-step sums (nothing downloaded).

Every configuration's instances run at once through one LLM, so the engine batches them all. Writes
OUT/results.jsonl (one line per configuration and question), OUT/summary.md (the sweep table, the clean
ceiling, the settings and the engine's counters) and OUT/sweep.png.

    from byzantium.experiments.demo import run_demo
    summary = run_demo(questions=20, out="runs/demo")
"""
import asyncio
import json
import time
from pathlib import Path

from ..protocols.attacks import make_agents
from ..protocols.round_robin import rr_majority
from ..protocols.rr_analysis import sweep_markdown, sweep_table
from ..protocols.voting import majority_vote
from ..tasks import is_correct
from ..tasks.generators import gen_sum
from .rr import engine_stats
from .runner import to_json

DATASET = "gen-sum"
METHODS = ("maj", "rrmaj")


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


def run_demo(questions=20, out="runs/demo", model=None, corrupt=range(6), n=5, k=8, max_len=24, m=None,
             temperature=0.0, seed=0, progress=True) -> dict:
    """Run the sweep; print the table; write OUT/summary.md, sweep.png and results.jsonl.
    Returns {"table", "ceiling", "single_clean_agent", "seconds", "engine", "markdown"}."""
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
                result = await rr_majority(task, agents, m, k, max_len, "strong", temperature, seed)
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
    pct = lambda x: "–" if x is None else f"{100 * x:.1f} %"
    lines = [
        f"# MAJ vs RRMaj under the strong injection (N={n})\n",
        f"{questions} generated one-step sums ({DATASET}, seed {seed}) on {model or DEFAULT_MODEL}; "
        f"RRMaj: M={m} trajectories, K={k}, L={max_len}; MAJ answers up to {max_len} tokens; "
        f"temperature {temperature}. Accuracy in %, Δ = RRMaj − MAJ in points.\n",
        markdown,
        f"Clean ceiling (0c{n}t): MAJ {pct(ceiling)}, RRMaj {pct(acc.get((DATASET, 'rrmaj', 0)))}; "
        f"one clean agent alone {pct(single)}.\n",
        f"{len(jobs)} instances in {seconds:.0f} s; engine: prefill {engine['prefill_tokens']} tokens, "
        f"decode {engine['decode_tokens']} tokens, {engine['cached_tokens']} from the prefix cache, "
        f"batch of up to {engine['max_batch_seqs']} sequences.\n",
    ]
    text = "\n".join(lines)
    (out / "summary.md").write_text(text)
    plot_sweep(table, out / "sweep.png", single)
    print("\n" + text)
    print(f"written: {out / 'summary.md'}, {out / 'sweep.png'}, {out / 'results.jsonl'}")
    return dict(table=table, ceiling=ceiling, single_clean_agent=single, seconds=seconds, engine=engine,
                markdown=markdown)


__all__ = ["run_demo", "plot_sweep"]
