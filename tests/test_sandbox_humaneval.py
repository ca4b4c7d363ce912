"""Every HumanEval canonical solution passes the sandboxed harness, and wrong ones fail (these two
need ../shared/data/HumanEval.jsonl.gz and skip without it); a completion that broke the host is a
failure counted in pass@1; what a reply from the solution's process can rebuild."""

import gzip
import json
import time
from pathlib import Path

import pytest

from byzantium.tasks.humaneval import check_humaneval, extract_code
from byzantium.tasks.value_crossing import Memo, describe, rebuild

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "HumanEval.jsonl.gz"


def _problems():
    if not DATA.exists():
        pytest.skip("no ../shared/data/HumanEval.jsonl.gz")
    with gzip.open(DATA, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_all_canonical_solutions_pass():
    problems = _problems()
    failed = [p["task_id"] for p in problems
              if not check_humaneval(p, p["canonical_solution"], timeout_s=10).passed]
    assert len(problems) == 164 and failed == []


def test_wrong_solutions_fail():
    # A body that returns None, and one that returns the first argument: wrong for these 20 problems.
    for p in _problems()[:20]:
        for body in ("    return None\n", "    return list(locals().values())[0]\n"):
            res = check_humaneval(p, body, timeout_s=10)
            assert res.status == "failed", (p["task_id"], body, res.stderr[-300:])


# ------------------------------------------------------------------------- pass@1 counts every completion

class _Coder:
    """Every agent answers a problem with the completion scripted for it."""
    name, stats = "scripted-coder", {}

    def __init__(self, answers):
        self.answers = answers  # the problem's prompt -> completion

    async def chat(self, messages, params=None, untrusted=False, tag=None):
        statement = messages[1]["content"]
        return type("Reply", (), {"text": next(a for p, a in self.answers.items() if p in statement)})()


def test_completions_that_broke_the_host_are_failures_counted_in_pass_at_1(tmp_path, monkeypatch):
    from byzantium.experiments.resilience import run_resilience_experiment
    from byzantium.tasks import resilience
    from byzantium.tasks.resilience import load_resilience_task

    tasks = load_resilience_task("gen-code", limit=6)
    hostile = ["    return " + " + ".join(["0"] * 3000) + "\n",  # RecursionError in a host's ast.parse
               "    if x == 1:\n        pass\n" + "    elif x == 2:\n        pass\n" * 3000 + "    return 0\n",
               "    return " + "-" * 100_000 + "0\n",  # MemoryError in a host's ast.parse
               "    return 0  # \ud800\n",  # UnicodeEncodeError writing a file
               "<think>" * 12_000 + "    return 0\n"]
    answers = {tasks[0].metadata["prompt"].strip(): tasks[0].gold}
    answers.update({t.metadata["prompt"].strip(): c for t, c in zip(tasks[1:], hostile)})
    start = time.monotonic()
    summary = run_resilience_experiment("self-collab", "gen-code", tasks, _Coder(answers), out=tmp_path / "a",
                                        progress=False, table=False)
    assert summary["errors"] == 0 and summary["instances"] == 6 and summary["pass@1"] == 1 / 6
    assert time.monotonic() - start < 60  # (12,000 unclosed <think> tags once took 19 s to strip)

    def broken(task, completion, **kwargs):  # whatever else goes wrong on the host for one completion
        raise RuntimeError("the host failed")
    monkeypatch.setattr(resilience, "check_humaneval", broken)
    summary = run_resilience_experiment("self-collab", "gen-code", tasks[:2], _Coder(answers), out=tmp_path / "b",
                                        progress=False, table=False)
    assert summary["errors"] == 0 and summary["instances"] == 2 and summary["pass@1"] == 0.0


def test_think_tags_and_definitions_are_found_in_linear_time():
    start = time.monotonic()
    assert extract_code("<think>" * 12_000 + "x", "f").endswith("x")
    assert extract_code("<think>a</think>def f():\n    <think>b</think>return 1\n", "f") == "def f():\n    return 1\n"
    assert extract_code("\n" * 200_000 + "x = 1", "f").endswith("x = 1")
    assert time.monotonic() - start < 2.0


# ---------------------------------------------------------------------- what a forged reply can rebuild

@pytest.mark.parametrize("tree", [
    ["sub", 0, "Any", ["opaque", 1, "Any", None, None]],  # a subclass of a class that is not a trusted one
    ["ndarray", 0, "|O8", [0], ["list", 1, []]],  # an array of objects
    ["ref", 5],  # an object never built
    ["list", 0, [["tuple", 1, [["ref", 1]]]]],  # a tuple that holds itself
    ["collections.defaultdict", 0, "eval", []],  # a factory that is not a plain type
    ["exec", 0, "print(1)"],
])
def test_a_forged_description_builds_nothing_but_trusted_values(tree):
    with pytest.raises(ValueError):
        rebuild(tree, {})


def test_descriptions_keep_types_items_and_identity():
    import collections
    import fractions
    shared = [1]
    value = {"gen": (i for i in range(2)), "dq": collections.deque([1], maxlen=3), "fr": fractions.Fraction(1, 3),
             "pt": collections.namedtuple("Point", "x y")(1, 2), "twice": [shared, shared]}
    back = rebuild(describe(value, Memo()), {})
    assert tuple(back["gen"]) == (0, 1) and back["dq"] == collections.deque([1], maxlen=3) and back["dq"].maxlen == 3
    assert back["fr"] == fractions.Fraction(1, 3) and back["fr"] != 1 / 3
    assert back["pt"] == (1, 2) and type(back["pt"]).__name__ == "Point" and type(back["pt"]).__module__ == "solution"
    assert back["twice"][0] is back["twice"][1]
