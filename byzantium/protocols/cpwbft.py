"""CP-WBFT as its reference code implements it (the baseline SAC is compared with).

Each round: every honest agent solves from scratch and reports `Confidence: c`; adversaries send their
answer with confidence 1.0; each honest agent then adopts, without an LLM call, the answer group (self +
neighbours) with the highest MEAN reported confidence, ties by count (so one agent at 1.0 beats six at
0.9); the global decision is, over all agents, the answer with the highest mean of the confidences
>= 0.5 (all of them if none is), ties by count. The loop stops once the decision's confidence reaches
the convergence threshold (0.1: in practice after round 1), unless run_all_rounds is set.
"""
import asyncio
import re

from ..engine.sampling import SamplingParams
from ..tasks import normalize_answer
from . import prompts
from .byzantine import prepare_adversaries

SOLVE_PARAMS = SamplingParams(max_tokens=1000, temperature=0.0)
CONVERGENCE = 0.1
KEEP = 0.5  # global decision: confidences below this are ignored when any answer reaches it

_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.S)
_CONF = re.compile(r"confidence\s*[:=]\s*\**\s*(-?[0-9]+(?:\.[0-9]+)?)\s*(%?)", re.I)


def parse_confidence(text):
    """The last `Confidence: c`: "%" or a value > 1 is divided by 100; clipped to [0, 1]; missing -> 0.0."""
    hits = _CONF.findall(_THINK.sub("", text or ""))
    if not hits:
        return 0.0
    value, percent = float(hits[-1][0]), hits[-1][1]
    if percent or value > 1:
        value /= 100
    return min(1.0, max(0.0, value))


def _groups(pairs, kind):
    """[(answer, confidence)] -> {key: [answer, [confidences]]} in first-seen order (None answers skipped)."""
    groups = {}
    for answer, conf in pairs:
        if answer is None:
            continue
        key = normalize_answer(answer, kind) or str(answer)
        groups.setdefault(key, [answer, []])[1].append(conf)
    return groups


def local_update(own, received, kind):
    """own and received: (answer, confidence). Adopt the group with the highest mean confidence, ties by
    count, then first seen (own first). Returns (answer, confidence = that group's mean)."""
    groups = _groups([own] + list(received), kind)
    if not groups:
        return own
    answer, confs = max(groups.values(), key=lambda g: (sum(g[1]) / len(g[1]), len(g[1])))
    if normalize_answer(own[0], kind) == normalize_answer(answer, kind) and own[0] is not None:
        answer = own[0]  # same group: keep the agent's own spelling
    return answer, sum(confs) / len(confs)


def decide(pairs, kind):
    """Global decision over all agents: (answer, confidence), or (None, 0.0) when nobody answered.
    With every confidence at 0 this is a plain majority (ties by count)."""
    best = None
    for answer, confs in _groups(pairs, kind).values():
        strong = [c for c in confs if c >= KEEP] or confs
        key = (sum(strong) / len(strong), len(confs))
        if best is None or key > best[0]:
            best = (key, answer)
    return (best[1], best[0][0]) if best else (None, 0.0)


async def run_cpwbft(task, graph, agents, T=6, solve_params=None, threshold=CONVERGENCE,
                     run_all_rounds=False):
    """One problem instance. agents[i] sits on node i of `graph`. Returns the transcript record:
    rounds[0] holds the first solve (before any update); rounds[t] the state after round t's update."""
    if sorted(graph.nodes) != list(range(len(agents))):
        raise ValueError(f"graph nodes must be 0..{len(agents) - 1}, one per agent")
    solve_params = solve_params or SOLVE_PARAMS
    honest = [a for a in agents if a.honest]
    nbrs = {a.id: sorted(graph.neighbors(a.id)) for a in agents}
    rounds, decision = [], (None, 0.0)
    for t in range(1, T + 1):
        # Decoy adversaries write their answers alongside the first solves (later rounds: nothing to do).
        outs, _ = await asyncio.gather(
            asyncio.gather(*(a.llm.chat(prompts.cpwbft_solve(task), solve_params) for a in honest)),
            prepare_adversaries(agents))
        solved = {a.id: (a.adversary.answer, a.adversary.confidence) for a in agents if not a.honest}
        text = {}
        for a, out in zip(honest, outs):
            solved[a.id], text[a.id] = (task.extract(out.text), parse_confidence(out.text)), out.text
        if t == 1:
            rounds.append({"round": 0, "agents": [
                {"id": a.id, "role": a.role, "answer": solved[a.id][0], "confidence": solved[a.id][1],
                 "text": text.get(a.id)} for a in agents]})

        def msg(j, i):
            if agents[j].honest:
                return solved[j]
            return agents[j].adversary.message(i, t), agents[j].adversary.confidence
        state = dict(solved)
        for a in honest:
            state[a.id] = local_update(solved[a.id], [msg(j, a.id) for j in nbrs[a.id]], task.kind)
        decision = decide(list(state.values()), task.kind)
        rounds.append({"round": t, "decision": decision[0], "decision_confidence": decision[1], "agents": [
            {"id": a.id, "role": a.role, "answer": state[a.id][0], "confidence": state[a.id][1],
             "solved": solved[a.id][0], "solved_confidence": solved[a.id][1], "text": text.get(a.id)}
            for a in agents]})
        if decision[1] >= threshold and not run_all_rounds:
            break
    return {"protocol": "cpwbft", "task_id": task.id, "kind": task.kind, "gold": task.accepted,
            "T": T, "rounds_run": len(rounds) - 1, "decision": decision[0],
            "decision_confidence": decision[1], "edges": sorted(map(list, graph.edges)),
            "agents": [{"id": a.id, "role": a.role, "model": getattr(a.llm, "name", None)} for a in agents],
            "adversaries": [{"id": a.id, **a.adversary.record()} for a in agents if not a.honest],
            "rounds": rounds}
