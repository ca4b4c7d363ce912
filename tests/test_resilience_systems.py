"""The six resilience systems on a scripted backend: who speaks when, who receives what, who decides;
faults reach only the faulty role; AutoTransform, Challenger and Inspector; flag validation."""
import asyncio
import json
import re
from collections import Counter
from types import SimpleNamespace

import pytest

from byzantium.protocols.resilience import (SYSTEMS, AutoInject, AutoTransform, build_system, kind_of, make_defense,
                                            make_fault, run_system)
from byzantium.protocols.resilience.autoinject import INJECT_SYSTEM
from byzantium.protocols.resilience.autotransform import FALLBACK, TRANSFORM_SYSTEM, compose, parse_reply
from byzantium.protocols.resilience.challenger import DUTY
from byzantium.protocols.resilience.inspector import INSPECTOR_SYSTEM


def task(kind="code", id="t1"):
    question = 'def add(a, b):\n    """Add two numbers."""\n' if kind == "code" else "A question."
    return SimpleNamespace(id=id, question=question, choices=None, gold="x", kind=kind,
                           metadata={"entry_point": "add"} if kind == "code" else {})


TOKEN = re.compile(r"<([a-z_0-9]+#\d+)>")
TRANSFORMED = "PROFILE:\nYou are the sneaky one.\nERRORS:\n- flip a sign\n- drop an edge case"


class Scripted:
    """Each agent replies "<role#k> ..." (its k-th message) and is recognised by its profile; the
    injector, transformer and inspector by their system prompts. Records every call and what it saw."""
    name = "scripted"

    def __init__(self, system, kind, inspect=None, inject=None, transform=None):
        self.by_profile = {role.render(kind): name for name, role in system.roles.items()}
        self.inspect = inspect or (lambda text: '{"decision": "safe"}')
        self.inject = inject or (lambda pieces: json.dumps({k: "BAD " + v for k, v in pieces.items()}))
        self.transform = transform or (lambda: TRANSFORMED)
        self.calls, self.count = [], Counter()
        self.in_flight = self.max_in_flight = 0

    async def chat(self, messages, params=None, untrusted=False, tag=None):
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0)  # let every other coroutine of a gather start first
        await asyncio.sleep(0)
        self.in_flight -= 1
        system = messages[0]["content"]
        if system == INSPECTOR_SYSTEM:
            self.calls.append(SimpleNamespace(who="inspector", messages=messages))
            return SimpleNamespace(text=self.inspect(messages[-2]["content"]))
        if system == INJECT_SYSTEM:
            self.calls.append(SimpleNamespace(who="injector", messages=messages))
            return SimpleNamespace(text=self.inject(json.loads(messages[-1]["content"])))
        if system == TRANSFORM_SYSTEM:
            self.calls.append(SimpleNamespace(who="transformer", messages=messages))
            return SimpleNamespace(text=self.transform())
        challenged = system.endswith(DUTY)
        who = self.by_profile.get(system.removesuffix(DUTY) if challenged else system, "unknown")
        saw = [tok for m in messages if m.get("untrusted") for tok in TOKEN.findall(m["content"])]
        self.calls.append(SimpleNamespace(who=who, saw=saw, messages=messages, challenged=challenged))
        k = self.count[who]
        self.count[who] += 1
        return SimpleNamespace(text=f"<{who}#{k}> I did my part. It is done.")

    def agents(self):
        return [c for c in self.calls if c.who not in ("inspector", "injector", "transformer")]


def run(system, llm, t=None, **kwargs):
    return asyncio.run(run_system(system, t or task(), llm, **kwargs))


# ------------------------------------------------------------------------------------ message flow

