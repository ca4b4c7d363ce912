"""Analyses of MAJ / RRMaj results on hand-made records; expected numbers are computed here independently."""
import json
from dataclasses import asdict
from math import comb

import pytest
from scipy.stats import fisher_exact

from byzantium.protocols.round_robin import Chunk, RRMajResult, Trajectory
from byzantium.protocols.metrics.rr import (final_speaker, final_speaker_by_group, final_speaker_markdown,
                                             k_sweep_markdown, k_sweep_table, scaling_curve, scaling_markdown,
                                             sweep_markdown, sweep_table)
from byzantium.protocols.voting import AgentAnswer, MajResult, Vote


def traj(task_id, index, answer, correct, authors=((0, False),)):
    chunks = [Chunk(agent, bad, 3, "x", [1, 2, 3]) for agent, bad in authors]
    return Trajectory(task_id, index, "text", answer, correct, "stop", 3 * len(chunks), chunks)


def rrmaj(task_id, answers, gold="A"):
    """An RRMaj result whose trajectories answer `answers` (correct = equal to gold after normalising)."""
    trajs = [traj(task_id, j, a, a is not None and a.strip("()") == gold) for j, a in enumerate(answers)]
    return RRMajResult(task_id, None, False, Vote(None, {}, 0, False), trajs)


def maj(task_id, answers, corrupted):
    agents = [AgentAnswer(i, bad, "text", a, 5) for i, (a, bad) in enumerate(zip(answers, corrupted))]
    return MajResult(task_id, None, False, Vote(None, {}, 0, False), agents)


def as_json(results):
    return [json.loads(json.dumps(asdict(r))) for r in results]


def point(curve, m):
    return next(p for p in curve["points"] if p["m"] == m)


# ------------------------------------------------------------------------------------ bootstrap

def test_bootstrap_draws_without_replacement():
    # Pool of 10: 6 right (A), 4 wrong (B). A plurality of 5 is right iff >= 3 A were drawn (no ties).
    results = [rrmaj(f"q{i}", ["A"] * 6 + ["B"] * 4) for i in range(20)]
    curve = scaling_curve(results, "choice", ms=(5, 10), trials=500, seed=1)
    hyper = sum(comb(6, k) * comb(4, 5 - k) for k in (3, 4, 5)) / comb(10, 5)  # 186/252 = 0.738
    binom = sum(comb(5, k) * 0.6 ** k * 0.4 ** (5 - k) for k in (3, 4, 5))  # with replacement: 0.683
    assert abs(point(curve, 5)["mean"] - hyper) < 0.015
    assert abs(point(curve, 5)["mean"] - binom) > 0.04
    # M = M*: every trial draws the whole pool, A always wins.
    assert point(curve, 10) == dict(m=10, mean=1.0, std=0.0, trials=500)


def test_bootstrap_m1_converges_to_exact_baseline():
    results = [rrmaj(f"q{i}", ["A"] * 3 + ["B"] * 7) for i in range(20)]
    drawn = scaling_curve(results, "choice", ms=(1,), trials=400, seed=2, analytic_m1=False)
    exact = scaling_curve(results, "choice", ms=(1,), seed=2)
    assert point(exact, 1)["mean"] == pytest.approx(0.3) and point(exact, 1)["trials"] == 0
    assert abs(point(drawn, 1)["mean"] - 0.3) < 0.02
    assert point(drawn, 1)["std"] > 0


def test_maj_m1_weights_corrupted_and_clean_agents():
    # 4 corrupted agents (1 right), 1 clean agent (right).
    results = [maj("q", ["A", "B", "B", "B", "A"], [True, True, True, True, False])]
    golds = {"q": "A"}
    assert point(scaling_curve(results, "choice", ms=(1,), golds=golds), 1)["mean"] == pytest.approx(2 / 5)
    weighted = scaling_curve(results, "choice", ms=(1,), golds=golds, corrupt_share=0.5)
    assert point(weighted, 1)["mean"] == pytest.approx(0.5 * 1 / 4 + 0.5 * 1)
    with pytest.raises(ValueError, match="gold"):
        scaling_curve(results, "choice", ms=(1,))


