"""A multi-agent system as data, and one runner that walks any of them over one task.

A System is roles (name, profile template) and steps of turns. A turn is one role speaking once to a
set of receivers (none: the message is the system's output); the turns of one step run concurrently,
so they see only what was sent before the step. An agent sees the task and every earlier message it
sent or received, in order, and then its turn's instruction. Whose last message is the answer, and
which role is faulty, are part of the system.

Each message is recorded with its sender, receivers, "original" (as the agent wrote it), "text" (as
sent), "injected_text" (after the fault, when it changed anything), and whether it was injected,
inspected or revised. What a message goes through before delivery:
    the speaker writes it -> the fault may corrupt it (faulty role only) -> the Inspector may revise it
Everyone, the speaker included, then sees the text as sent. A message from another agent is
untrusted input (plain text to the tokenizer); the profile, the task and the instruction are not.

Faults act through two hooks (see `Fault`): AutoTransform rewrites the faulty role's profile before
the run, AutoInject corrupts that role's messages. Defences: the Challenger adds a duty to every
profile (after any transform), the Inspector reviews every message, the final answer included.
Problems run concurrently when the caller gathers `run_system` over many tasks; the engine batches them.
"""
import asyncio
from dataclasses import dataclass, replace

from ...backends import SamplingParams
from .kinds import fill, kind_of, statement
from .util import stable_seed

STRUCTURES = ("linear", "flat", "hierarchical")
PARAMS = SamplingParams(max_tokens=1024, temperature=0.0)  # the paper ran at temperature 0


@dataclass(frozen=True)
class Role:
    name: str
    profile: str  # a template: {job}, {deliverable}, {final}, {expert} come from the task kind (kinds.py)

    def render(self, kind) -> str:
        return fill(self.profile, kind)


@dataclass(frozen=True)
class Turn:
    speaker: str
    to: tuple = ()  # receivers; () = the message is the system's output
    instruction: str = ""  # a template, like profiles


@dataclass
class System:
    name: str
    structure: str  # linear | flat | hierarchical
    roles: dict  # name -> Role
    steps: list  # [[Turn, ...], ...]: the turns of a step run concurrently
    answer_role: str  # its last message is the system's output
    faulty_role: str
    rounds: int = 1
    # Optional: async plan(llm, task, kind, params) -> (the System for this task, a record). For a
    # system whose team the model chooses per task (SPP's personas); it runs before faults and defences.
    plan: object = None

    def __post_init__(self):
        if self.structure not in STRUCTURES:
            raise ValueError(f"structure must be one of {STRUCTURES}, got {self.structure!r}")
        if self.faulty_role not in self.roles:
            raise ValueError(f"system {self.name}: faulty role {self.faulty_role!r} is not one of {list(self.roles)}")
        if self.answer_role not in self.roles:
            raise ValueError(f"system {self.name}: answer role {self.answer_role!r} is not one of {list(self.roles)}")
        for turn in self.turns:
            unknown = {turn.speaker, *turn.to} - set(self.roles)
            if unknown:
                raise ValueError(f"system {self.name}: turn names unknown roles {sorted(unknown)}")
        if not self.turns or self.turns[-1].speaker != self.answer_role:
            raise ValueError(f"system {self.name}: the last turn must be the answer role's")

    @property
    def turns(self) -> list:
        return [turn for step in self.steps for turn in step]


class Fault:
    """The two places a fault can act; the default changes nothing. `llm` None: the system's model."""
    name = "none"
    llm = None

    async def transform_profile(self, llm, role, kind, profile):
        """(profile to use, record for the transcript or None), before the run."""
        return profile, None

    async def corrupt_message(self, llm, text, task, index):
        """(text to send, record or None) for each message of the faulty role; index: its place in the run."""
        return text, None

    def describe(self) -> dict:
        return {"name": self.name}


def agent_messages(profile, task, kind, turn, history) -> list:
    """The chat an agent answers on its turn: profile, task, what it sent and received, instruction."""
    messages = [{"role": "system", "content": profile}, {"role": "user", "content": statement(task, kind)}]
    for m in history:
        if m["sender"] == turn.speaker:
            messages.append({"role": "assistant", "content": m["text"], "untrusted": True})
        elif turn.speaker in m["receivers"]:
            sender = m["sender"].replace("_", " ")
            messages.append({"role": "user", "content": f"Message from the {sender}:\n{m['text']}", "untrusted": True})
    messages.append({"role": "user", "content": fill(turn.instruction, kind)})
    return messages