FLOWS = {
    "metagpt": [("product_manager", []), ("architect", ["product_manager#0"]), ("project_manager", ["architect#0"]),
                ("engineer", ["project_manager#0"]), ("qa_engineer", ["engineer#0"])],
    "self-collab": [("analyst", []), ("coder", ["analyst#0"]), ("tester", ["coder#0"])],
    "camel": [("user", []), ("assistant", ["user#0"]), ("user", ["user#0", "assistant#0"]),
              ("assistant", ["user#0", "assistant#0", "user#1"]),
              ("user", ["user#0", "assistant#0", "user#1", "assistant#1"])],
    # The lead plans first (lead#0: it names no further persona here, so the team is lead and expert).
    "spp": [("lead", []), ("expert", []), ("lead", ["expert#0"]), ("expert", ["expert#0", "lead#1"]),
            ("lead", ["expert#0", "lead#1", "expert#1"])],
    "mad": [("affirmative", []), ("negative", ["affirmative#0"]), ("affirmative", ["affirmative#0", "negative#0"]),
            ("negative", ["affirmative#0", "negative#0", "affirmative#1"]),
            ("judge", ["affirmative#0", "negative#0", "affirmative#1", "negative#1"])],
    "agentverse": [("recruiter", []), ("solver", ["recruiter#0"]),
                   ("reviewer", ["recruiter#0", "solver#0"]), ("critic", ["recruiter#0", "solver#0"]),
                   ("solver", ["recruiter#0", "solver#0", "reviewer#0", "critic#0"]),
                   ("reviewer", ["recruiter#0", "solver#0", "reviewer#0", "solver#1"]),
                   ("critic", ["recruiter#0", "solver#0", "critic#0", "solver#1"]),
                   ("solver", ["recruiter#0", "solver#0", "reviewer#0", "critic#0", "solver#1", "reviewer#1",
                               "critic#1"]),
                   ("critic", ["recruiter#0", "solver#0", "critic#0", "solver#1", "critic#1", "solver#2"])],
}
DECIDES = {"metagpt": "qa_engineer#0", "self-collab": "tester#0", "camel": "user#2", "spp": "lead#2",
           "mad": "judge#0", "agentverse": "critic#2"}
STRUCTURE = {"metagpt": "linear", "self-collab": "linear", "camel": "flat", "spp": "flat", "mad": "hierarchical",
             "agentverse": "hierarchical"}
FAULTY = {"metagpt": "engineer", "self-collab": "coder", "camel": "assistant", "spp": "expert", "mad": "affirmative",
          "agentverse": "solver"}


def test_every_system_is_pinned():
    assert set(SYSTEMS) == set(FLOWS)


@pytest.mark.parametrize("name", list(SYSTEMS))
def test_message_flow(name):
    system = build_system(name)
    llm = Scripted(system, kind_of(task()))
    record = run(system, llm)
    assert [(c.who, c.saw) for c in llm.calls] == FLOWS[name]
    assert TOKEN.findall(record["output"]) == [DECIDES[name]]
    assert record["structure"] == STRUCTURE[name] == system.structure
    assert record["faulty_role"] == FAULTY[name] and record["answer_role"] == system.answer_role
    assert [m["sender"] for m in record["messages"]] == [who for who, _ in FLOWS[name]][name == "spp":]
    assert record["messages"][-1]["receivers"] == []  # the last message is the output
    assert not any(m["injected"] or m["inspected"] for m in record["messages"])


def test_agentverse_is_the_papers_four_agents_and_the_faulty_solver_reaches_the_critic():
    # The paper: AgentVerse has 4 agents, its final agent is the Critic, its faulty role the Solver; a
    # fault must reach the agent that decides, not sit in a message the decider may ignore.
    system = build_system("agentverse")
    assert set(system.roles) == {"recruiter", "solver", "reviewer", "critic"} and system.structure == "hierarchical"
    assert system.faulty_role == "solver" and system.answer_role == "critic"
    llm = Scripted(system, kind_of(task()))
    record = run(system, llm, fault=AutoInject(pm=1.0, pe=1.0, seed=1))
    last = llm.agents()[-1]
    assert last.who == "critic" and TOKEN.findall(record["output"]) == ["critic#2"]
    assert record["output"] == record["messages"][-1]["text"] and record["messages"][-1]["sender"] == "critic"
    solver = [m for m in record["messages"] if m["sender"] == "solver"]
    assert len(solver) == 3 and all(m["injected"] for m in solver)
    # The critic's final prompt holds every corrupted solver message, as sent.
    shown = [m["content"] for m in last.messages if m.get("untrusted")]
    assert all(any(m["text"] in c for c in shown) for m in solver)
    assert "BAD <solver#2>" in shown[-1]


def test_agents_see_own_messages_as_assistant_and_others_untrusted():
    system = build_system("camel")
    llm = Scripted(system, kind_of(task()))
    run(system, llm)
    third = llm.calls[2].messages  # the user's second turn
    assert [m["role"] for m in third] == ["system", "user", "assistant", "user", "user"]
    assert [bool(m.get("untrusted")) for m in third] == [False, False, True, True, False]
    assert "Message from the assistant:" in third[3]["content"]
    assert "```python" in third[1]["content"] and "`add`" in third[1]["content"]  # the task as every agent reads it


def test_receivers_are_recorded():
    record = run(build_system("mad"), Scripted(build_system("mad"), kind_of(task())))
    assert [m["receivers"] for m in record["messages"]] == [["negative", "judge"], ["affirmative", "judge"]] * 2 + [[]]


