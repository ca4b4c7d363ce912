"""Self-Anchored Consensus (SAC), Algorithm 1 of "Robust Multi-Agent LLMs under Byzantine Faults".

    round 0:   every honest agent i answers x_i and scores it with its own model: phi_i
    round t:   i scores every neighbour's current answer with its OWN model: s_ij   (receiver-side)
               L_i = {j : s_ij < phi_i}                                  (strictly below)
               D_i = the min(F, |L_i|) lowest-scored of L_i              (stable: ties keep neighbour order)
               K_i = N_i \\ D_i                                           (every neighbour not dropped)
               x_i <- refine(x_i, {(x_j, s_ij) : j in K_i})             (highest score first, 2 decimals)
               phi_i <- score_i(x_i)
    K_i is "the kept neighbours": neighbours scored at or above phi_i are kept too (the filter only
    removes; it never requires a neighbour to beat the agent). Empty K_i, or a refinement whose answer
    cannot be parsed: x_i stays, with no refine call. phi_i is re-scored at the end of every round, as
    Algorithm 1 line 7 does, whether or not x_i changed: at a temperature above 0 the same answer can
    score differently, and phi_i is the next round's filter threshold. rescore="changed" keeps the old
    shortcut (only a changed answer is re-scored; phi_i carries over otherwise), ours, not the paper's.

Only final answer strings travel between agents. Adversaries do not run the protocol; they send
`Adversary.message(receiver, t)` (a decoy first writes its answer, alongside round 0's solves). Within a
round the judgements of every agent are issued together, in one pass, and then every agent goes at its own
pace: it refines and re-scores as soon as its own judgements are in, not when every agent's are (what it
does depends on nothing else); the engine batches all of it with the calls of every other agent and instance
in flight. Every call is sampled with its own seed from (run seed, problem,
agent, round, purpose): "solve", "judge" (with the agent judged), "refine".
"""
import asyncio
import dataclasses
import math

from ..backends import SamplingParams
from ..tasks.answers import read_score
from . import prompts
from .byzantine import observe_adversaries, prepare_adversaries, seeded
from .plurality import stable_seed

SCORE_MODES = ("generate", "logprob")
RESCORE_MODES = ("always", "changed")  # the paper's: every round; ours: only a changed answer
LOGPROB_KINDS = ("yes", "digit")
SOLVE_PARAMS = SamplingParams(max_tokens=1000, temperature=prompts.TEMPERATURE)
JUDGE_PARAMS = SamplingParams(max_tokens=1000, temperature=prompts.TEMPERATURE)

def parse_score(text):
    """(score, parsed): the judge's last committed score (tasks.answers.read_score: "Score: 0.8", "a score
    of 0.8", "I rate it 0.7", 7/10 -> 0.7, 85% -> 0.85, clipped to [0, 1]); (0.5, False) when there is
    none. No fallback to other numbers: a judge cut off mid-working would otherwise be scored by a number
    from its working (the reference's "12" -> 1.0)."""
    reading = read_score(text)
    return (reading.value, True) if reading.read else (0.5, False)


def filter_neighbours(self_score, scores, F):
    """scores: [(neighbour, s)] in neighbour order. Returns (below, dropped, kept) as neighbour lists;
    kept is in neighbour order (the refine prompt sorts it by score)."""
    below = [(j, s) for j, s in scores if s < self_score]
    lowest = sorted(below, key=lambda js: js[1])  # sorted() is stable: ties keep neighbour order
    dropped = [j for j, _ in lowest[:min(F, len(below))]]
    kept = [j for j, _ in scores if j not in dropped]
    return [j for j, _ in below], dropped, kept


