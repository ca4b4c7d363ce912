"""`byzantium profile run <method> ...`: an experiment run (the same flags as `byzantium run`) with its
engines profiling, then where the time went.

Profiling on, a step that holds both prefill and decode rows runs them as two separately timed forward
passes (the same outputs), so the stats split its time by measurement (engine/stats.py says the rules).
Written to the run's out dir, one set per model loaded (a second model's files end in -2, ...):

    profile.json      the engine (describe()), the summary, the table by tag, every step record
    trace.json        a Chrome trace (Perfetto, chrome://tracing): steps, prefill and decode tracks,
                      tags as categories, counters of sequences and KV blocks, requests as flows
    profile.png       time per step stacked by prefill/decode; batch size and KV occupancy beneath
    torch_trace.json  with --torch-profiler: torch.profiler over a few steps (ops and kernels)

and printed: the engine, and per tag and phase the tokens, seconds, tokens/s and share of the run.
"""
from contextlib import nullcontext
from pathlib import Path

from ..commands import Command
from .resilience_command import prepare_resilience
from .run_command import add_run_methods


def add_profile_args(ap):
    ap.add_argument("--torch-profiler", action="store_true",
                    help="also record a torch.profiler trace of a few steps (torch_trace.json)")
    ap.add_argument("--torch-profiler-steps", type=int, default=5, metavar="N",
                    help="steps the torch profiler records, after 3 warm-up steps (default 5)")


class TorchSteps:
    """torch.profiler over `count` steps of an engine after `skip` warm-up steps. It wraps the engine's
    step (an instance attribute, removed by finish) because the steps run in the async engine's thread."""

    def __init__(self, engine, count=5, skip=3):
        self.engine, self.count, self.skip = engine, count, skip
        self.seen, self.prof, self.recorded, self._step = 0, None, 0, engine.step
        engine.step = self

    def __call__(self):
        import torch
        self.seen += 1
        if self.seen == self.skip + 1 and self.count > 0:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.engine.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.prof = torch.profiler.profile(activities=activities, record_shapes=True)
            self.prof.start()
        recording = self.prof is not None and self.recorded < self.count
        try:
            with torch.profiler.record_function(f"byzantium step {self.seen}") if recording else nullcontext():
                return self._step()
        finally:
            if recording:
                self.recorded += 1
                if self.recorded == self.count:
                    self.prof.stop()  # in the thread that started it

    def finish(self, path):
        """Stop (if the run ended first), write the trace; returns the path or None (no step recorded)."""
        self.engine.__dict__.pop("step", None)
        if self.prof is None:
            return None
        if self.recorded < self.count:
            self.prof.stop()
        self.prof.export_chrome_trace(str(path))
        return path


