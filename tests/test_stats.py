"""The engine's step accounting (engine/stats.py) on records built by hand: exact splits, the three
rules for mixed steps, rates from attributed seconds, the by-tag table and the Chrome trace."""
import json

import pytest

from byzantium.engine.stats import EngineStats, split

MS = 1e-3


def step(stats, seconds, prefill=(), decode=(), phase_seconds=None, kv=3, cached=0, hits=0):
    """One record: prefill = [(tag, tokens)], decode = [tag, ...] (one token each)."""
    rows = [(tag, "prefill", n) for tag, n in prefill] + [(tag, "decode", 1) for tag in decode]
    stats.record(stats.origin + len(stats.records), seconds, rows, len(rows), kv, cached, hits, phase_seconds)
    return stats.records[-1]


def check_exact(stats):
    """Every record splits exactly, by phase and by tag, and the records sum exactly to the totals."""
    t = stats.totals
    for r in stats.records:
        assert r.prefill_ns + r.decode_ns == r.ns
        for phase in ("prefill", "decode"):
            assert sum(x[4] for x in r.tags if x[1] == phase) == getattr(r, f"{phase}_ns")
            assert sum(x[3] for x in r.tags if x[1] == phase) == getattr(r, f"{phase}_tokens")
    for key in ("ns", "prefill_ns", "decode_ns", "prefill_tokens", "decode_tokens", "cached_tokens", "cache_hits"):
        assert sum(getattr(r, key) for r in stats.records) == t[key], key
    assert t["prefill_ns"] + t["decode_ns"] == t["ns"]
    assert sum(x[2] for x in stats.by_tag.values()) == t["ns"]
    assert t["steps"] == len(stats.records)


def test_split_is_exact_and_proportional():
    assert split(10, [1, 1, 1]) == [3, 3, 4]
    assert split(1_000_000_007, [3, 0, 5, 2]) == [300_000_002, 0, 500_000_003, 200_000_002]
    assert split(0, [2, 3]) == [0, 0] and split(5, [0, 0]) == [0, 0]


def test_pure_steps_take_their_whole_time():
    stats = EngineStats()
    r = step(stats, 30 * MS, prefill=[("solve", 100)])
    assert (r.phase, r.attribution, r.prefill_ns, r.decode_ns) == ("prefill", "pure", 30_000_000, 0)
    r = step(stats, 10 * MS, decode=["solve"] * 4, phase_seconds={"prefill": 0.0, "decode": 0.009})
    assert (r.phase, r.attribution, r.prefill_ns, r.decode_ns) == ("decode", "pure", 0, 10_000_000)
    assert stats.attribution() == "none (no mixed steps)"
    check_exact(stats)


def test_measured_passes_split_the_step_in_their_ratio():
    stats = EngineStats()
    r = step(stats, 50 * MS, prefill=[("turn", 40)], decode=["turn"] * 4,
             phase_seconds={"prefill": 0.03, "decode": 0.01})
    assert (r.phase, r.attribution) == ("mixed", "measured")
    assert (r.prefill_ns, r.decode_ns) == (37_500_000, 12_500_000)
    assert stats.summary()["attribution"] == "measured"
    check_exact(stats)


def test_without_pure_steps_a_fused_step_is_split_by_token_share():
    stats = EngineStats()
    r = step(stats, 40 * MS, prefill=[("a", 30)], decode=["b"] * 10)
    assert r.attribution == "token share" and (r.prefill_ns, r.decode_ns) == (30_000_000, 10_000_000)
    check_exact(stats)


def cost(p, d):  # the synthetic engine: 10 ms a step, 1 ms a prefill token, 2 ms a decode row
    return (10 + p + 2 * d) * MS


def test_fused_steps_follow_the_cost_model_fitted_on_pure_steps():
    stats = EngineStats()
    for p in (10, 20, 40):
        step(stats, cost(p, 0), prefill=[("solve", p)])
    for d in (2, 4, 8):
        step(stats, cost(0, d), decode=["solve"] * d)
    r = step(stats, cost(20, 5), prefill=[("refine", 20)], decode=["solve"] * 5)
    # Each phase as a pass of its own: a + b*P = 30 ms, a + c*D = 20 ms. Token share would say 20 : 5.
    assert r.attribution == "model"
    assert r.prefill_ns == pytest.approx(40e6 * 3 / 5, abs=2) and r.decode_ns == pytest.approx(40e6 * 2 / 5, abs=2)
    assert stats.summary()["mixed_steps"] == {"measured": 0, "model": 1, "token share": 0}
    check_exact(stats)


def test_the_model_needs_spread_in_its_pure_steps():
    stats = EngineStats()
    for _ in range(3):  # always the same sizes: a + b*P and a + c*D cannot be told apart
        step(stats, cost(16, 0), prefill=[("x", 16)])
        step(stats, cost(0, 4), decode=["x"] * 4)
    assert step(stats, cost(16, 4), prefill=[("x", 16)], decode=["x"] * 4).attribution == "token share"
    check_exact(stats)


