"""The diagnostics beside every number (protocols/metrics/diagnostics.py, report_diagnostics.py): a
scripted SAC and CP-WBFT run whose weak agent never states a readable answer, never writes a readable
score and never gives a confidence; the counts the report shows are those of the script's own call log,
and the cells past FLAG_SHARE carry the mark and the footnote."""
import asyncio
import json
from types import SimpleNamespace

import pytest

from byzantium.experiments import report_diagnostics as diag
from byzantium.experiments.report import build_report
from byzantium.experiments.sac import run_experiment
from byzantium.protocols import prompts
from byzantium.protocols.metrics.diagnostics import FLAG_SHARE, cell_diagnostics, filter_drops, on_adversary
from byzantium.tasks import Task
from byzantium.tasks import answers

TASKS = [Task("p1", "Which is right?", ["a", "b", "c", "d"], "C", "choice"),
         Task("p2", "Which is right now?", ["a", "b", "c", "d"], "D", "choice")]
ROUNDS = 2


class Scripted:
    """A clear reader (`clear`) or one whose every reply is unreadable: a solve without an answer, a
    refinement naming two options, a judgement without a score, a solve without a confidence."""
    stats = {}

    def __init__(self, name, clear):
        self.name, self.clear, self.calls = name, clear, []

    async def chat(self, messages, params=None, untrusted=False, tag=None):
        kind = "judge" if messages[0]["content"] == prompts.JUDGE_SYSTEM else \
            "refine" if any("reliability score" in m["content"] for m in messages) else "solve"
        self.calls.append(kind)
        await asyncio.sleep(0)
        if kind == "judge":
            return SimpleNamespace(text="Score: 0.9" if self.clear else "It looks fine to me.")
        if not self.clear:
            return SimpleNamespace(text="Hmm, hard to say." if kind == "solve" else "The answer is (C) or (D).")
        return SimpleNamespace(text="The answer is (C).\nConfidence: 0.8")


def run(protocol, tmp_path):
    strong, weak = Scripted("strong", True), Scripted("weak", False)
    out = tmp_path / protocol
    run_experiment(protocol, TASKS, strong, weak, n=5, weak=1, byzantine=1, F=2, T=ROUNDS, topology="complete",
                   out=str(out), progress=False, table=False, all_rounds=True)
    return out, strong, weak


def row(out, title, column, name):
    (table,) = [t for t in build_report([out]) if t.title == title]
    rows = [dict(zip(table.header, r)) for r in table.rows]
    return next(r for r in rows if r[column] == name), table


def test_sac_cell_counts_are_the_scripts(tmp_path):
    out, strong, weak = run("sac", tmp_path)
    d = json.loads((out / "summary.json").read_text())["diagnostics"]
    replies = [c for llm in (strong, weak) for c in llm.calls if c in ("solve", "refine")]
    judged = [c for llm in (strong, weak) for c in llm.calls if c == "judge"]
    if not hasattr(answers, "read_answer"):
        pytest.skip("the answer reader gives no status yet (read_answer)")
    assert d["answers"] == {"replies": len(replies), "unread": weak.calls.count("solve"),
                            "ambiguous": weak.calls.count("refine")}
    assert d["judge_scores"] == {"replies": len(judged), "unparsed": weak.calls.count("judge")}
    # every honest agent judges the adversary once a round: the filter had that many chances to drop it
    assert d["filter"]["adversary"][1] == len(TASKS) * ROUNDS * 4  # 4 honest agents
    r, table = row(out, "SAC / CP-WBFT", "cell", "sac")
    assert r["answers"] == (f"{weak.calls.count('solve')} unread, {weak.calls.count('refine')} ambiguous / "
                            f"{len(replies)}")
    share = weak.calls.count("judge") / len(judged)
    assert r["other replies unparsed"] == f"judge scores {weak.calls.count('judge')}/{len(judged)} ({100 * share:.0f} %)"
    assert share > FLAG_SHARE and r["RA"].endswith(f" {diag.MARK}") and r["IAA"].endswith(f" {diag.MARK}")
    assert any(n.startswith(diag.MARK) and "judge scores unparsed" in n for n in table.notes)
    cells, _ = row(out, "Cells", "cell", "sac")
    assert cells["answers"] == r["answers"] and cells["ours [95% CI]"].endswith(diag.MARK)


def test_cpwbft_missing_confidences_are_counted(tmp_path):
    out, strong, weak = run("cpwbft", tmp_path)
    d = json.loads((out / "summary.json").read_text())["diagnostics"]
    assert d["confidences"] == {"replies": len(strong.calls) + len(weak.calls), "unparsed": len(weak.calls)}
    assert "judge_scores" not in d and "filter" not in d


def test_filter_and_adversary_counts_on_a_hand_record():
    agents = [{"id": 0, "role": "strong"}, {"id": 1, "role": "strong"}, {"id": 2, "role": "weak"},
              {"id": 3, "role": "adversary"}]
    rnd = {"round": 1, "agents": [
        {"id": 0, "role": "strong", "answer": "7", "scores": {"1": 0.9, "2": 0.2, "3": 0.1}, "dropped": [3]},
        {"id": 1, "role": "strong", "answer": "5", "scores": {"0": 0.9, "2": 0.2, "3": 0.1}, "dropped": [2, 3]},
        {"id": 2, "role": "weak", "answer": None, "scores": {"0": 0.9, "1": 0.9, "3": 0.1}, "dropped": []},
        {"id": 3, "role": "adversary", "answer": "5", "sent": {"0": "5", "1": "5", "2": "5"}}]}
    record = {"protocol": "sac", "kind": "number", "gold": "7", "agents": agents, "rounds": [{"agents": []}, rnd]}
    assert filter_drops([record]) == {"strong": [0, 4], "weak": [1, 2], "adversary": [2, 3]}
    assert on_adversary([record]) == {"honest": 2, "on_adversary": 1}  # agent 1; the weak one read nothing


def test_an_old_run_without_diagnostics_shows_a_dash():
    from byzantium.experiments.report_cells import Cell
    old = Cell("old", "sac", {}, summary={"config": {}})
    assert diag.answers(old) == diag.other_replies(old) == diag.filter_drops(old) == "-"
    assert diag.mark("50.0 [1.0, 99.0] W", old) == "50.0 [1.0, 99.0] W" and diag.footnote([old]) is None
    assert cell_diagnostics("maj", [{"kind": "number", "agents": [{"text": "4"}, {"text": None}]}])["answers"] == \
        {"replies": 2, "unread": 1, "ambiguous": 0}
