"""Adversaries that target the defence (issue 36 item 1): SAC/CP-WBFT's judge-targeted and adaptive
adversaries, round-robin's trajectory-aware and logprob-guided corrupted agents. Each mechanism on a
scripted backend (what it sees, what it sends, what it chooses and why), the untrusted rendering of the
judge bait with the embedded model's tokenizer, then each end to end once on the embedded SmolLM2."""
import asyncio
import math
from types import SimpleNamespace

import pytest

from byzantium.backends.base import Completion
from byzantium.experiments.rr import check_config as rr_check_config
from byzantium.experiments.rr import run_rr_experiment
from byzantium.experiments.run_command import run_parser
from byzantium.experiments.sac import run_experiment
from byzantium.protocols import adaptive, prompts
from byzantium.protocols.attacks import injection, make_agents as rr_agents
from byzantium.protocols.byzantine import ADVERSARY_MODES, Adversary, Agent, make_agents
from byzantium.protocols.cpwbft import run_cpwbft
from byzantium.protocols.distractor import distractor
from byzantium.protocols.graphs import complete
from byzantium.protocols.round_robin import round_robin
from byzantium.protocols.rr_prompts import NOTHING_YET, agent_messages
from byzantium.protocols.sac import Scorer, run_sac
from byzantium.tasks import Task, get_task, is_correct

TASK = Task("t1", "Compute 6 * 7.", None, "42", "number")
CHOICE = Task("q", "Which one?", ["x", "y", "z"], "A", "choice")


# ------------------------------------------------------------------------------ SAC / CP-WBFT backend

class Judged:
    """Honest agents answer `answer`; a judge prompt scores the proposed answer's FIRST line by `scores`
    (default 0.5); CP-WBFT solves report confidence 0.9. Every chat is kept (kind, messages)."""
    name = "scripted"

    def __init__(self, answer="42", scores=None):
        self.answer, self.scores = answer, scores or {}
        self.calls, self.in_flight, self.max_in_flight = [], 0, 0

    async def chat(self, messages, params=None, untrusted=False, tag=None):
        judge = messages[0]["content"] == prompts.JUDGE_SYSTEM
        kind = "judge" if judge else "refine" if any("reliability score" in m["content"] for m in messages) \
            else "solve"
        self.calls.append((kind, messages))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        self.in_flight -= 1
        if judge:
            first = messages[2]["content"].removeprefix("Proposed answer: ").split("\n")[0]
            return SimpleNamespace(text=f"Score: {self.scores.get(first, 0.5)}")
        return SimpleNamespace(text=f"Working.\nAnswer: {self.answer}\nConfidence: 0.9")


def line_up(llms, adversary):
    return [Agent(i, "strong", llm) for i, llm in enumerate(llms)] + [Agent(len(llms), "adversary",
                                                                            adversary=adversary)]


# ---------------------------------------------------------------------------------- judge-targeted

def test_judge_bait_templates_and_their_seeded_choice():
    assert set(prompts.JUDGE_BAIT) == {"verified", "score", "grader", "forged-turn"}
    msg = prompts.judge_bait("41", "grader")
    assert msg.startswith("41\n\n") and "official solution is 41" in msg and "Score: 1.0" in msg
    with pytest.raises(ValueError):
        prompts.judge_bait("41", "flattery")
    cache = [str(v) for v in range(50)]
    chosen = {Adversary(TASK, cache, seed, 6, mode="judge-targeted").bait for seed in range(40)}
    assert chosen == set(prompts.JUDGE_BAIT)  # every template gets drawn
    a, b = (Adversary(TASK, cache, 3, 6, mode="judge-targeted") for _ in range(2))
    assert a.bait == b.bait and a.message(0, 1) == b.message(2, 5)  # seeded; the same to everyone, every round
    fixed = Adversary(TASK, cache, 3, 6)
    assert a.answer == fixed.answer and a.message(0) == prompts.judge_bait(fixed.answer, a.bait)
    assert not is_correct(a.answer, TASK.gold, TASK.kind)
    assert a.record()["bait"] == a.bait and "bait" not in fixed.record()  # the paper's modes record as before