def test_decode_rate_counts_the_decode_time_of_mixed_steps():
    # The old accounting divided every decode token by the seconds of pure decode steps only: here
    # 8 tokens / 10 ms = 800 tok/s, although the decode rows of the mixed step cost 10 ms more.
    stats = EngineStats()
    step(stats, 10 * MS, decode=["t"] * 4)
    step(stats, 60 * MS, prefill=[("t", 200)], decode=["t"] * 4, phase_seconds={"prefill": 0.05, "decode": 0.01})
    s = stats.summary()
    assert s["decode_tokens"] == 8 and s["decode_seconds"] == pytest.approx(0.02)
    assert s["decode_tok_per_s"] == pytest.approx(400)
    assert s["prefill_tok_per_s"] == pytest.approx(200 / 0.05)
    assert s["seconds"] == pytest.approx(0.07)
    check_exact(stats)


def test_tags_break_down_each_phase_by_their_rows_tokens():
    stats = EngineStats()
    r = step(stats, 100 * MS, prefill=[("score", 30), ("refine", 10), ("score", 20)], decode=["solve", "refine"],
             phase_seconds={"prefill": 0.06, "decode": 0.02})
    assert (r.prefill_ns, r.decode_ns) == (75_000_000, 25_000_000)
    got = {(t[0], t[1]): t[2:] for t in r.tags}
    assert got == {("score", "prefill"): [2, 50, 62_500_000], ("refine", "prefill"): [1, 10, 12_500_000],
                   ("solve", "decode"): [1, 1, 12_500_000], ("refine", "decode"): [1, 1, 12_500_000]}
    step(stats, 100 * MS, decode=[None] * 4)
    table = {(row["tag"], row["phase"]): row for row in stats.summary()["by_tag"]}
    assert table["score", "prefill"]["tokens"] == 50 and table["score", "prefill"]["share"] == pytest.approx(0.3125)
    assert table["score", "prefill"]["tok_per_s"] == pytest.approx(50 / 0.0625)
    assert table[None, "decode"]["rows"] == 4 and table[None, "decode"]["share"] == pytest.approx(0.5)
    assert sum(row["share"] for row in table.values()) == pytest.approx(1.0)
    check_exact(stats)


def test_a_long_mixed_run_sums_exactly(tmp_path):
    stats = EngineStats()
    for i in range(300):  # all three rules, awkward times (not whole ns), several tags
        p, d = (1 + (i * 37) % 90) * (i % 6 != 1), (1 + (i * 11) % 7) * (i % 6 != 0)  # pure: i % 6 < 2
        measured = {"prefill": 0.001 * (1 + i % 4) / 3, "decode": 0.0007} if i % 2 else None
        step(stats, (p + 3 * d + 1.7) / 3e3, prefill=[("score" if i % 4 else "solve", p)] if p else (),
             decode=["turn"] * d, phase_seconds=measured, cached=i % 3, hits=i % 2)
    assert all(stats.rules.values())
    check_exact(stats)
    data = stats.to_json(tmp_path / "steps.json")
    assert json.loads((tmp_path / "steps.json").read_text())["summary"]["steps"] == 300
    assert sum(s["decode_tokens"] for s in data["steps"]) == data["summary"]["decode_tokens"]


def test_chrome_trace_has_step_prefill_and_decode_tracks_with_tags_inside(tmp_path):
    stats = EngineStats()
    step(stats, 20 * MS, prefill=[("solve", 64)])
    step(stats, 30 * MS, prefill=[("score", 30), ("refine", 10)], decode=["solve"] * 3,
         phase_seconds={"prefill": 0.02, "decode": 0.01}, kv=9)
    step(stats, 5 * MS, decode=["solve"] * 3, kv=10)
    stats.to_chrome_trace(tmp_path / "trace.json", metadata={"attention": "torch"})
    trace = json.loads((tmp_path / "trace.json").read_text())
    events = trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names == {0: "steps", 1: "prefill", 2: "decode"}
    slices = [e for e in events if e["ph"] == "X"]
    assert all({"name", "ts", "dur", "pid", "tid"} <= set(e) for e in slices)
    steps = [e for e in slices if e["tid"] == 0]
    assert [e["name"] for e in steps] == ["prefill", "mixed", "decode"]
    def ns(us):
        return round(us * 1000)
    for e in steps:  # the phase slices tile their step; the tag slices tile their phase
        inside = [x for x in slices if x["tid"] and x["cat"] in ("prefill", "decode")
                  and ns(e["ts"]) <= ns(x["ts"]) and ns(x["ts"]) + ns(x["dur"]) <= ns(e["ts"]) + ns(e["dur"])]
        assert sum(ns(x["dur"]) for x in inside) == ns(e["dur"])
        for phase in inside:
            tags = [x for x in slices if x["tid"] == phase["tid"] and x["cat"] not in ("prefill", "decode")
                    and ns(phase["ts"]) <= ns(x["ts"]) < ns(phase["ts"]) + ns(phase["dur"])]
            assert sum(ns(x["dur"]) for x in tags) == ns(phase["dur"])
            assert ns(tags[-1]["ts"]) + ns(tags[-1]["dur"]) == ns(phase["ts"]) + ns(phase["dur"])
    assert {x["cat"] for x in slices if x["tid"] == 1} == {"prefill", "solve", "score", "refine"}
    counters = [e for e in events if e["ph"] == "C"]
    assert [e["args"]["used"] for e in counters if e["name"] == "kv blocks"] == [3, 9, 10]
    assert trace["otherData"]["engine"] == {"attention": "torch"}


def test_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="phase"):
        EngineStats().record(0.0, 0.01, [("x", "mixed", 3)], 1, 0, 0, 0)
