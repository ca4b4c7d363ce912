"""Every HumanEval canonical solution passes the sandboxed harness, and wrong ones fail.
Needs ../shared/data/HumanEval.jsonl.gz; skips without it (CI has no ../shared)."""

import gzip
import json
from pathlib import Path

import pytest

from byzantium.tasks.humaneval import check_humaneval

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
