"""The whole generated answer corpus (tests/answer_corpus.py) through the answer readers, counted per group and
per form: right, wrong value, unread when the reply commits, read when it is ambiguous or commits to nothing.

    .venv/bin/python bench/answer_corpus.py                    # the readers of this checkout
    .venv/bin/python bench/answer_corpus.py --before 1bd1e4a   # the same corpus through an older revision's readers

--before checks REV out in a temporary `git worktree`, reads and judges every reply in a subprocess that imports
byzantium from there, and removes the worktree. The corpus is this checkout's generator either way (the same replies);
numbers and math answers are compared by the reading revision's own is_correct, so each count is what that revision
would score. A revision without read_answer / read_score / read_confidence is read through what it had: extract_answer
(None = unread), protocols.sac.parse_score ((value, parsed)) and protocols.cpwbft.find_confidence (None = missing);
it cannot report ambiguity.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_generator():
    """tests/answer_corpus.py, loaded by path (this file has the same module name)."""
    spec = importlib.util.spec_from_file_location("answer_corpus_generator", ROOT / "tests" / "answer_corpus.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def read_all(replies):
    """[(kind, text, choices)] -> [(status, value)] with the byzantium importable here."""
    from byzantium.tasks import answers
    if hasattr(answers, "read_answer"):
        def read(kind, text, choices):
            if kind == "score":
                got = answers.read_score(text)
            elif kind == "confidence":
                got = answers.read_confidence(text)
            else:
                got = answers.read_answer(text, kind, choices)
            return got.status, got.value
    else:
        from byzantium.protocols.cpwbft import find_confidence
        from byzantium.protocols.sac import parse_score

        def read(kind, text, choices):
            if kind == "score":
                value, parsed = parse_score(text)
                return ("read", value) if parsed else ("unread", None)
            value = find_confidence(text) if kind == "confidence" else answers.extract_answer(text, kind, choices)
            return ("unread", None) if value is None else ("read", value)
    return [read(kind, text, choices) for kind, text, choices in replies]


def evaluate(per_group, seed):
    """[(category, outcome)] of the whole corpus, read and judged with the byzantium importable here."""
    gen = load_generator()
    items = gen.corpus(per_group or gen.PER_GROUP, seed)
    readings = read_all([(item.kind, item.text, item.choices) for item in items])
    return [(item.category, gen.judge(item, status, value)) for item, (status, value) in zip(items, readings)]


def evaluate_at(rev, per_group, seed):
    """evaluate() in a subprocess that imports byzantium from a worktree of `rev`."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(tree), rev], check=True)
        try:
            command = [sys.executable, str(Path(__file__).resolve()), "--evaluate-in", str(tree), "--seed", str(seed)]
            if per_group:
                command += ["--per-group", str(per_group)]
            done = subprocess.run(command, env={**os.environ, "PYTHONPATH": str(tree)}, cwd=str(tree),
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"reading at {rev} failed:\n{done.stderr[-3000:]}")
            return [tuple(row) for row in json.loads(done.stdout)]
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)


def evaluate_in(tree, per_group, seed):
    """The subprocess side of evaluate_at: byzantium from the worktree, the outcomes as JSON on stdout."""
    sys.path.insert(0, tree)
    import byzantium
    if not Path(byzantium.__file__).resolve().is_relative_to(Path(tree).resolve()):
        raise SystemExit(f"byzantium was imported from {byzantium.__file__}, not from the worktree {tree}")
    json.dump(evaluate(per_group, seed), sys.stdout)


def count(outcomes):
    """{group: Counter(outcome)}, {category: Counter(outcome)}."""
    groups, forms = defaultdict(Counter), defaultdict(Counter)
    for category, outcome in outcomes:
        groups[category.split("/", 1)[0]][outcome] += 1
        forms[category][outcome] += 1
    return groups, forms


def table(title, rows, outcomes):
    lines = [f"| {title} | n | " + " | ".join(outcomes) + " |", "|---|---:|" + "---:|" * len(outcomes)]
    for name, counter in rows:
        n = sum(counter.values())
        lines.append(f"| {name} | {n} | " + " | ".join(str(counter[o]) for o in outcomes) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", metavar="REV", help="read with the answer readers of this git revision")
    parser.add_argument("--per-group", type=int, default=None, help="replies per group (default: the full corpus)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worst", type=int, default=10, help="list the forms with the most misreadings")
    parser.add_argument("--evaluate-in", metavar="TREE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.evaluate_in:
        return evaluate_in(args.evaluate_in, args.per_group, args.seed)

    sys.path.insert(0, str(ROOT))
    gen = load_generator()
    outcomes = (evaluate_at(args.before, args.per_group, args.seed) if args.before
                else evaluate(args.per_group, args.seed))
    groups, forms = count(outcomes)

    used = [o for o in gen.OUTCOMES if any(c[o] for c in groups.values())]
    print(f"answer corpus: {len(outcomes)} replies, seed {args.seed}, read by "
          f"{'revision ' + args.before if args.before else 'this checkout'}\n")
    total = sum(groups.values(), Counter())
    print(table("group", [(g, groups[g]) for g in gen.GROUPS] + [("all", total)], used))
    print()
    print(table("form", sorted(forms.items()), used))
    print()
    worst = sorted(forms.items(), key=lambda kv: (-(sum(kv[1].values()) - kv[1]["right"]), kv[0]))[:args.worst]
    print(f"forms with the most misreadings (of {sum(len(gen.categories(g)) for g in gen.GROUPS)}):")
    for name, counter in worst:
        n = sum(counter.values())
        misses = ", ".join(f"{o} {counter[o]}" for o in gen.OUTCOMES if o != "right" and counter[o])
        print(f"  {name}: {n - counter['right']} of {n} ({misses})")


if __name__ == "__main__":
    main()