class Scorer:
    """score(llm, task, answer, seed=None) -> {"score", "parsed", "text"} with the agent's own model;
    seed: the judge request's sampling seed (generate mode)."""

    def __init__(self, mode="generate", params=None, logprob_kind="yes"):
        if mode not in SCORE_MODES:
            raise ValueError(f"score mode must be one of {SCORE_MODES}, got {mode!r}")
        if logprob_kind not in LOGPROB_KINDS:
            raise ValueError(f"logprob kind must be one of {LOGPROB_KINDS}, got {logprob_kind!r}")
        self.mode, self.params, self.logprob_kind = mode, params or JUDGE_PARAMS, logprob_kind

    async def __call__(self, llm, task, answer, seed=None):
        if self.mode == "generate":
            params = self.params if seed is None else dataclasses.replace(self.params, seed=seed)
            out = await llm.chat(prompts.judge(task, answer), params, tag="score")
            score, parsed = parse_score(out.text)
            return {"score": score, "parsed": parsed, "text": out.text}
        if self.logprob_kind == "yes":
            lp = await llm.score(prompts.judge_yes_no(task, answer), ["Yes", "No"], tag="score")
            yes, no = math.exp(lp["Yes"]), math.exp(lp["No"])
            return {"score": yes / (yes + no) if yes + no > 0 else 0.5, "parsed": yes + no > 0, "text": None}
        digits = [str(d) for d in range(10)]
        lp = await llm.score(prompts.judge_digit(task, answer), digits, tag="score")
        p = [math.exp(lp[d]) for d in digits]
        total = sum(p)
        value = sum(d * pd for d, pd in enumerate(p)) / total / 9 if total > 0 else 0.5
        return {"score": value, "parsed": total > 0, "text": None}


async def _safe(coro):
    """A scoring call that raised counts as score 0.0 (as the reference does), recorded as an error."""
    try:
        return await coro
    except Exception as e:  # noqa: BLE001 - any backend failure is a failed score, not a failed run
        return {"score": 0.0, "parsed": False, "text": None, "error": f"{type(e).__name__}: {e}"}