def test_ties_are_drawn_per_trial_and_answers_normalised():
    # "(A)" and "A" are one answer: 2 A vs 1 B with M=3 always wins; A vs B with M=2 always ties.
    same = scaling_curve([rrmaj("q", ["(A)", "A", "B"])], "choice", ms=(3,), trials=5)
    assert point(same, 3)["mean"] == 1.0
    tied = scaling_curve([rrmaj(f"q{i}", ["A", "B"]) for i in range(10)], "choice", ms=(2,), trials=300, seed=3)
    assert abs(point(tied, 2)["mean"] - 0.5) < 0.03
    assert point(tied, 2)["std"] > 0  # the draw changes between trials


def test_abstentions_lose_and_large_m_is_skipped():
    curve = scaling_curve([rrmaj("q", [None, None, "A", "B", "B"])], "choice", ms=(1, 2, 5, 6, 40), trials=20)
    assert curve["skipped"] == [6, 40] and curve["pool"] == 5
    assert point(curve, 1)["mean"] == pytest.approx(1 / 5)
    assert point(curve, 5)["mean"] == 0.0  # B wins 2-1, abstentions do not count


def test_dicts_and_dataclasses_agree_and_seed_reproduces():
    results = [rrmaj(f"q{i}", ["A", "B", "C", "A", "B", "A", None][: 4 + i % 4]) for i in range(8)]
    a = scaling_curve(results, "choice", ms=(1, 3, 4), trials=30, seed=7)
    assert a == scaling_curve(as_json(results), "choice", ms=(1, 3, 4), trials=30, seed=7)
    assert a == scaling_curve(list(reversed(results)), "choice", ms=(1, 3, 4), trials=30, seed=7)
    assert a != scaling_curve(results, "choice", ms=(1, 3, 4), trials=30, seed=8)
    majs = [maj(f"q{i}", ["A", "B", "A", "C", "B"], [True, True, True, False, False]) for i in range(4)]
    golds = {f"q{i}": "B" for i in range(4)}
    b = scaling_curve(majs, "choice", ms=(1, 3), trials=30, seed=7, golds=golds)
    assert b == scaling_curve(as_json(majs), "choice", ms=(1, 3), trials=30, seed=7, golds=golds)
    # Golds override the trajectories' own flags: the same pools scored against "B".
    assert scaling_curve(results, "choice", ms=(1,), golds={f"q{i}": "B" for i in range(8)}) != a
    assert "M=3" in scaling_markdown({"RRMaj": a, "MAJ": b})


# ------------------------------------------------------------------------------------ final speaker

def test_final_speaker_table_and_fisher():
    clean, bad = ((0, False), (1, True), (2, False)), ((0, False), (1, True))
    trajs = ([traj("q", 0, "A", True, clean)] * 7 + [traj("q", 0, "B", False, clean)] * 2
             + [traj("q", 0, "A", True, bad)] * 2 + [traj("q", 0, "B", False, bad)] * 6
             + [traj("q", 0, None, False, ())])
    result = RRMajResult("q", None, False, Vote(None, {}, 0, False), trajs)
    s = final_speaker([result])
    assert s["table"] == [[7, 2], [2, 6]] and s["skipped"] == 1
    assert s["clean_accuracy"] == pytest.approx(7 / 9) and s["corrupt_accuracy"] == pytest.approx(2 / 8)
    odds, p = fisher_exact([[7, 2], [2, 6]])
    assert s["p_value"] == pytest.approx(p) and s["odds_ratio"] == pytest.approx(odds)
    # Two-sided p by hand: sum of hypergeometric tables (margins 9, 8; 9 right of 17) no likelier than observed.
    def prob(a):
        return comb(9, a) * comb(8, 9 - a) / comb(17, 9)
    hand = sum(prob(a) for a in range(1, 10) if prob(a) <= prob(7) * (1 + 1e-9))
    assert s["p_value"] == pytest.approx(hand)
    assert s["odds_ratio"] == pytest.approx(7 * 6 / (2 * 2))
    assert final_speaker(as_json([result])) == s
    assert final_speaker(trajs) == s  # bare trajectories too
    groups = final_speaker_by_group({"Track7 3c2t": [result]})
    assert "Track7 3c2t" in final_speaker_markdown(groups) and f"{p:.3g}" in final_speaker_markdown(groups)