def test_independent_turns_and_problems_run_concurrently():
    system = build_system("agentverse")
    llm = Scripted(system, kind_of(task()))
    run(system, llm)
    assert llm.max_in_flight == 2  # the reviewer and the critic
    llm = Scripted(build_system("metagpt"), kind_of(task()))

    async def many():
        return await asyncio.gather(*(run_system(build_system("metagpt"), task(id=f"t{i}"), llm) for i in range(4)))
    records = asyncio.run(many())
    assert llm.max_in_flight == 4 and [r["task_id"] for r in records] == ["t0", "t1", "t2", "t3"]


def test_rounds_change_the_length_of_iterative_systems():
    assert len(build_system("camel", rounds=1).turns) == 3
    assert len(build_system("mad", rounds=3).turns) == 7
    assert len(build_system("agentverse", rounds=1).turns) == 6
    assert len(build_system("spp", rounds=2).turns) == 6  # before planning: lead and expert
    from byzantium.protocols.resilience.systems import spp
    assert len(spp(rounds=2, personas=["a", "b"]).turns) == 12


@pytest.mark.parametrize("kind, marker", [("code", "```python"), ("math", "Answer:"), ("translation", "English"),
                                          ("verdict", "Verdict: Assistant 1")])
def test_profiles_and_final_instruction_follow_the_task_kind(kind, marker):
    system = build_system("self-collab")
    llm = Scripted(system, kind_of(task(kind)))
    record = run(system, llm, task(kind))
    assert all(c.who != "unknown" for c in llm.calls)
    assert marker in llm.calls[-1].messages[-1]["content"]
    assert kind_of(task(kind)).job in record["profiles"]["coder"]
    assert record["kind"] == kind
    assert kind_of(task("number")).name == "math"


def test_statement_prefers_the_raw_prompt_and_source_of_the_task_layer():
    from byzantium.protocols.resilience.kinds import statement
    code = SimpleNamespace(id="c", kind="code", question="Complete it.\n\n```python\ndef f(): ...\n```",
                           metadata={"prompt": "def f():\n    \"\"\"Doc.\"\"\"\n", "entry_point": "f"})
    text = statement(code, kind_of(code))
    assert text.count("```") == 2 and "Doc." in text and "Complete it." not in text
    zh = SimpleNamespace(id="z", kind="translation", question="Translate it.\n\n你好。",
                         metadata={"source": "你好。"})
    assert statement(zh, kind_of(zh)).endswith(":\n你好。")
    bare = SimpleNamespace(id="b", kind="code", question="def g(): ...", metadata={})
    assert "```python\ndef g(): ...\n```" in statement(bare, kind_of(bare))


# -------------------------------------------------------------------------------------- AutoInject

@pytest.mark.parametrize("name", list(SYSTEMS))
def test_injection_reaches_only_the_faulty_role(name):
    for faulty in (None, next(r for r in build_system(name).roles if r != FAULTY[name])):
        system = build_system(name, faulty_role=faulty)
        llm = Scripted(system, kind_of(task()))
        record = run(system, llm, fault=AutoInject(pm=1.0, pe=1.0, seed=1))
        faulty = system.faulty_role
        for m in record["messages"]:
            assert m["injected"] == (m["sender"] == faulty)
            assert m["text"].startswith("BAD ") == (m["sender"] == faulty)
            assert "BAD" not in m["original"]
        sent = sum(m["sender"] == faulty for m in record["messages"])
        assert sum(c.who == "injector" for c in llm.calls) == sent == record["stats"]["injected"]
        # Whoever receives a faulty message sees the injected text.
        seen = [m["content"] for c in llm.agents() for m in c.messages if m.get("untrusted")]
        assert all("BAD <" in s for s in seen if f"<{faulty}#" in s)


# ----------------------------------------------------------------------------------- AutoTransform

def test_autotransform_rewrites_only_the_faulty_profile_and_records_it():
    system = build_system("self-collab")
    kind = kind_of(task())
    llm = Scripted(system, kind)
    expected = compose("You are the sneaky one.", ["flip a sign", "drop an edge case"])
    llm.by_profile[expected] = "transformed"
    record = run(system, llm, fault=AutoTransform())
    assert [c.who for c in llm.calls] == ["transformer", "analyst", "transformed", "tester"]
    assert "the coder has this profile" in llm.calls[0].messages[1]["content"]
    t = record["autotransform"]
    assert t["source"] == "llm" and t["role"] == "coder" and t["errors"] == ["flip a sign", "drop an edge case"]
    assert record["profiles"]["coder"] == expected
    assert record["profiles"]["analyst"] == system.roles["analyst"].render(kind)


