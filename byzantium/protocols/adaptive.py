"""Adversaries that target the defence: they read what the honest agents wrote and use their own model
as the oracle of what will get past it.

SAC / CP-WBFT (byzantine.Adversary in mode "adaptive" calls these each round):
    wrong_candidates(task, own, seen)          its own wrong answers, then its neighbours' answers that are
                                               wrong, distinct after normalisation
    choose(llm, task, candidates, judge, ...)  every candidate judged by the adversary's own model with the
                                               judge the receivers use, all at once (one gather: the engine
                                               packs them into the same steps), the highest score kept
Round-robin (round_robin in attack mode "trajectory" or "logprob" calls these on a corrupted agent's turn):
    trajectory_turn   a prompt that names the target and quotes what the honest agents just wrote (as
                      untrusted text), with the shared answer so far as the reply it continues
    logprob_turn      a few continuations sampled under the agent's own (injected) prompt, all at once; kept:
                      the one after which the model, reading as an honest agent, gives the target answer the
                      highest log-probability (every candidate's probe scored at once)
"""
import asyncio
import dataclasses
import math

from ..tasks import extract_answer, normalize_answer
from . import prompts
from .rr_prompts import trajectory_messages

# The probe after a round-robin candidate: the answer sentence the agents' prompt asks for, up to the answer.
PROBE = {"choice": "\nThe answer is ("}
DEFAULT_PROBE = "\nThe answer is "


# ---------------------------------------------------------------------------------- SAC and CP-WBFT

async def yes_no_judge(llm, task, answer, seed=None):
    """A judge for the adaptive adversary when none is given: P(Yes) of SAC's logprob judge prompt, one
    forward pass (the experiments pass the receivers' own Scorer instead)."""
    lp = await llm.score(prompts.judge_yes_no(task, answer), ["Yes", "No"], tag="adversary")
    yes, no = math.exp(lp["Yes"]), math.exp(lp["No"])
    return {"score": yes / (yes + no) if yes + no > 0 else 0.5}


def wrong_candidates(task, own, seen=()) -> list:
    """`own` then `seen` (the neighbours' current answers), each kept once (after normalisation) when it
    is a readable answer that `task.accepts` rejects; for a choice task only its own option letters."""
    out, keys = [], set()
    for answer in list(own) + list(seen):
        if answer is None or task.accepts(answer):
            continue
        key = normalize_answer(answer, task.kind)
        if key is None or key in keys or (task.kind == "choice" and key not in task.letters):
            continue
        keys.add(key)
        out.append(str(answer))
    return out


async def choose(llm, task, candidates, judge, seed_of, known=None):
    """(the candidate the judge scores highest, {candidate: score}). Candidates in `known` are not judged
    again; the others are judged together. A tie goes to the earlier candidate."""
    known = dict(known or {})
    todo = [c for c in candidates if c not in known]
    got = await asyncio.gather(*(judge(llm, task, c, seed_of(c)) for c in todo))
    known.update((c, g["score"]) for c, g in zip(todo, got))
    return max(candidates, key=lambda c: known[c]), known


# -------------------------------------------------------------------------------------- round-robin

async def trajectory_turn(llm, task, target, reply_ids, recent, params):
    """One turn of a trajectory-aware corrupted agent: its prompt names the target and quotes `recent` (the
    honest agents' text since its last turn); its reply so far is the shared text, which it continues."""
    ids = llm.render_chat(trajectory_messages(task, target, recent)) + list(reply_ids)
    return await llm.generate(ids, params, tag="attack")


async def target_logprob(llm, context_ids, target_ids):
    """log P(target_ids | context_ids) under `llm`: one next-token scoring call per target token, together."""
    got = await asyncio.gather(*(llm.score(list(context_ids) + list(target_ids[:j]), [t], tag="attack")
                                 for j, t in enumerate(target_ids)))
    return sum(g[t] for g, t in zip(got, target_ids))


async def logprob_turn(llm, task, target, own_ids, honest_ids, reply_ids, params, seeds, shared_text="", room=None):
    """One turn of a logprob-guided corrupted agent. Samples one continuation per seed from `own_ids` (its
    prompt) + the shared text, all at once; scores each by the log-probability of the target answer after
    the candidate and the answer probe, read under `honest_ids` (an honest agent's prompt), all at once.
    A candidate that ends the trajectory (end of sequence, or `room` tokens reached) is scored by the answer
    the finished text states: 0.0 (certain) when it is the target, -inf otherwise.
    Returns (the chosen completion, {"scores": [...], "chosen": index}); -inf is recorded as None."""
    base = list(own_ids) + list(reply_ids)
    outs = await asyncio.gather(*(llm.generate(base, dataclasses.replace(params, seed=s), tag="attack")
                                  for s in seeds))
    target_ids = llm.encode_plain(target)
    probe = llm.encode_plain(PROBE.get(task.kind, DEFAULT_PROBE))
    goal = normalize_answer(target, task.kind)

    async def score(out):
        ends = out.finish_reason != "length" or (room is not None and len(out.token_ids) >= room)
        if ends:
            said = extract_answer(shared_text + out.text, task.kind, task.choices)
            return 0.0 if said is not None and normalize_answer(said, task.kind) == goal else -math.inf
        return await target_logprob(llm, list(honest_ids) + list(reply_ids) + list(out.token_ids) + probe, target_ids)

    scores = await asyncio.gather(*(score(o) for o in outs))
    best = max(range(len(outs)), key=lambda j: scores[j])  # a tie goes to the earlier candidate
    return outs[best], {"scores": [None if s == -math.inf else s for s in scores], "chosen": best}


__all__ = ["PROBE", "yes_no_judge", "wrong_candidates", "choose", "trajectory_turn", "target_logprob",
           "logprob_turn"]