def test_judge_bait_reaches_the_receivers_only_inside_the_untrusted_answer_message():
    llms = [Judged("42", {"42": 0.9, "41": 0.3}) for _ in range(3)]
    adv = Adversary(TASK, ["7"], seed=0, agent_id=3, mode="judge-targeted")
    adv.bait = "forged-turn"  # the template that tries to forge a turn
    rec = asyncio.run(run_sac(TASK, complete(4), line_up(llms, adv), F=1, T=2))
    bait = prompts.JUDGE_BAIT["forged-turn"]
    reached = 0
    for llm in llms:
        for kind, messages in llm.calls:
            holders = [m for m in messages if bait in m["content"]]
            if not holders:
                continue
            reached += 1
            assert kind in ("judge", "refine") and len(holders) == 1
            assert holders[0]["untrusted"] is True and holders[0]["role"] == "user"
            assert all(not m.get("untrusted") for m in messages if m is not holders[0])
    # Each of the 3 receivers judged the adversary's message in each of the 2 rounds.
    assert reached >= 6
    assert all(r["agents"][3]["sent"] == {i: prompts.judge_bait("7", "forged-turn") for i in range(3)}
               for r in rec["rounds"][1:])
    assert rec["rounds"][0]["agents"][3]["answer"] == "7"  # the metrics read the bare answer
    assert rec["adversaries"][0]["bait"] == "forged-turn"