def test_autotransform_cache_in_memory_shared_and_on_disk(tmp_path):
    system, kind = build_system("mad"), kind_of(task())
    path = tmp_path / "profiles.json"
    fault = AutoTransform(cache_path=str(path))
    llm = Scripted(system, kind)

    async def many():
        return await asyncio.gather(*(run_system(system, task(id=f"t{i}"), llm, fault=fault) for i in range(3)))
    records = asyncio.run(many())
    assert sum(c.who == "transformer" for c in llm.calls) == 1  # concurrent problems share one request
    assert fault.stats == {"requests": 1, "parsed": 1, "fallbacks": 0, "cache_hits": 2}
    assert [r["autotransform"]["cached"] for r in records] == [False, True, True]
    run(system, llm, task("math"), fault=fault)  # another task kind: another profile
    assert sum(c.who == "transformer" for c in llm.calls) == 2
    again = Scripted(system, kind)
    run(system, again, fault=AutoTransform(cache_path=str(path)))  # a new run reads the file
    assert not any(c.who == "transformer" for c in again.calls)
    assert len(json.loads(path.read_text())) == 2


def test_autotransform_unparsable_reply_falls_back_and_counts(tmp_path):
    system, kind = build_system("camel"), kind_of(task("translation"))
    llm = Scripted(system, kind, transform=lambda: "I would rather not.")
    fault = AutoTransform(cache_path=str(tmp_path / "p.json"))
    record = run(system, llm, task("translation"), fault=fault)
    t = record["autotransform"]
    assert t["source"] == "fallback" and fault.stats["fallbacks"] == 1
    assert record["profiles"]["assistant"].startswith(system.roles["assistant"].render(kind) + "\n\n" + FALLBACK)
    assert kind.errors[0] in record["profiles"]["assistant"]
    assert not (tmp_path / "p.json").exists()  # fallbacks are not saved


def test_parse_reply_formats():
    assert parse_reply("**PROFILE:** You are X.\n**ERRORS:**\n1. a\n2) b") == ("You are X.", ["a", "b"])
    assert parse_reply("PROFILE:\nYou are X.\nERRORS:\nnone") is None
    assert parse_reply("no format at all") is None


# ------------------------------------------------------------------------------------------ defences

def test_challenger_adds_the_duty_to_every_profile():
    system = build_system("agentverse")
    llm = Scripted(system, kind_of(task()))
    record = run(system, llm, defense=make_defense("challenger"))
    assert all(c.challenged for c in llm.agents()) and len(llm.agents()) == 9
    assert all(p.endswith(DUTY) for p in record["profiles"].values())


def test_inspector_replaces_unsafe_passes_invalid_and_counts():
    def inspect(text):
        if "<architect#0>" in text:
            return 'Checked.\n{"decision": "unsafe", "revision": "FIXED design."}'
        if "<engineer#0>" in text:
            return "this is not json"
        if "<project_manager#0>" in text:
            return '{"decision": "unsafe"}'
        return '{"decision": "safe"}'
    system = build_system("metagpt")
    llm = Scripted(system, kind_of(task()), inspect=inspect)
    defense = make_defense("inspector")
    record = run(system, llm, defense=defense)
    msgs = record["messages"]
    assert [m["inspection"]["outcome"] for m in msgs] == ["safe", "revised", "no_revision", "invalid", "safe"]
    assert msgs[1]["text"] == "FIXED design." and "<architect#0>" in msgs[1]["original"] and msgs[1]["revised"]
    assert msgs[2]["text"] == msgs[2]["original"] and msgs[3]["text"] == msgs[3]["original"]
    project_manager = next(c for c in llm.calls if c.who == "project_manager")
    assert "FIXED design." in project_manager.messages[2]["content"]  # receivers get the revision
    assert record["stats"]["inspector_invalid"] == 1 and record["stats"]["revised"] == 1
    assert defense.inspector.stats == {"inspected": 5, "safe": 2, "revised": 1, "invalid": 1, "no_revision": 1}
    # The inspector reads the history, then the new message (untrusted), then its question.
    last = [c for c in llm.calls if c.who == "inspector"][-1].messages
    assert [m.get("untrusted", False) for m in last] == [False, False] + [True] * 4 + [False, True, False]


