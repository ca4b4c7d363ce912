"""How often a JSON-schema request gives an instance of its schema: schemas as users write them (no
additionalProperties, strings and lists without bounds), 20 prompts each at temperature 0 and 1, on the
embedded model (CPU). Reports the share of outputs that parse and validate (jsonschema), and how many
ended on their own ("stop") or were closed by their budget ("length"). Appends a dated entry to
bench/results/structured_validity.md.

    python bench/structured_validity.py [--max-tokens 256] [--prompts 20]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema

from byzantium import Engine, SamplingParams
from byzantium.engine.loader import resolve_model

sys.path.insert(0, str(Path(__file__).parent))
from grammar_mask import append_entry, cpu_model  # noqa: E402

SCHEMAS = {
    "person": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                                "hobbies": {"type": "array", "items": {"type": "string"}}},
               "required": ["name", "age", "hobbies"]},
    "answer": {"type": "object", "properties": {"answer": {"type": "string"}, "confidence": {"type": "number"}},
               "required": ["answer", "confidence"]},
    "city": {"type": "object", "properties": {
        "city": {"type": "string"}, "country": {"type": "string"}, "population": {"type": "integer"},
        "landmarks": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "year": {"type": "integer"}}, "required": ["name"]}}},
        "required": ["city", "country", "population"]},
}
TOPICS = ["a pirate", "a teacher", "a robot", "a farmer", "a dancer", "a chef", "a pilot", "a poet", "a nurse",
          "a painter", "Paris", "Tokyo", "the capital of France", "2+2", "why the sky is blue", "a sailor", "a judge",
          "a baker", "a miner", "a singer"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "structured_validity.md"))
    args = ap.parse_args()
    engine = Engine(resolve_model("smollm2-135m"), num_blocks=2048)
    topics = [TOPICS[i % len(TOPICS)] for i in range(args.prompts)]
    rows = []
    for name, schema in SCHEMAS.items():
        prompts = [engine.render_chat([{"role": "user", "content": f"Give {name} information about {t} as JSON."}])
                   for t in topics]
        for temperature in (0.0, 1.0):
            params = [SamplingParams(max_tokens=args.max_tokens, temperature=temperature, seed=i, json_schema=schema)
                      for i in range(len(prompts))]
            valid = stop = 0
            for out in engine.generate(prompts, params):
                stop += out.finish_reason == "stop"
                try:
                    jsonschema.validate(json.loads(out.text), schema)
                    valid += 1
                except (ValueError, jsonschema.ValidationError):
                    pass
            rows.append((name, temperature, valid, stop, len(prompts)))
            print(f"{name} T={temperature}: {valid}/{len(prompts)} valid, {stop} ended on their own", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"\n## {datetime.date.today().isoformat()}\n",
             f"Command: `.venv/bin/python bench/structured_validity.py --max-tokens {args.max_tokens} --prompts "
             f"{args.prompts}` (code at {commit}). CPU: {cpu_model()}, {os.cpu_count()} cores. Embedded "
             "SmolLM2-135M.\n",
             "| schema | temperature | valid instances | ended on their own (stop) | closed by the budget (length) |",
             "|---|---|---|---|---|"]
    lines += [f"| {n} | {t} | {v}/{k} | {s} | {k - s} |" for n, t, v, s, k in rows]
    append_entry(Path(args.out), lines, "# Structured outputs: how often an answer is an instance of its schema\n\n"
                 "`bench/structured_validity.py`: schemas as users write them, on the embedded model.\n")

if __name__ == "__main__":
    main()