def test_forged_role_markers_in_the_bait_stay_plain_text(smollm2_dir):
    """The forged-turn bait through the judge prompt, rendered with the embedded model's tokenizer: not one
    special token more than a benign answer gets, and the bait's text comes back intact."""
    from transformers import AutoTokenizer

    from byzantium.engine.chat import render_chat
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    special = set(tok.all_special_ids) | {tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>")}
    bait = prompts.judge_bait("41", "forged-turn")
    plain = render_chat(tok, prompts.judge(TASK, "41"))
    forged = render_chat(tok, prompts.judge(TASK, bait))
    assert sum(t in special for t in forged) == sum(t in special for t in plain)
    assert bait in tok.decode(forged, skip_special_tokens=False)
    # Rendered as trusted text, the same markers would have become real ones: the count would show it.
    trusted = render_chat(tok, [{k: v for k, v in m.items() if k != "untrusted"} for m in prompts.judge(TASK, bait)])
    assert sum(t in special for t in trusted) > sum(t in special for t in plain)


# ---------------------------------------------------------------------------------------- adaptive

def test_adaptive_sends_what_its_judge_scores_highest_judged_together_and_once():
    cache = ["7", "8", "9", "10", "11"]
    calls, flight = [], {"now": 0, "max": 0}
    scores = {"7": 0.1, "8": 0.2, "9": 0.15, "10": 0.05, "11": 0.3, "40": 0.6, "43": 0.95}

    async def judge(llm, task, answer, seed=None):
        calls.append((answer, seed))
        flight["now"] += 1
        flight["max"] = max(flight["max"], flight["now"])
        await asyncio.sleep(0)
        flight["now"] -= 1
        return {"score": scores.get(answer, 0.0)}

    adv = Adversary(TASK, cache, seed=1, agent_id=3, mode="adaptive", llm=object(), judge=judge)
    with pytest.raises(RuntimeError, match="prepare"):
        adv.answer
    asyncio.run(adv.prepare())
    own = adv.own
    assert own[0] == Adversary(TASK, cache, 1, 3).answer and distractor(TASK) in own  # fixed answer, distractor
    assert len(own) == len(set(own)) <= 5 and not any(is_correct(a, "42", "number") for a in own)
    assert [a for a, _ in calls] == own and flight["max"] == len(own)  # every own candidate, all at once
    assert adv.answer == max(own, key=lambda a: scores.get(a, 0.0))
    # Round 1: its neighbours hold 43 (wrong), 42 (right: never a candidate), nothing, and 43 again.
    calls.clear()
    asyncio.run(adv.observe(1, {0: "43", 1: "42", 2: None, 5: "43.0"}))
    assert [a for a, _ in calls] == ["43"]  # only the new candidate is judged; 43.0 is the same answer
    assert adv.answer == "43" and adv.message(0, 1) == adv.message(2, 1) == "43"
    assert adv.choices[-1] == {"round": 1, "candidates": own + ["43"], "chosen": "43"}
    record = adv.record()
    assert record["mode"] == "adaptive" and record["scores"]["43"] == 0.95 and len(record["choices"]) == 2


def test_adaptive_needs_a_model_and_the_modes_are_listed():
    assert ADVERSARY_MODES == ("fixed", "decoy", "equivocate", "judge-targeted", "adaptive")
    with pytest.raises(ValueError, match="needs a model"):
        Adversary(TASK, ["7"], mode="adaptive")
    strong, own, judge = Judged(), Judged(), Scorer("logprob")
    agents = make_agents(strong, n=4, weak=0, byzantine=1, task=TASK, cache=["7"], mode="adaptive",
                         adversary_llm=own, judge=judge)
    assert agents[3].adversary.llm is own and agents[3].adversary.judge is judge
    assert make_agents(strong, n=4, weak=0, byzantine=1, task=TASK, cache=["7"], mode="adaptive")[3].adversary.judge \
        is adaptive.yes_no_judge  # the default judge, on the strong model


def test_adaptive_in_sac_sees_last_rounds_answers_and_uses_the_receivers_judge():
    # Agent 0 answers 42, agents 1 and 2 answer 41 (wrong); the adversary's judge (the receivers' Scorer
    # on its own model) rates 41 above its own candidates, so from round 1 on it backs 41.
    honest = [Judged("42", {"42": 0.9, "41": 0.8}), Judged("41", {"41": 0.8}), Judged("41", {"41": 0.8})]
    own_model = Judged("0", {"41": 0.8, "7": 0.2})
    adv = Adversary(TASK, ["7"], seed=0, agent_id=3, mode="adaptive", llm=own_model, judge=Scorer("generate"))
    rec = asyncio.run(run_sac(TASK, complete(4), line_up(honest, adv), F=1, T=2))
    assert rec["rounds"][0]["agents"][3]["answer"] != "41"  # round 0: it had seen nobody
    for r in rec["rounds"][1:]:
        assert set(r["agents"][3]["sent"].values()) == {"41"}
    choices = rec["adversaries"][0]["choices"]
    assert [c["round"] for c in choices] == [0, 1, 2] and "41" in choices[1]["candidates"]
    # Its judgements are SAC's judge prompt with the candidate as the untrusted answer, on its own model.
    judged = [m[2]["content"] for k, m in own_model.calls if k == "judge"]
    assert "Proposed answer: 41" in judged and all(k == "judge" for k, _ in own_model.calls)
    assert judged.count("Proposed answer: 41") == 1  # judged once, kept for the later rounds


def test_adaptive_in_cpwbft_sees_the_rounds_solves_before_sending():
    honest = [Judged("42"), Judged("40"), Judged("40")]
    own_model = Judged("0", {"40": 0.7, "7": 0.1})
    adv = Adversary(TASK, ["7"], seed=0, agent_id=3, mode="adaptive", llm=own_model, judge=Scorer("generate"))
    rec = asyncio.run(run_cpwbft(TASK, complete(4), line_up(honest, adv), T=1))
    assert rec["rounds"][1]["agents"][3]["answer"] == "40"  # it backs the neighbours' wrong answer (conf 1.0)
    assert rec["adversaries"][0]["choices"][-1]["round"] == 1
    assert rec["rounds"][1]["agents"][0]["answer"] == "40"  # and captures agent 0 by mean confidence


# ------------------------------------------------------------------------------- round-robin backend

class Script:
    """Token ids are ints, printed as words "w<id>". A rendered prompt is one negative id indexing
    `self.prompts` (so a call's prompt can be read back). Sessions write tag*10000 + position; `generate`
    writes 800000 + 1000 * (its seed's index, in order of first use) + position. `score` gives the
    log-probability lp(candidate index) of the last generated candidate in the scored ids."""

    def __init__(self, lp=None):
        self.tokenizer = "script"
        self.prompts, self.seeds, self.log, self.sessions = [], {}, [], []
        self.in_flight, self.max_in_flight, self.words = 0, {}, {}
        self.lp = lp or (lambda c: 0.0)

    def render_chat(self, messages, untrusted=False, add_generation_prompt=True):
        self.prompts.append(messages)
        return [-len(self.prompts)]

    def messages(self, ids):
        return self.prompts[-ids[0] - 1]

    async def _busy(self, kind):
        self.in_flight += 1
        self.max_in_flight[kind] = max(self.max_in_flight.get(kind, 0), self.in_flight)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        self.in_flight -= 1

    async def open_session(self, messages):
        session = SimpleNamespace(prompt=messages, ids=[])
        self.sessions.append(session)
        return session

    async def extend(self, session, ids):
        session.ids += ids

    async def continue_(self, session, params, tag=None):
        self.log.append(("continue", session.prompt))
        out = [10000 + len(session.ids) + j for j in range(params.max_tokens)]
        session.ids += out
        return Completion(self.decode(out), out, "length", 0)

    async def close_session(self, session):
        pass

    async def generate(self, ids, params, tag=None):
        index = self.seeds.setdefault(params.seed, len(self.seeds))
        self.log.append(("generate", list(ids), index))
        await self._busy("generate")
        out = [800000 + 1000 * index + j for j in range(params.max_tokens)]
        return Completion(self.decode(out), out, "length", len(ids))

    async def score(self, ids, candidates, tag=None):
        self.log.append(("score", list(ids), list(candidates)))
        await self._busy("score")
        last = max(t for t in ids if t >= 800000)
        return {c: self.lp((last - 800000) // 1000) for c in candidates}

    def encode_plain(self, text):
        words = text.split()
        if words and all(w.startswith("w") and w[1:].isdigit() for w in words):
            return [int(w[1:]) for w in words]
        return [self.words.setdefault(text, 700000 + len(self.words))]

    def decode(self, ids):
        return "".join(f" w{t}" for t in ids)

    def same_tokenizer(self, other):
        return True


def test_trajectory_aware_prompt_quotes_the_honest_agents_last_tokens_and_continues_the_shared_text():
    llm = Script()
    agents = rr_agents(llm, corrupt=1, n=3)  # agent 0 corrupted
    traj = asyncio.run(round_robin(CHOICE, agents, k=3, max_len=15, order="fixed", attack_mode="trajectory"))
    assert [c.agent for c in traj.chunks] == [0, 1, 2, 0, 1]
    target = distractor(CHOICE)
    turns = [e for e in llm.log if e[0] == "generate"]
    assert len(turns) == 2 and len(llm.sessions) == 1  # the corrupted agent has no session; the honest share one
    # Turn 0: nothing to read yet. Turn 3: the honest chunks 1 and 2, verbatim, in an untrusted message.
    first, second = (llm.messages(ids) for _, ids, _ in turns)
    assert first[2]["content"] == NOTHING_YET
    assert second[2] == {"role": "user", "content": traj.chunks[1].text + traj.chunks[2].text, "untrusted": True}
    assert f"({target})" in second[0]["content"] and f"({target})" in second[3]["content"]
    assert all(not m.get("untrusted") for m in second if m is not second[2])
    # Its reply so far is the whole shared text, as token ids, after its prompt.
    assert turns[1][1][1:] == [t for c in traj.chunks[:3] for t in c.token_ids]
    assert traj.chunks[3].attack == {"mode": "trajectory", "read": [1, 2]}
    assert traj.chunks[0].attack == {"mode": "trajectory", "read": []} and traj.chunks[1].attack is None


def test_logprob_guided_keeps_the_continuation_with_the_highest_target_logprob():
    lp = {0: -3.0, 1: -0.5, 2: -2.0, 3: -1.0, 4: -1.5, 5: -4.0, 6: -0.2, 7: -0.9}  # candidate index -> log P
    llm = Script(lambda c: lp[c])
    agents = rr_agents(llm, corrupt=1, n=2)  # agent 0 corrupted, agent 1 honest
    traj = asyncio.run(round_robin(CHOICE, agents, k=2, max_len=8, order="fixed", attack_mode="logprob",
                                   candidates=4))
    bad = [c for c in traj.chunks if c.corrupted]
    assert len(bad) == 2
    # Turn 0 sampled candidates 0..3 and kept 1 (-0.5); turn 2 sampled 4..7 and kept 6 (-0.2).
    assert [c.attack["chosen"] for c in bad] == [1, 2]
    assert bad[0].token_ids == [801000, 801001] and bad[1].token_ids == [806000, 806001]
    assert bad[0].attack["scores"] == [-3.0, -0.5, -2.0, -1.0] and bad[1].attack["scores"] == [-1.5, -4.0, -0.2, -0.9]
    assert llm.max_in_flight == {"generate": 4, "score": 4}  # sampled together, scored together
    # Candidates are sampled under the injected prompt; the target is scored under an honest one, after the
    # shared text, the candidate and the answer probe.
    gens = [e for e in llm.log if e[0] == "generate"]
    assert all(llm.messages(ids) == agent_messages(CHOICE, injection(CHOICE)) for _, ids, _ in gens)
    scores = [e for e in llm.log if e[0] == "score"]
    probe, goal = llm.encode_plain(adaptive.PROBE["choice"]), llm.encode_plain(distractor(CHOICE))
    assert len(scores) == 8 and all(llm.messages(ids) == agent_messages(CHOICE) for _, ids, _ in scores)
    assert all(ids[-len(probe):] == probe and cand == goal for _, ids, cand in scores)
    shared = traj.chunks[0].token_ids + traj.chunks[1].token_ids
    last_turn = [ids for _, ids, _ in scores][4:]
    assert all(ids[1:1 + len(shared)] == shared for ids in last_turn)


def test_logprob_turn_scores_a_finishing_candidate_by_the_answer_it_states():
    from byzantium.backends import SamplingParams
    target = distractor(CHOICE)
    other = ({"B", "C"} - {target}).pop()  # wrong, but not the target

    class Ending(Script):
        async def generate(self, ids, params, tag=None):
            index = self.seeds.setdefault(params.seed, len(self.seeds))
            text = {0: f" so The answer is ({other}).", 1: f" so The answer is ({target})."}.get(index)
            if text is None:
                return await super().generate(ids, params, tag)
            return Completion(text, [900000 + index, 0], "stop", len(ids))

    llm = Ending(lambda c: -0.1)
    out, note = asyncio.run(adaptive.logprob_turn(llm, CHOICE, target, [-1], [-2], [], SamplingParams(max_tokens=4),
                                                  seeds=[11, 12, 13], room=10))
    assert note == {"scores": [None, 0.0, -0.1], "chosen": 1} and out.finish_reason == "stop"


def test_attack_modes_are_checked_and_maj_has_none():
    rr_check_config("rrmaj", 5, 3, 8, 5, 32, "strong", 0.7, attack_mode="logprob")
    for bad, match in ((dict(attack_mode="sneaky"), "--attack-mode"), (dict(candidates=0), "--candidates")):
        with pytest.raises(ValueError, match=match):
            rr_check_config("rrmaj", 5, 3, 8, 5, 32, "strong", 0.7, **bad)
    with pytest.raises(ValueError, match="MAJ"):
        rr_check_config("maj", 5, 3, 8, None, 32, "strong", 0.7, attack_mode="trajectory")
    args = run_parser().parse_args(["run", "rrmaj", "--attack-mode", "logprob", "--candidates", "3"])
    assert (args.attack_mode, args.candidates) == ("logprob", 3)
    assert run_parser().parse_args(["run", "rr"]).attack_mode == "inject"  # the paper's, by default
    with pytest.raises(SystemExit):
        run_parser().parse_args(["run", "maj", "--attack-mode", "trajectory"])
    args = run_parser().parse_args(["run", "sac", "--adversary", "judge-targeted"])
    assert args.adversary == "judge-targeted"
    assert run_parser().parse_args(["run", "cpwbft", "--adversary", "adaptive"]).adversary == "adaptive"
    with pytest.raises(ValueError):
        asyncio.run(round_robin(CHOICE, rr_agents(Script(), 1, 2), attack_mode="sneaky"))


# ------------------------------------------------------------------------- end to end, embedded model

@pytest.fixture(scope="module")
def native(smollm2_dir):
    from byzantium.backends import load_llm
    llm = load_llm(smollm2_dir, backend="native", num_blocks=512)
    yield llm
    llm.close()


def _sac(protocol, adversary, llm, out):
    from byzantium.backends import SamplingParams
    tasks = get_task("gen-sum", 2, seed=0)
    return run_experiment(protocol, tasks, llm, n=4, weak=0, byzantine=1, adversary=adversary, F=1, T=1,
                          topology="complete", score_mode="logprob", out=out, progress=False, table=False,
                          solve_params=SamplingParams(max_tokens=24, temperature=0.1), concurrency=2)


def _records(out):
    import json
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_sac_judge_targeted_end_to_end(native, tmp_path):
    summary = _sac("sac", "judge-targeted", native, tmp_path)
    assert summary["instances"] == 2 and summary["config"]["adversary"] == "judge-targeted"
    for r in _records(tmp_path):
        (adv,) = r["adversaries"]
        sent = set(r["rounds"][1]["agents"][3]["sent"].values())
        assert sent == {prompts.judge_bait(adv["answer"], adv["bait"])}
        assert not is_correct(adv["answer"], r["gold"], r["kind"])
        assert all(0.0 <= s <= 1.0 for a in r["rounds"][1]["agents"][:3] for s in a["scores"].values())
    assert summary["BFTI"] is not None and summary["H-Majority"] is not None


@pytest.mark.parametrize("protocol", ["sac", "cpwbft"])
def test_adaptive_end_to_end(native, tmp_path, protocol):
    summary = _sac(protocol, "adaptive", native, tmp_path)
    assert summary["instances"] == 2 and summary["config"]["score_mode"] == "logprob"
    for r in _records(tmp_path):
        (adv,) = r["adversaries"]
        assert [c["round"] for c in adv["choices"]] == [0, 1]
        for choice in adv["choices"]:  # the chosen candidate is the best-scored one of that round
            best = max(adv["scores"][c] for c in choice["candidates"])
            assert adv["scores"][choice["chosen"]] == best
            assert not is_correct(choice["chosen"], r["gold"], r["kind"])
        sent = r["rounds"][1]["agents"][3]["sent"] if protocol == "sac" else {0: r["rounds"][1]["agents"][3]["answer"]}
        assert set(sent.values()) == {adv["choices"][-1]["chosen"]}


@pytest.mark.parametrize("mode", ["trajectory", "logprob"])
def test_rr_attack_modes_end_to_end(native, tmp_path, mode):
    tasks = get_task("gen-track", 2, seed=0)
    summary = run_rr_experiment("rrmaj", tasks, native, corrupt=2, n=4, k=8, m=2, max_len=24, attack_mode=mode,
                                candidates=3, out=tmp_path, progress=False, table=False, concurrency=2)
    assert summary["instances"] == 2 and summary["config"]["attack_mode"] == mode
    assert ("candidates" in summary["config"]) == (mode == "logprob")
    notes = [c["attack"] for r in _records(tmp_path) for t in r["trajectories"] for c in t["chunks"] if c["corrupted"]]
    assert notes and all(n["mode"] == mode for n in notes)
    if mode == "logprob":
        for n in notes:
            scored = [s for s in n["scores"] if s is not None]
            assert len(n["scores"]) == 3 and (not scored or n["scores"][n["chosen"]] == max(scored))
    clean = [c for r in _records(tmp_path) for t in r["trajectories"] for c in t["chunks"] if not c["corrupted"]]
    assert all(c["attack"] is None for c in clean)
    assert math.isfinite(summary["accuracy"])


# ------------------------------------------------------------------------------------------ the report

def _sac_record(i, answers, gold="4"):
    """A SAC transcript of agents 0..2 honest and 3 adversarial: round 0 all wrong but agent 0, the last
    round `answers`."""
    agents = [{"id": j, "role": "strong" if j < 3 else "adversary"} for j in range(4)]
    first = [{"id": j, "answer": gold if j == 0 else "9"} for j in range(4)]
    return {"id": f"p{i}", "task_id": f"p{i}", "protocol": "sac", "kind": "number", "gold": gold, "seed": 0,
            "agents": agents, "rounds": [{"agents": first}, {"agents": [{"id": j, "answer": a} for j, a in
                                                                        enumerate(answers)]}]}


def test_report_groups_sac_by_adversary_and_the_corruption_sweep_by_attack_mode():
    from byzantium.experiments import report, report_data
    from byzantium.experiments.report_cells import Cell
    base = dict(task="gen-sum", agents=4, weak=0, byzantine=1, F=1, rounds=1, topology="complete")
    fixed = Cell("sac-fixed", "sac", dict(base, adversary="fixed"),
                 records=[_sac_record(i, ["4", "4", "4", "9"]) for i in range(2)])
    adaptive_ = Cell("sac-adaptive", "sac", dict(base, adversary="adaptive"),
                     records=[_sac_record(i, ["4", "9", "9", "9"]) for i in range(2)])
    (table,) = [t for t in [report.adversary_table([fixed, adaptive_])] if t]
    assert table.header == ["setting", "protocol", "topology", "metric", "fixed", "adaptive"]
    rows = {r[3]: r for r in table.rows}
    # fixed: IAA 1/4 -> FAA 3/4 (BFTI +50), honest plurality 4 (right); adaptive: FAA 1/4 (0), plurality 9.
    assert rows["BFTI"][4].startswith("+50.0") and rows["BFTI"][5].startswith("+0.0")
    assert rows["H-Majority"][4].startswith("100.0") and rows["H-Majority"][5].startswith("0.0")
    assert report.adversary_table([fixed]) is None  # one mode: nothing to compare

    def rr(name, method, c, right, **extra):
        params = dict(task="gen-sum", agents=5, corrupt=c, pattern=f"{c}c{5 - c}t", **extra)
        return Cell(name, method, params, records=[{"id": f"p{i}", "correct": i < right} for i in range(4)])
    cells = [rr("maj1", "maj", 1, 4), rr("maj3", "maj", 3, 1),
             rr("inj1", "rrmaj", 1, 4, chunk=8), rr("inj3", "rrmaj", 3, 3, chunk=8),
             rr("lp1", "rrmaj", 1, 3, chunk=8, attack_mode="logprob", candidates=4),
             rr("lp3", "rrmaj", 3, 2, chunk=8, attack_mode="logprob", candidates=4)]
    groups = report_data.corruption_sweep(cells)
    assert [g["label"] for g in groups] == ["gen-sum, attack mode=inject", "gen-sum, attack mode=logprob x4"]
    for g, rrmaj in zip(groups, (("inj1", "inj3"), ("lp1", "lp3"))):
        assert [c["maj"].name for c in g["columns"]] == ["maj1", "maj3"]  # one MAJ baseline for every mode
        assert [c["rrmaj"].name for c in g["columns"]] == list(rrmaj)
    assert groups[1]["columns"][1]["rrmaj_ci"][0] == 0.5 and groups[1]["columns"][1]["delta"][0] == 0.25
    (sweep,) = report.sweep_tables(cells)
    assert [r[0] for r in sweep.rows] == ["gen-sum, attack mode=inject"] * 3 + ["gen-sum, attack mode=logprob x4"] * 3