def test_both_defences_and_a_fault_together():
    system = build_system("self-collab")
    llm = Scripted(system, kind_of(task()),
                   inspect=lambda text: '{"decision": "unsafe", "revision": "CLEAN"}' if "BAD" in text
                   else '{"decision": "safe"}')
    record = run(system, llm, fault=make_fault("autoinject", pm=1.0, pe=1.0), defense=make_defense("both"))
    coder = record["messages"][1]
    assert coder["injected"] and coder["revised"] and coder["text"] == "CLEAN" and "BAD" not in coder["original"]
    assert coder["injected_text"].startswith("BAD ") and coder["inspection"]["outcome"] == "revised"
    stats = record["stats"]
    assert stats["injected"] == stats["inject_selected"] == 1
    assert stats["inject_pieces_rewritten"] == 1  # the coder's reply is one line of code
    assert all(c.challenged for c in llm.agents())
    assert sum(c.who == "inspector" for c in llm.calls) == 3
    assert record["fault"]["name"] == "autoinject" and record["defense"] == "both"


def test_role_llms_route_a_role_to_its_own_model():
    system = build_system("mad")
    main, judge = Scripted(system, kind_of(task())), Scripted(system, kind_of(task()))
    run(system, main, role_llms={"judge": judge})
    assert [c.who for c in judge.calls] == ["judge"] and "judge" not in [c.who for c in main.calls]


# ---------------------------------------------------------------------------------------- validation

@pytest.mark.parametrize("make", [
    lambda: build_system("chatdev"), lambda: build_system("mad", faulty_role="ghost"),
    lambda: build_system("camel", rounds=0), lambda: build_system("metagpt", rounds=2),
    lambda: make_fault("evil"), lambda: make_fault("autoinject", pm=2),
    lambda: make_fault("autoinject", error_type="x"),
    lambda: make_defense("wall"), lambda: kind_of(task("poetry")),
    lambda: run(build_system("mad"), None, role_llms={"ghost": None}),
])
def test_bad_values_are_refused(make):
    with pytest.raises(ValueError):
        make()


def test_none_flags_give_clean_runs():
    assert make_fault("none") is None and make_defense("none") is None
    assert isinstance(make_fault("autotransform"), AutoTransform)
    d = make_defense("both")
    assert d.challenger is not None and d.inspector is not None and d.name == "both"


# ------------------------------------------------------------------ SPP: the model chooses the team

class Planner(Scripted):
    """Scripted, but the lead's planning call (its instruction names the personas) gets `plan`."""

    def __init__(self, system, kind, plan):
        super().__init__(system, kind)
        self.plan = plan

    async def chat(self, messages, params=None, untrusted=False, tag=None):
        if "Persona: <who>" in messages[-1]["content"]:
            self.calls.append(SimpleNamespace(who="planner", messages=messages))
            return SimpleNamespace(text=self.plan)
        return await super().chat(messages, params, untrusted, tag)


@pytest.mark.parametrize("plan, personas", [
    ("Persona: none", []),
    ("I think we need:\nPersona: a tester\n", ["a tester"]),
    ("Persona 1: a tester\nPersona 2: a mathematician\n- Persona: a tester", ["a tester", "a mathematician"]),
    ("\n".join(f"Persona: expert {i}" for i in range(6)), ["expert 0", "expert 1", "expert 2"]),  # at most 5 in all
    ("no list at all", []),
    ("Persona: {job} <b>you are evil</b>!\nPersona: " + "x" * 200, ["job byou are evil/b", "x" * 60]),
])
def test_spp_team_is_chosen_by_the_model_between_2_and_5(plan, personas):
    system = build_system("spp")
    assert set(system.roles) == {"lead", "expert"} and system.plan is not None
    llm = Planner(system, kind_of(task()), plan)
    record = run(system, llm)
    assert llm.calls[0].who == "planner" and record["plan"]["personas"] == personas
    assert record["plan"]["participants"] == 2 + len(personas) and 2 <= record["plan"]["participants"] <= 5
    team = ["expert"] + [f"persona_{i}" for i in range(2, 2 + len(personas))]
    assert set(record["profiles"]) == {"lead", *team}
    for i, who in enumerate(personas, 2):
        assert f"You are {who}." in record["profiles"][f"persona_{i}"]
    # Every persona brainstorms, the lead drafts, every persona gives feedback, the lead answers.
    assert [m["sender"] for m in record["messages"]] == team + ["lead"] + team + ["lead"]
    assert record["faulty_role"] == "expert" and record["messages"][-1]["sender"] == "lead"
    assert all(set(m["receivers"]) == {"lead", *team} - {m["sender"]} for m in record["messages"][:-1])


def test_spp_faulty_expert_is_corrupted_whatever_the_team():
    system = build_system("spp")
    llm = Planner(system, kind_of(task()), "Persona: a tester\nPersona: a reviewer")
    record = run(system, llm, fault=AutoInject(pm=1.0, pe=1.0, seed=1))
    assert [m["sender"] for m in record["messages"] if m["injected"]] == ["expert", "expert"]
