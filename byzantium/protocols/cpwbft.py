"""CP-WBFT as its reference code implements it (the baseline SAC is compared with).

Each round: every honest agent solves from scratch and reports `Confidence: c`; adversaries send their
answer with confidence 1.0; each honest agent then adopts, without an LLM call, the answer group of its
neighbours' answers (added first, by sender id) and its own (added last) with the highest MEAN reported
confidence, ties by count, then by insertion order (so one agent at 1.0 beats six at 0.9, and on an
exact tie the first neighbour wins, not the agent itself). The global decision goes over all agents in
agent order: per answer the mean of the confidences >= 0.5 (all of them if none is), ties by the count
of those kept votes, then by agent order; when every confidence is 0 it is a plain majority with
confidence count / n. The loop stops once the decision's confidence reaches the convergence threshold
(0.1: in practice after round 1), unless run_all_rounds is set.

Ours, not the reference's: answers are grouped after `normalize_answer` ("42" and "42.0" are one
group; the reference compared raw strings), and an agent whose group wins keeps its own spelling.
Every request is seeded from (seed, problem, agent, round, "solve").
"""
import asyncio

from ..backends import SamplingParams
from ..tasks import normalize_answer
from ..tasks.answers import read_confidence
from . import prompts
from .byzantine import observe_adversaries, prepare_adversaries, seeded

SOLVE_PARAMS = SamplingParams(max_tokens=1000, temperature=prompts.TEMPERATURE)
CONVERGENCE = 0.1
KEEP = 0.5  # global decision: per answer, its confidences below this are ignored (all kept if none reaches it)

def find_confidence(text):
    """The last reported confidence (tasks.answers.read_confidence: "Confidence: 0.9", "Confidence level:
    0.8", "I am 90% confident"; "%" or a value > 1 divided by 100; clipped to [0, 1]), None when there is none."""
    return read_confidence(text).value


def parse_confidence(text):
    """find_confidence, with a missing confidence read as 0.0 (as the reference does)."""
    value = find_confidence(text)
    return 0.0 if value is None else value


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
    """own and received: (answer, confidence), received in sender-id order. Neighbours are grouped first
    and the agent's own answer last; the group with the highest mean confidence wins, ties by count, then
    first inserted (the first neighbour's, not the agent's own). Returns (answer, that group's mean)."""
    groups = _groups(list(received) + [own], kind)
    if not groups:
        return own
    answer, confs = max(groups.values(), key=lambda g: (sum(g[1]) / len(g[1]), len(g[1])))
    if normalize_answer(own[0], kind) == normalize_answer(answer, kind) and own[0] is not None:
        answer = own[0]  # same group: keep the agent's own spelling
    return answer, sum(confs) / len(confs)


def decide(pairs, kind):
    """Global decision over all agents' (answer, confidence) in agent order: (answer, confidence), or
    (None, 0.0) when nobody answered. Per answer the confidences >= KEEP are kept (all if none is); the
    highest mean wins, ties by the number of kept votes, then agent order. Every confidence 0: plain
    majority (ties by agent order), confidence = votes / number of agents."""
    groups = _groups(pairs, kind)
    if not groups:
        return None, 0.0
    if all(c == 0 for _, confs in groups.values() for c in confs):
        answer, confs = max(groups.values(), key=lambda g: len(g[1]))  # max keeps the first of a tie
        return answer, len(confs) / len(pairs)
    best = None
    for answer, confs in groups.values():
        kept = [c for c in confs if c >= KEEP] or confs
        key = (sum(kept) / len(kept), len(kept))
        if best is None or key > best[0]:
            best = (key, answer)
    return best[1], best[0][0]


async def run_cpwbft(task, graph, agents, T=6, solve_params=None, threshold=CONVERGENCE,
                     run_all_rounds=False, seed=0):
    """One problem instance. agents[i] sits on node i of `graph`. Returns the transcript record:
    rounds[0] holds the first solve (before any update); rounds[t] the state after round t's update.
    seed: the run seed; each solve is sampled with its own seed from (seed, problem, agent, round)."""
    if sorted(graph.nodes) != list(range(len(agents))):
        raise ValueError(f"graph nodes must be 0..{len(agents) - 1}, one per agent")
    solve_params = solve_params or SOLVE_PARAMS
    honest = [a for a in agents if a.honest]
    nbrs = {a.id: sorted(graph.neighbors(a.id)) for a in agents}
    rounds, decision = [], (None, 0.0)
    for t in range(1, T + 1):
        # Decoy adversaries write their answers alongside the first solves (later rounds: nothing to do).
        outs, _ = await asyncio.gather(
            asyncio.gather(*(a.llm.chat(prompts.cpwbft_solve(task),
                                        seeded(solve_params, seed, task.id, a.id, t, "solve"), tag="solve")
                             for a in honest)),
            prepare_adversaries(agents))
        solved, text = {}, {}
        for a, out in zip(honest, outs):
            solved[a.id], text[a.id] = (task.extract(out.text), parse_confidence(out.text)), out.text
        # An adaptive adversary sees this round's solves before it sends (a rushing adversary).
        await observe_adversaries(agents, t, {i: s[0] for i, s in solved.items()}, nbrs)
        for a in agents:
            if not a.honest:
                solved[a.id] = a.adversary.answer, a.adversary.confidence
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
        decision = decide([state[a.id] for a in agents], task.kind)  # agent order: ties go to the lower index
        rounds.append({"round": t, "decision": decision[0], "decision_confidence": decision[1], "agents": [
            {"id": a.id, "role": a.role, "answer": state[a.id][0], "confidence": state[a.id][1],
             "solved": solved[a.id][0], "solved_confidence": solved[a.id][1], "text": text.get(a.id)}
            for a in agents]})
        if decision[1] >= threshold and not run_all_rounds:
            break
    return {"protocol": "cpwbft", "task_id": task.id, "kind": task.kind, "gold": task.accepted, "seed": seed,
            "T": T, "rounds_run": len(rounds) - 1, "decision": decision[0],
            "decision_confidence": decision[1], "edges": sorted(map(list, graph.edges)),
            "agents": [{"id": a.id, "role": a.role, "model": getattr(a.llm, "name", None)} for a in agents],
            "adversaries": [{"id": a.id, **a.adversary.record()} for a in agents if not a.honest],
            "rounds": rounds}