def test_final_speaker_is_who_wrote_the_last_words():
    # Shuffled orders: the last chunk's recorded author decides, not turn mod N. A last turn that only
    # ended the text (end of sequence, no text) leaves the final words to the speaker before it.
    def spoken(order, texts, correct):
        n = len(order)
        chunks = [Chunk(order[j % n], order[j % n] < 2, 3, text, [1, 2, 3]) for j, text in enumerate(texts)]
        return Trajectory("q", 0, "".join(texts), "A", correct, "stop", 3 * len(texts), chunks, list(order))

    trajs = [spoken([3, 0, 1, 2, 4], ["a", "b", "c"], True),  # agent 1 (corrupted) wrote the last words
             spoken([2, 4, 0, 1, 3], ["a", "b", ""], True),  # agent 0 only stopped it: agent 4 (clean) is last
             spoken([1, 3, 0, 2, 4], ["a", " \n", ""], False),  # agent 1 (corrupted)
             spoken([4, 2, 1, 0, 3], ["", ""], False)]  # no words at all: skipped
    s = final_speaker(trajs)
    assert s["table"] == [[1, 0], [1, 1]] and s["skipped"] == 1
    assert s == final_speaker(as_json(trajs))


# ------------------------------------------------------------------------------------ tables

def test_sweep_table():
    rows = [dict(dataset="GSM8K", method="MAJ", c=c, n=3, accuracy=a) for c, a in enumerate([0.9, 0.8, 0.4, 0.1])]
    rows += [dict(dataset="GSM8K", method="RRMaj", c=c, n=3, accuracy=a) for c, a in enumerate([0.9, 0.85, 0.7, 0.2])]
    rows += [dict(dataset="GSM8K", method="MAJ", c=1, n=5, accuracy=0.0)]  # another N: ignored
    acc = {("AQuA", "maj", 2): 0.5, ("AQuA", "rrmaj", 2): 0.6, ("AQuA", "maj", 0): 0.7}
    t = sweep_table(rows + [dict(dataset=d, method=m, c=c, accuracy=a) for (d, m, c), a in acc.items()], n=3)
    assert t["columns"] == ["0c3t (no adversary)", "1c2t", "2c1t", "3c0t (all corrupted)"]
    by = {(r["dataset"], r["method"]): r["values"] for r in t["rows"]}
    assert by[("GSM8K", "MAJ")] == [0.9, 0.8, 0.4, 0.1]
    assert by[("GSM8K", "Δ")] == pytest.approx([0.0, 0.05, 0.3, 0.1])
    assert by[("AQuA", "Δ")][0] is None and by[("AQuA", "Δ")][2] == pytest.approx(0.1)
    assert by[("Average", "MAJ")] == pytest.approx([0.8, 0.8, 0.45, 0.1])
    assert by[("Average", "Δ")][2] == pytest.approx(0.2)
    md = sweep_markdown(t)
    assert "| GSM8K | Δ | +0.0 | +5.0 | +30.0 | +10.0 |" in md
    assert "| AQuA | RRMaj | – | – | 60.0 | – |" in md
    with pytest.raises(ValueError):
        sweep_table([dict(dataset="x", method="MAJ", c=4, accuracy=0.1)], n=3)


def test_k_sweep_table():
    t = k_sweep_table({("GSM8K", 100): 0.8, ("GSM8K", 10): 0.5, ("Logic3", 10): 0.7}, maj={"GSM8K": 0.6})
    assert t["ks"] == [10, 100]
    by = {r["dataset"]: r for r in t["rows"]}
    assert by["Logic3"]["values"] == [0.7, None] and by["Logic3"]["maj"] is None
    assert by["Average"]["values"] == pytest.approx([0.6, 0.8]) and by["Average"]["maj"] == pytest.approx(0.6)
    md = k_sweep_markdown(t)
    assert "| Dataset | K=10 | K=100 | MAJ |" in md and "| GSM8K | 50.0 | 80.0 | 60.0 |" in md
    rows = [dict(dataset="GSM8K", k=10, accuracy=0.5), dict(dataset="GSM8K", k=100, accuracy=0.8),
            dict(dataset="Logic3", k=10, accuracy=0.7)]
    assert k_sweep_table(rows, maj={"GSM8K": 0.6}) == t
    with pytest.raises(ValueError):
        k_sweep_table({("GSM8K", 0): 0.5})