async def run_sac(task, graph, agents, F, T, score_mode="generate", solve_params=None, judge_params=None,
                  logprob_kind="yes", seed=0, lockstep=False, rescore="always"):
    """One problem instance. agents[i] sits on node i of `graph`. Returns the transcript record.
    seed: the run seed every request's sampling seed is derived from.
    rescore: "always" (the paper's: each honest agent re-scores its answer every round) or "changed"
    (only an answer the round changed is re-scored).
    lockstep: every phase of a round waits for the whole phase (all judgements, then all refinements, then
    all re-scores), the way the reference issues its calls; the same calls and the same record, later."""
    if sorted(graph.nodes) != list(range(len(agents))):
        raise ValueError(f"graph nodes must be 0..{len(agents) - 1}, one per agent")
    if any(graph.has_edge(i, i) for i in graph.nodes):
        raise ValueError("graph has a self-loop: an agent is not its own neighbour")
    if rescore not in RESCORE_MODES:
        raise ValueError(f"rescore must be one of {RESCORE_MODES}, got {rescore!r}")
    solve_params = solve_params or SOLVE_PARAMS
    scorer = Scorer(score_mode, judge_params, logprob_kind)
    honest = [a for a in agents if a.honest]
    nbrs = {a.id: sorted(graph.neighbors(a.id)) for a in agents}

    def judge(a, t, answer, j):
        """Agent a's judgement, in round t, of agent j's answer (j = a.id: its self-score)."""
        return _safe(scorer(a.llm, task, answer, stable_seed(seed, task.id, a.id, t, "judge", j)))

    # Round 0: answer, then self-score. Decoy adversaries write their answers alongside (one batch).
    outs, _ = await asyncio.gather(asyncio.gather(*(a.llm.chat(prompts.solve(task), seeded(
        solve_params, seed, task.id, a.id, 0, "solve"), tag="solve") for a in honest)), prepare_adversaries(agents))
    answer = {a.id: a.adversary.answer for a in agents if not a.honest}
    text = {}
    for a, out in zip(honest, outs):
        answer[a.id], text[a.id] = task.extract(out.text), out.text
    selfs = await asyncio.gather(*(judge(a, 0, answer[a.id], a.id) for a in honest))
    phi = {a.id: s["score"] for a, s in zip(honest, selfs)}
    rounds = [_round0(agents, answer, text, phi, dict(zip([a.id for a in honest], selfs)))]

    for t in range(1, T + 1):
        await observe_adversaries(agents, t, answer, nbrs)  # an adaptive adversary sees its neighbours' answers
        # What each agent receives this round: honest agents broadcast, adversaries may equivocate.
        def msg(j, i):
            return answer[j] if agents[j].honest else agents[j].adversary.message(i, t)
        phase_done = asyncio.Barrier(len(honest)) if lockstep else None
        # The round's n x degree judgements, every honest agent's of every neighbour, issued in one pass
        # before anything awaits: all reach the engine before its next step and share its forward passes
        # (as many as its token budget holds), whatever pace the agents then go at.
        pending = {a.id: [asyncio.ensure_future(judge(a, t, msg(j, a.id), j)) for j in nbrs[a.id]] for a in honest}

        async def agent_round(a):
            """Agent a's round t. It needs only its own judgements, so it refines as soon as they are in;
            the round ends when every agent's has (the next round reads every answer of this one)."""
            got = await asyncio.gather(*pending[a.id])
            got = dict(zip(nbrs[a.id], got))
            scores = [(j, got[j]["score"]) for j in nbrs[a.id]]
            below, dropped, kept = filter_neighbours(phi[a.id], scores, F)
            if lockstep:
                await phase_done.wait()
            out = None
            if kept:  # empty kept set: no call
                out = await a.llm.chat(prompts.refine(task, answer[a.id], [(msg(j, a.id), s) for j, s in scores
                                                                             if j in kept], F),
                                       seeded(solve_params, seed, task.id, a.id, t, "refine"), tag="refine")
            parsed = task.extract(out.text) if out is not None else None
            new = parsed if parsed is not None else answer[a.id]  # unparsable refinement: keep the answer
            if lockstep:
                await phase_done.wait()
            rescored = None
            if rescore == "always" or new != answer[a.id]:
                rescored = await judge(a, t, new, a.id)
                phi[a.id] = rescored["score"]
            return {"id": a.id, "role": a.role, "answer": new, "previous": answer[a.id],
                    "threshold": rounds[-1]["agents"][a.id]["self_score"], "self_score": phi[a.id],
                    "scores": dict(scores), "below": below, "dropped": dropped, "kept": kept,
                    "refine_called": out is not None, "refine_parsed": None if out is None else parsed is not None,
                    "text": None if out is None else out.text,
                    "score_failures": sum(not got[j]["parsed"] for j in nbrs[a.id])
                    + (rescored is not None and not rescored["parsed"]),
                    "score_errors": [got[j]["error"] for j in nbrs[a.id] if "error" in got[j]]}

        done = dict(zip([a.id for a in honest], await asyncio.gather(*(agent_round(a) for a in honest))))
        records = [done[a.id] if a.honest else {"id": a.id, "role": a.role, "answer": answer[a.id],
                                                 "sent": {i: msg(a.id, i) for i in nbrs[a.id]}} for a in agents]
        answer = {a.id: done[a.id]["answer"] if a.honest else answer[a.id] for a in agents}
        rounds.append({"round": t, "agents": records})

    return {"protocol": "sac", "task_id": task.id, "kind": task.kind, "gold": task.accepted, "seed": seed,
            "F": F, "T": T, "score_mode": score_mode, "rescore": rescore, "edges": sorted(map(list, graph.edges)),
            "agents": [{"id": a.id, "role": a.role, "model": getattr(a.llm, "name", None)} for a in agents],
            "adversaries": [{"id": a.id, **a.adversary.record()} for a in agents if not a.honest],
            "rounds": rounds}


def _round0(agents, answer, text, phi, selfs):
    records = []
    for a in agents:
        if not a.honest:
            records.append({"id": a.id, "role": a.role, "answer": answer[a.id]})
            continue
        s = selfs[a.id]
        records.append({"id": a.id, "role": a.role, "answer": answer[a.id], "self_score": phi[a.id],
                        "text": text[a.id], "answer_parsed": answer[a.id] is not None,
                        "score_failures": int(not s["parsed"]), "score_errors": [s["error"]] if "error" in s else []})
    return {"round": 0, "agents": records}
