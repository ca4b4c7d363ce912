"""What structured outputs cost a decode step: JSON-schema requests vs the same batch unconstrained.

The embedded model on the CPU, speculation off (one token per row a step, so steps compare). Each batch
size runs the same prompts twice, alternately, `--repeats` times: every request constrained by a JSON
schema (long enough that no request ends before --new tokens), then unconstrained (EOS ignored). Reported
per decode step: the grammar's own work, timed inside the engine (grammar.masks: llguidance's masks;
apply_bitmask: -inf where refused; advance: each matcher takes its token), and the whole step of each
run (best of the repeats). The first is the cost; the second difference is that cost plus the machine's
noise. --constraint json_object measures JSON mode instead (no schema; its grammar time includes the
closing that keeps it within max_tokens, engine/json_closing.py, shown apart as "of which closing", as it
is for a schema: engine/json_schema/). Appends a dated entry to
bench/results/grammar_mask.md.

    python bench/grammar_mask.py [--batches 1,32] [--new 48] [--repeats 2] [--constraint schema|json_object]
"""
import argparse
import datetime
import os
import platform
import subprocess
import time
from pathlib import Path

from byzantium import Engine, SamplingParams
from byzantium.engine import grammar
from byzantium.engine.sampling import append, cpu
from byzantium.engine.loader import resolve_model

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "summary": {"type": "string", "minLength": 400, "maxLength": 600},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 8},
    },
    "required": ["name", "age", "role", "summary", "tags"],
}
NAMES = {"schema": "JSON schema", "json_object": "JSON mode"}
CONSTRAINTS = {"schema": dict(json_schema=SCHEMA), "json_object": dict(json_object=True)}
TOPICS = ["a cat", "a city", "a book", "a car", "a planet", "a song", "a tree", "a river"]


class Timer:
    """Wraps the engine's grammar calls and adds up their time."""

    def __init__(self):
        self.seconds = 0.0
        self.calls = 0

    def wrap(self, module, name):
        inner = getattr(module, name)

        def timed(*args, **kwargs):
            self.calls += name == "masks"  # one call a sampling round: a step, with speculation off
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        setattr(module, name, timed)


def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run(engine, prompts, params, timer, closing):
    engine.reset_stats()
    timer.seconds, timer.calls, closing.seconds = 0.0, 0, 0.0
    outs = engine.generate(prompts, params)
    stats = engine.stats
    return dict(seconds=stats["decode_seconds"], tokens=stats["decode_tokens"], grammar=timer.seconds,
                closing=closing.seconds, rounds=timer.calls, lengths=[len(o.token_ids) for o in outs])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--constraint", choices=("schema", "json_object"), default="schema")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "grammar_mask.md"))
    args = ap.parse_args()
    if not grammar.available():
        raise SystemExit(grammar.INSTALL)
    engine = Engine(resolve_model("smollm2-135m"), num_blocks=1024, num_speculative_tokens=0)
    timer = Timer()
    for module, name in ((append, "masks"), (append, "advance"), (cpu, "apply_bitmask")):
        timer.wrap(module, name)
    closing = Timer()  # the part of masks that ends JSON within max_tokens
    closing.wrap(grammar.JsonCloser, "closing_tokens")
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        prompts = [engine.render_chat([{"role": "user", "content": f"Describe {TOPICS[i % len(TOPICS)]} (record {i}) "
                                        "as JSON."}]) for i in range(batch)]
        constrained = SamplingParams(max_tokens=args.new, **CONSTRAINTS[args.constraint])
        plain = SamplingParams(max_tokens=args.new, ignore_eos=True)
        engine.generate(prompts[:1], SamplingParams(max_tokens=4, **CONSTRAINTS[args.constraint]))  # compile, warm up
        best = {}
        for _ in range(args.repeats):
            for name, params in (("schema", constrained), ("plain", plain)):
                result = run(engine, prompts, params, timer, closing)
                if name not in best or result["seconds"] < best[name]["seconds"]:
                    best[name] = result
        s, p = best["schema"], best["plain"]
        steps = s["tokens"] / batch  # decode steps: one token per row each
        rows.append(dict(batch=batch, steps=round(steps), grammar_ms=1e3 * s["grammar"] / s["rounds"],
                         closing_ms=1e3 * s["closing"] / s["rounds"],
                         schema_ms=1e3 * s["seconds"] / steps, plain_ms=1e3 * p["seconds"] / (p["tokens"] / batch),
                         lengths=(min(s["lengths"]), max(s["lengths"]))))
        r = rows[-1]
        print(f"batch {batch}: grammar {r['grammar_ms']:.2f} ms/step ({r['closing_ms']:.2f} closing); step {r['schema_ms']:.1f} ms constrained vs "
              f"{r['plain_ms']:.1f} ms plain over {r['steps']} steps; constrained outputs {r['lengths']} tokens", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [f"\n## {datetime.date.today().isoformat()}\n",
             f"Command: `.venv/bin/python bench/grammar_mask.py --batches {args.batches} --new {args.new} --repeats "
             f"{args.repeats} --constraint {args.constraint}` (code at {commit}). CPU: {cpu_model()}, {os.cpu_count()} cores; load average "
             f"{load:.1f} at the end (other work on the machine inflates the step times, not the grammar's share "
             f"much). Embedded SmolLM2-135M, fp32, speculation off; vocabulary 49152.\n",
             f"| batch | decode steps | grammar ms / step | of which closing | step ms, {NAMES[args.constraint]} | "
             "step ms, unconstrained | grammar share of the constrained step |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['steps']} | {r['grammar_ms']:.2f} | {r['closing_ms']:.2f} | {r['schema_ms']:.1f} | "
                     f"{r['plain_ms']:.1f} | {100 * r['grammar_ms'] / r['schema_ms']:.1f}% |")
    append_entry(Path(args.out), lines, "# Grammar masks: the cost of structured outputs per decode step\n\n"
                 "`bench/grammar_mask.py`: JSON-schema requests vs the same batch unconstrained on the embedded "
                 "model, CPU. 'grammar' is the time inside the engine's grammar calls (llguidance's masks for "
                 "every constrained row, the -inf fill, the matchers taking the sampled tokens).\n")


def append_entry(out, lines, heading):
    """Append a dated entry's lines to a results file, which starts with `heading` when new."""
    if not out.exists():
        out.write_text(heading)
    with out.open("a") as f:
        f.write("\n".join(lines) + "\n")
    print(f"appended to {out}")


if __name__ == "__main__":
    main()