class ProfiledPool:
    """The run's LLMPool with profile=True for every engine it loads; it keeps them after close."""

    def __init__(self, backend, torch_steps=0, **kwargs):
        from .. import backends
        if backend != "native":
            raise ValueError(f"byzantium profile needs --backend native: the {backend} backend keeps no step records")
        self.pool = backends.LLMPool(backend, profile=True, **kwargs)
        self.torch_steps, self.loaded, self.torch = torch_steps, [], {}

    def plan(self, models, shares=None):
        return self.pool.plan(models, shares)

    def get(self, model=None):
        llm = self.pool.get(model)
        if all(llm is not seen for seen in self.loaded):
            self.loaded.append(llm)
            if self.torch_steps:
                self.torch[id(llm)] = TorchSteps(llm.engine.engine, self.torch_steps)
        return llm

    def __getattr__(self, name):  # check, llms, close: the pool's own
        return getattr(self.pool, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.pool.close()


def describe(engine):
    return engine.describe() if hasattr(engine, "describe") else {"model": str(engine.model_dir)}


def format_table(stats):
    """Per tag and phase: tokens, seconds, tokens/s, share of the run; then each phase and the run."""
    s = stats.summary()
    head = f"{'tag':<12} {'phase':<8} {'rows':>7} {'tokens':>9} {'seconds':>9} {'tok/s':>10} {'share':>7}"
    lines = [head, "-" * len(head)]

    def line(tag, phase, rows, tokens, seconds, share):
        rate = f"{tokens / seconds:10.1f}" if seconds else f"{'-':>10}"
        lines.append(f"{tag:<12} {phase:<8} {rows:>7} {tokens:>9} {seconds:9.3f} {rate} {100 * share:6.1f}%")

    for r in s["by_tag"]:
        tag = "-" if r["tag"] is None else str(r["tag"])[:12]
        line(tag, r["phase"], r["rows"], r["tokens"], r["seconds"], r["share"])
    lines.append("-" * len(head))
    for phase in ("prefill", "decode"):
        rows = sum(r["rows"] for r in s["by_tag"] if r["phase"] == phase)
        line("all", phase, rows, s[f"{phase}_tokens"], s[f"{phase}_seconds"],
             s[f"{phase}_seconds"] / s["seconds"] if s["seconds"] else 0.0)
    lines.append(f"{s['steps']} steps in {s['seconds']:.3f} s of forward steps; mixed steps split by: "
                 f"{s['attribution']}; {s['cached_tokens']} prompt tokens from the prefix cache")
    return "\n".join(lines)


def plot_profile(records, path, num_blocks=None, title=None):
    """Time per step stacked by prefill/decode, and beneath it the batch size and the KV occupancy."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r.step for r in records]
    prefill = [r.prefill_ns / 1e6 for r in records]
    decode = [r.decode_ns / 1e6 for r in records]
    fig, (top, mid, low) = plt.subplots(3, 1, sharex=True, figsize=(9, 6), gridspec_kw={"height_ratios": [3, 1, 1]})
    top.fill_between(x, 0, prefill, step="mid", color="tab:blue", linewidth=0, label="prefill")
    top.fill_between(x, prefill, [p + d for p, d in zip(prefill, decode)], step="mid", color="tab:orange",
                     linewidth=0, label="decode")
    top.set_ylabel("ms per step")
    top.legend(loc="upper right")
    top.set_title(title or "engine steps")
    mid.step(x, [r.num_seqs for r in records], where="mid", color="tab:green")
    mid.set_ylabel("sequences")
    low.step(x, [r.kv_blocks_used for r in records], where="mid", color="tab:purple")
    low.set_ylabel("KV blocks used" + (f"\n(of {num_blocks})" if num_blocks else ""))
    low.set_xlabel("step")
    for ax in (top, mid, low):
        ax.set_ylim(0, ax.get_ylim()[1] * 1.15)  # a flat line stays off the frame
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_profile(llm, out, suffix="", torch_steps=None):
    """One model's profile files in OUT; returns {"model", "engine", "summary", "files", "table"}."""
    engine = llm.engine.engine  # NativeLLM -> AsyncEngine -> Engine
    stats, info = engine.step_records, describe(engine)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {"profile": out / f"profile{suffix}.json", "trace": out / f"trace{suffix}.json",
             "plot": out / f"profile{suffix}.png"}
    stats.to_json(files["profile"], engine=info)
    stats.to_chrome_trace(files["trace"], name=str(getattr(llm, "name", "engine")), metadata=info)
    rule = stats.attribution()
    plot_profile(stats.records, files["plot"], getattr(engine, "num_blocks", None),
                 f"{Path(str(llm.name)).name}: {len(stats.records)} steps; "
                 + (f"mixed steps split by {rule}" if any(stats.rules.values()) else "no mixed steps"))
    if torch_steps is not None and torch_steps.finish(out / f"torch_trace{suffix}.json"):
        files["torch_trace"] = out / f"torch_trace{suffix}.json"
    return {"model": llm.name, "engine": info, "summary": stats.summary(), "files": files,
            "table": format_table(stats)}


def run_out_dir(args):
    """Where `byzantium run` writes this run (its --out, or the method's default)."""
    if args.out is not None:
        return Path(args.out)
    if args.method == "resilience":
        return Path(prepare_resilience(args)[3])
    return Path(f"runs/{args.method}")


def profile_run(args):
    """`byzantium profile run ...`: the run with a ProfiledPool (args.pool, which the run commands use),
    then each model's profile written and printed."""
    if getattr(args, "backend", "native") != "native":
        raise ValueError(f"byzantium profile needs --backend native: the {args.backend} backend keeps no step records")
    if args.torch_profiler_steps < 1:
        raise ValueError(f"--torch-profiler-steps must be >= 1, got {args.torch_profiler_steps}")
    pools = []

    def pool(backend, **kwargs):
        pools.append(ProfiledPool(backend, args.torch_profiler_steps if args.torch_profiler else 0, **kwargs))
        return pools[-1]

    args.pool = pool
    try:
        args.run(args)
    finally:  # an interrupted run still gets the profile of what it ran
        loaded = [(p, llm) for p in pools for llm in p.loaded]
        out = run_out_dir(args) if loaded else None
        reports = [write_profile(llm, out, "" if i == 0 else f"-{i + 1}", p.torch.get(id(llm)))
                   for i, (p, llm) in enumerate(loaded)]
    if not loaded:
        print("byzantium profile: no model ran (every question was already done in the out dir?); "
              "profile into a fresh --out")
    for r in reports:
        print(f"\nprofile of {r['model']}\nengine: " + "; ".join(f"{k}: {v}" for k, v in r["engine"].items()))
        print(r["table"])
        print("written: " + ", ".join(str(f) for f in r["files"].values()))
    return reports


def add_profiled_run(profile):
    """`profile run <method> ...`: each method of `byzantium run` with its flags and the profiler's; the
    method's own command runs inside profile_run (args.run)."""
    profiled = profile.add_subparsers(dest="profiled", required=True, metavar="run")
    methods = add_run_methods(profiled.add_parser("run", help="the same flags as `byzantium run`"))
    for method in methods.values():
        add_profile_args(method)
        method.set_defaults(func=profile_run, run=method.get_default("func"))


COMMAND = Command("profile", "`profile run <method> ...`: a run with the engine profiling; profile.json, "
                             "trace.json, profile.png in its out dir", add_profiled_run)