async def run_system(system, task, llm, fault=None, defense=None, params=None, seed=0, role_llms=None) -> dict:
    """Run `system` on one task; returns the transcript, its "output" the system's final text.

    llm: the model of every agent (and of the fault and the Inspector unless they carry their own);
    role_llms: {role: model} overrides; defense: an object with .challenger / .inspector (or None);
    params: the agents' sampling; seed: their per-message sampling seeds (derived by hashlib)."""
    kind = kind_of(task)
    params = params or PARAMS
    role_llms = dict(role_llms or {})
    plan = None
    if system.plan is not None:
        system, plan = await system.plan(role_llms.get(system.answer_role, llm), task, kind,
                                         replace(params, seed=stable_seed("resilience-plan", seed, task.id)))
    if set(role_llms) - set(system.roles):
        raise ValueError(f"role_llms names roles not in {system.name}: {sorted(set(role_llms) - set(system.roles))}")
    challenger = getattr(defense, "challenger", None)
    inspector = getattr(defense, "inspector", None)

    profiles = {name: role.render(kind) for name, role in system.roles.items()}
    transform = None
    if fault is not None:
        faulty = system.faulty_role
        profiles[faulty], transform = await fault.transform_profile(_own(fault, llm), faulty, kind, profiles[faulty])
    if challenger is not None:  # after the transform: the duty is every agent's, the faulty one's too
        profiles = {name: challenger.apply(p) for name, p in profiles.items()}

    async def speak(turn, index, step, history):
        out = await role_llms.get(turn.speaker, llm).chat(
            agent_messages(profiles[turn.speaker], task, kind, turn, history),
            replace(params, seed=stable_seed("resilience", seed, task.id, index)), tag="agent")
        msg = {"index": index, "step": step, "sender": turn.speaker, "receivers": list(turn.to),
               "text": out.text, "original": out.text, "injected": False, "inspected": False, "revised": False}
        if fault is not None and turn.speaker == system.faulty_role:
            text, info = await fault.corrupt_message(_own(fault, llm), msg["text"], task, index)
            if info is not None:
                msg["injection"] = info
            msg["injected"], msg["text"] = text != msg["text"], text
            if msg["injected"]:
                msg["injected_text"] = text  # what the Inspector, if any, was shown
        if inspector is not None:
            text, info = await inspector.review(_own(inspector, llm), task, kind, history, msg)
            msg["inspection"] = info
            msg["inspected"], msg["revised"], msg["text"] = True, text != msg["text"], text
        return msg

    messages = []
    for step, turns in enumerate(system.steps):
        history = list(messages)
        messages += await asyncio.gather(*(speak(turn, len(history) + i, step, history)
                                           for i, turn in enumerate(turns)))

    output = [m for m in messages if m["sender"] == system.answer_role][-1]["text"]
    return {"system": system.name, "structure": system.structure, "task_id": task.id, "kind": kind.name,
            "faulty_role": system.faulty_role, "answer_role": system.answer_role,
            "fault": fault.describe() if fault is not None else {"name": "none"},
            "defense": getattr(defense, "name", "none") if defense is not None else "none",
            "profiles": profiles, "autotransform": transform, "plan": plan, "messages": messages, "output": output,
            "stats": _stats(messages)}


def _own(part, llm):
    """A fault's or the Inspector's own model, else the system's."""
    return part.llm if part.llm is not None else llm


def _stats(messages) -> dict:
    injections = [m["injection"] for m in messages if "injection" in m]
    outcomes = [m["inspection"]["outcome"] for m in messages if m["inspected"]]
    return {"messages": len(messages),
            "injected": sum(m["injected"] for m in messages),  # messages whose text the fault changed
            "inject_selected": sum(i["selected"] for i in injections),
            "inject_pieces_chosen": sum(len(i["chosen"]) for i in injections),
            "inject_pieces_rewritten": sum(len(i["rewritten"]) for i in injections),
            "inject_json_failures": sum(i["json"] == "invalid" for i in injections),
            "inspected": len(outcomes),
            "revised": sum(m["revised"] for m in messages),
            "inspector_invalid": outcomes.count("invalid"),
            "inspector_no_revision": outcomes.count("no_revision")}
