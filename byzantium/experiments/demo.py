"""`byzantium demo`: MAJ vs RRMaj at N=5 across the corruption sweep (0c5t ... 5c0t) under the strong
injection, on the embedded model and generated one-step sums (nothing downloaded).

Every configuration's instances run at once through one LLM, so the engine batches them all. Agents
sample (temperature 0.7, seeded: a rerun is identical) and each trajectory draws its speaking order, so
RRMaj's M trajectories and MAJ's N answers are distinct samples; summary.md counts how many of them
differ per question. Writes one run directory per configuration, OUT/<method>-<c>c<t>t/ (results.jsonl and
summary.json, as `byzantium maj|rrmaj` write them, so that `byzantium report OUT` and `byzantium plot OUT`
read the demo), OUT/summary.md (the report's sweep table with 95 % intervals, a line saying what it
shows, the no-adversary reference, distinct samples, the settings and the engine's counters) and
OUT/sweep.png.

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
from ..protocols.metrics.rr import config_label, sweep_table
from ..protocols.rr_prompts import TEMPERATURE
from ..protocols.voting import majority_vote
from ..tasks import is_correct
from ..tasks.generators import gen_sum
from .progress import TokenBudgetBar
from .report import render, sweep_tables
from .report_cells import load_cells
from .report_table import with_legend
from .rr import engine_stats, settings, summarize
from .runner import RESULTS, to_json, write_summary

DATASET = "gen-sum"
METHODS = ("maj", "rrmaj")
DEMO_QUESTIONS = 20  # `byzantium demo`: questions per configuration (few enough for a laptop's CPU in minutes)


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
    if ceiling is not None:  # the name is kept for callers: it is one clean agent's accuracy, a reference
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


def distinct(records, method):
    """Mean number of distinct texts per question of one configuration: RRMaj's trajectories or MAJ's replies."""
    items = "trajectories" if method == "rrmaj" else "agents"
    return _mean([len({x["text"] for x in r[items]}) for r in records])


def cell_name(method, c, n):
    return f"{method}-{config_label(c, n)}"


def token_budget(method, n, m, max_len):
    """The most tokens one instance can generate: N answers (MAJ) or M trajectories (RRMaj) of L tokens."""
    return (n if method == "maj" else m) * max_len


def generated_tokens(result):
    if hasattr(result, "trajectories"):
        return sum(t.num_tokens for t in result.trajectories)
    return sum(a.tokens for a in result.agents)


def say(text):
    print(f"byzantium demo: {text}", flush=True)


def run_demo(questions=DEMO_QUESTIONS, out="runs/demo", model=None, corrupt=range(6), n=5, k=8, max_len=24, m=None,
             temperature=TEMPERATURE, seed=0, progress=True, order="shuffle") -> dict:
    """Run the sweep; print the table; write the run directories, OUT/summary.md and OUT/sweep.png.
    Returns {"table", "ceiling", "single_clean_agent", "distinct", "verdict", "seconds", "engine",
    "markdown"}; ceiling: MAJ's accuracy at 0c (the no-adversary reference, kept under its old name);
    distinct: {(method, c): mean distinct texts per question}."""
    from ..backends import DEFAULT_MODEL, LLMPool

    if questions < 1:
        raise ValueError(f"--questions must be >= 1, got {questions}")
    corrupt = list(corrupt)
    tasks = gen_sum(questions, seed)
    m = n if m is None else m
    cells = [(method, c) for c in corrupt for method in METHODS]
    jobs = [(method, c, task) for method, c in cells for task in tasks]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model_name = model or DEFAULT_MODEL
    say(f"{len(jobs)} instances ({len(cells)} configurations x {questions} question{'s' if questions > 1 else ''}); "
        f"loading {model_name} and warming the engine up (the first start also builds the CPU kernels and "
        f"converts the model, and says so)")
    start = time.perf_counter()
    with LLMPool("native") as pool:
        llm = pool.get(model)
        say(f"model ready after {time.perf_counter() - start:.0f} s; starting every instance at once (the engine "
            f"batches them; the first tokens come once their prompts are prefilled)")
        since = engine_stats([llm])
        budget = sum(token_budget(method, n, m, max_len) for method, _, _ in jobs)
        bar = TokenBudgetBar(budget, lambda: (llm.stats or {}).get("decode_tokens", 0),
                             f"MAJ+RRMaj, {len(corrupt)} corruption levels, token budget", len(jobs),
                             disable=not progress)

        async def one(method, c, task):
            agents = make_agents(llm, c, n)
            if method == "maj":
                result = await majority_vote(task, agents, "strong", max_len, temperature, seed)
            else:
                result = await rr_majority(task, agents, m, k, max_len, "strong", temperature, seed, order=order)
            bar.finished(token_budget(method, n, m, max_len), generated_tokens(result))
            return {"id": task.id, "gold": task.accepted, "kind": task.kind, **to_json(result)}

        async def ticking():
            while True:
                await asyncio.sleep(1.0)
                bar.tick()

        async def everything():  # all configurations in flight at once: one batch for the engine
            ticker = asyncio.create_task(ticking()) if progress else None
            try:
                return await asyncio.gather(*(one(*job) for job in jobs))
            finally:
                if ticker:
                    ticker.cancel()

        try:
            records = asyncio.run(everything())
        finally:
            bar.close()
        engine = engine_stats([llm], since)
        seconds = time.perf_counter() - start
        by_cell = {cell: [r for (method, c, _), r in zip(jobs, records) if (method, c) == cell] for cell in cells}
        for (method, c), rows in by_cell.items():
            write_cell(out / cell_name(method, c, n), method, c, rows, [llm], n, k, m, max_len, temperature, seed,
                       order, model_name, seconds)

    acc = {(DATASET, method, c): _mean([r["correct"] for r in rows]) for (method, c), rows in by_cell.items()}
    table = sweep_table(acc, n)
    table["rows"] = [r for r in table["rows"] if r["dataset"] != "Average"]  # one dataset: no average
    single = _mean([is_correct(a["answer"], r["gold"], "number") for r in by_cell[("maj", 0)] for a in r["agents"]]) \
        if ("maj", 0) in by_cell else None
    ceiling = acc.get((DATASET, "maj", 0))
    run_cells, _ = load_cells([out])
    markdown = render([with_legend(t) for t in sweep_tables(run_cells)], "md")
    says = verdict(table, questions)
    spread = {cell: distinct(rows, cell[0]) for cell, rows in by_cell.items()}
    def pct(x):
        return "–" if x is None else f"{100 * x:.1f} %"
    def per_level(method):
        return ", ".join(f"{config_label(c, n)} {spread[(method, c)]:.1f}" for c in corrupt)
    lines = [
        f"# MAJ vs RRMaj under the strong injection (N={n})\n",
        f"{questions} generated one-step sums ({DATASET}, seed {seed}) on {model_name}; "
        f"RRMaj: M={m} trajectories, K={k}, L={max_len}, speaking order {order}; MAJ answers up to {max_len} "
        f"tokens; temperature {temperature}, every request seeded.\n",
        markdown,
        says + "\n",
        f"No adversary (0c{n}t), the reference the corrupted levels are read against (not a bound: with "
        f"{questions} questions a level's interval is wide, and a method may score higher under corruption): "
        f"MAJ {pct(ceiling)}, RRMaj {pct(acc.get((DATASET, 'rrmaj', 0)))}; one clean agent alone {pct(single)}.\n",
        f"Distinct trajectories per question (RRMaj, of M={m}): {per_level('rrmaj')}. "
        f"Distinct replies per question (MAJ, of N={n}): {per_level('maj')}.\n",
        f"{len(jobs)} instances in {seconds:.0f} s (model load included); engine: prefill {engine['prefill_tokens']} "
        f"tokens, decode {engine['decode_tokens']} tokens, {engine['cached_tokens']} from the prefix cache, "
        f"batch of up to {engine['max_batch_seqs']} sequences.\n",
        f"Each configuration's run directory ({', '.join(cell_name(meth, c, n) for meth, c in cells[:2])}, ...) "
        f"holds results.jsonl and summary.json: `byzantium report {out}` and `byzantium plot {out}` read them.\n",
    ]
    text = "\n".join(lines)
    (out / "summary.md").write_text(text)
    plot_sweep(table, out / "sweep.png", single)
    print("\n" + text)
    print(f"written: {out / 'summary.md'}, {out / 'sweep.png'}, and one run directory per configuration in {out}")
    return dict(table=table, ceiling=ceiling, single_clean_agent=single, distinct=spread, verdict=says,
                seconds=seconds, engine=engine, markdown=markdown)


def write_cell(path, method, c, rows, llms, n, k, m, max_len, temperature, seed, order, model_name, seconds):
    """One configuration's run directory, as `byzantium maj|rrmaj` writes it. Its summary has no engine
    counters: every configuration ran in one batch, so they are the demo's (in summary.md), not its own."""
    path.mkdir(parents=True, exist_ok=True)
    with open(path / RESULTS, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    config = settings(method, n, c, k, m if method == "rrmaj" else None, max_len, "strong", temperature, seed,
                      config=dict(models=[model_name] * n, backend="native", task=DATASET, data=None), order=order)
    summary = {key: value for key, value in summarize(method, rows, llms).items() if key != "engine"}
    summary.update(config=config, instances=len(rows), errors=0, failed=[], total=len(rows), complete=True,
                   seconds=seconds, shared_batch="every configuration of the demo ran in one batch: seconds and "
                                                 "engine counters are the whole demo's (summary.md)")
    write_summary(path, summary)


def add_demo_args(ap):
    ap.add_argument("--questions", type=int, default=DEMO_QUESTIONS, help=f"generated sums (default {DEMO_QUESTIONS})")
    ap.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")


def cmd_demo(args):
    run_demo(questions=args.questions, out=args.out, progress=not args.no_progress)


COMMAND = Command("demo", "MAJ vs RRMaj across the corruption sweep on the embedded model (a few minutes)",
                  add_demo_args, cmd_demo)


__all__ = ["run_demo", "plot_sweep", "verdict", "write_cell"]
