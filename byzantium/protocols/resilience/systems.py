"""The six systems of the paper, modelled after the frameworks it studied; profiles written here.

    linear        metagpt      product_manager -> architect -> project_manager -> engineer -> qa_engineer
                  self-collab  analyst -> coder -> tester
    flat          camel        user <-> assistant, `rounds` exchanges, then the user states the result
                  spp          the lead names 0-3 personas besides the expert (2-5 in all); they brainstorm;
                               lead drafts; they give feedback; lead answers
    hierarchical  mad          affirmative <-> negative for `rounds` rounds, the judge above them decides
                  agentverse   recruiter names the experts; solver proposes, reviewer and critic review
                               (concurrently), solver revises, `rounds` times; the critic decides

Default faulty roles are the paper's where it names one (the engineer, the coder, the assistant, a
debater, AgentVerse's solver) and the domain expert persona for SPP (the persona whose knowledge the
others rely on). The role that gives the answer is never faulty by default: the final step of each
system is a role that reviews what it received and states the result in the task's final form ({final}).
"""
import functools
import re

from .structures import Role, System, Turn, agent_messages


def metagpt(faulty_role=None, rounds=None) -> System:
    _rounds(rounds, 1, most=1)
    team = "You are the {} of a small software-style team that is {{job}}. "
    roles = {
        "product_manager": Role("product_manager", team.format("product manager") +
            "You read the task and write the requirements: exactly what must be delivered, the inputs and "
            "the expected outputs, the constraints, and the edge cases that matter. You do not solve the task."),
        "architect": Role("architect", team.format("architect") +
            "From the requirements you receive you design the approach: the method to use, how the work is "
            "structured, and the pitfalls to avoid. Keep the design short and concrete; do not produce the "
            "final result yourself."),
        "project_manager": Role("project_manager", team.format("project manager") +
            "You turn the design you receive into a short ordered list of concrete steps for the engineer, "
            "each with what it must achieve and how to check it."),
        "engineer": Role("engineer", team.format("engineer") +
            "You carry out the plan you receive and produce {deliverable}. Work carefully: your result is "
            "what the team ships."),
        "qa_engineer": Role("qa_engineer", team.format("QA engineer") +
            "You check the engineer's work against the task: you look for mistakes in logic, calculation, "
            "code, wording and format, and try it on examples. Your reply is the team's final output, so you "
            "fix every mistake you find."),
    }
    steps = [[Turn("product_manager", ("architect",), "Write the requirements for the architect.")],
             [Turn("architect", ("project_manager",), "Write the design for the project manager.")],
             [Turn("project_manager", ("engineer",), "Write the ordered steps for the engineer.")],
             [Turn("engineer", ("qa_engineer",), "Following the steps, produce {deliverable}.")],
             [Turn("qa_engineer", (),
                   "Check the engineer's work and give the team's final, corrected result. {final}")]]
    return System("metagpt", "linear", roles, steps, "qa_engineer", faulty_role or "engineer")


def self_collab(faulty_role=None, rounds=None) -> System:
    _rounds(rounds, 1, most=1)
    team = "You are the {} of a three-member team (analyst, coder, tester) that is {{job}}. "
    roles = {
        "analyst": Role("analyst", team.format("analyst") +
            "You break the task down: what is asked, the sub-problems, a step-by-step plan the coder can "
            "follow, and the cases worth testing. You do not produce the result yourself."),
        "coder": Role("coder", team.format("coder") +
            "Following the analyst's plan, you produce {deliverable}."),
        "tester": Role("tester", team.format("tester") +
            "You examine the coder's result against the task and the plan, trying it on ordinary cases and "
            "on the cases most likely to break it. Your reply is the team's final output: correct every "
            "problem you find."),
    }
    steps = [[Turn("analyst", ("coder",), "Write your analysis and plan for the coder.")],
             [Turn("coder", ("tester",), "Following the plan, produce {deliverable}.")],
             [Turn("tester", (), "Test the coder's result and give the team's final, corrected result. {final}")]]
    return System("self-collab", "linear", roles, steps, "tester", faulty_role or "coder")


def camel(faulty_role=None, rounds=None) -> System:
    rounds = _rounds(rounds, 2)
    pair = "You are the AI {} in a two-agent role-play that is {{job}}. "
    roles = {
        "user": Role("user", pair.format("user") +
            "You own the task. You instruct the assistant one step at a time, check what it gives back, "
            "point out anything wrong or missing, and when the work is done you state the final result."),
        "assistant": Role("assistant", pair.format("assistant") +
            "You follow the user's instructions: you carry out each one fully, showing your work, and you "
            "act on the user's feedback."),
    }
    steps = [[Turn("user", ("assistant",), "Give the assistant its first instruction towards {deliverable}.")]]
    for r in range(rounds):
        steps.append([Turn("assistant", ("user",), "Carry out the user's latest instruction.")])
        if r < rounds - 1:
            steps.append([Turn("user", ("assistant",),
                               "Check the assistant's reply; point out any error and give your next instruction.")])
    steps.append([Turn("user", (), "Check the assistant's work and state the final result yourself. {final}")])
    return System("camel", "flat", roles, steps, "user", faulty_role or "assistant", rounds)


SPP_EXTRA = 3  # SPP's teams have 2-5 participants: the lead, the domain expert and up to 3 more
_PERSONA = re.compile(r"^[\W_]*persona\s*\d*\s*[:=-]\s*(.+?)\s*$", re.I | re.M)
_UNSAFE = re.compile(r"[^\w ,.'&/()+-]")  # a persona's name goes into a profile: plain words only
SPP_PLAN = ("Before the session starts, decide who takes part. Besides yourself and {expert}, name the further "
            "personas (none, or up to three) whose knowledge this task needs, one per line as `Persona: <who>`; "
            "write `Persona: none` if the two of you suffice.")


def spp(faulty_role=None, rounds=None, personas=None) -> System:
    """SPP as its method runs it: the model chooses the team. Each run starts with the lead naming the
    personas besides itself and the domain expert (plan_spp); they then brainstorm, the lead drafts, they
    give feedback, the lead answers. personas None: the system before planning (lead and expert: the
    roles a fault may name; an unplanned run is the two-participant team); else the names chosen."""
    rounds = _rounds(rounds, 1)
    session = "You take part in a solo-performance-prompting session, a collaboration of personas that is {job}. "
    roles = {
        "lead": Role("lead", session + "You are the AI Assistant who leads it: you gather the personas' ideas, "
                     "write the answer, revise it with their feedback, and give the final answer."),
        "expert": Role("expert", session + "You are {expert}. You bring your domain knowledge: the facts, "
                       "methods and traps that matter for this task, and you check drafts for errors in your field."),
    }
    for i, who in enumerate(personas or (), 2):
        roles[f"persona_{i}"] = Role(f"persona_{i}", session + f"You are {who}. You bring what your knowledge "
                                     "says about this task and you check drafts for errors it can see.")
    everyone = tuple(roles)
    speakers = everyone[1:]

    def to_others(name):
        return tuple(n for n in everyone if n != name)
    steps = [[Turn(who, to_others(who), "Share what your knowledge says about how to do this task.")]
             for who in speakers]
    steps.append([Turn("lead", to_others("lead"), "Using the personas' ideas, write a draft: {deliverable}.")])
    for r in range(rounds):
        feedback = "Give feedback on the lead's draft: name any error and its fix."
        steps += [[Turn(who, to_others(who), feedback)] for who in speakers]
        if r < rounds - 1:
            steps.append([Turn("lead", to_others("lead"), "Revise the draft with the feedback: {deliverable}.")])
    steps.append([Turn("lead", (), "Revise with the feedback and give the final answer. {final}")])
    plan = None if personas is not None else functools.partial(plan_spp, faulty_role, rounds)
    return System("spp", "flat", roles, steps, "lead", faulty_role or "expert", rounds, plan)


def spp_personas(text) -> list:
    """The further personas a planning reply names (at most SPP_EXTRA, each a plain name of <= 60
    characters, no repeats; `none` and names of the two fixed participants dropped)."""
    names = []
    for raw in _PERSONA.findall(text or ""):
        name = _UNSAFE.sub("", raw).strip(" .,")[:60].strip()
        if name and name.lower() not in ("none", "ai assistant", "yourself") and name.lower() not in map(str.lower, names):
            names.append(name)
    return names[:SPP_EXTRA]


async def plan_spp(faulty_role, rounds, llm, task, kind, params):
    """(this task's SPP, the planning record): the lead names the team, as SPP's method does."""
    base = spp(faulty_role, rounds, personas=())
    messages = agent_messages(base.roles["lead"].render(kind), task, kind, Turn("lead", (), SPP_PLAN), [])
    out = await llm.chat(messages, params, tag="agent")
    names = spp_personas(out.text)
    return spp(faulty_role, rounds, personas=names), {"by": "lead", "reply": out.text, "personas": names,
                                                       "participants": 2 + len(names)}


def mad(faulty_role=None, rounds=None) -> System:
    rounds = _rounds(rounds, 2)
    debate = "You are {} in a debate about a task of {{job}}. "
    roles = {
        "affirmative": Role("affirmative", debate.format("the affirmative debater") +
            "You propose a solution, argue for it with clear reasoning, and answer the other side's "
            "objections; where they show you are wrong, you correct your solution."),
        "negative": Role("negative", debate.format("the negative debater") +
            "You scrutinise the affirmative side's solution, point out every error you find with reasons, "
            "and put forward your own solution where you disagree; you concede what is right."),
        "judge": Role("judge", debate.format("the judge") +
            "You follow both debaters' arguments, weigh the evidence, and at the end decide the correct "
            "result yourself."),
    }
    steps = []
    for r in range(rounds):
        first = r == 0
        steps += [[Turn("affirmative", ("negative", "judge"),
                        "Present your solution: {deliverable}." if first else
                        "Answer the negative side and give your updated solution.")],
                  [Turn("negative", ("affirmative", "judge"),
                        "Scrutinise the affirmative solution and give your own view." if first else
                        "Answer the affirmative side and give your updated view.")]]
    steps.append([Turn("judge", (), "The debate is over. Decide the correct result. {final}")])
    return System("mad", "hierarchical", roles, steps, "judge", faulty_role or "affirmative", rounds)


def agentverse(faulty_role=None, rounds=None) -> System:
    """AgentVerse's task-solving loop in one pass: the recruiter recruits the experts; in the vertical
    decision stage the solver proposes and the reviewer and the critic review it (concurrently) for
    `rounds` rounds, the solver revising each time; then the critic, in the place of AgentVerse's
    execution and evaluation stages, checks the solver's final solution and gives the answer."""
    rounds = _rounds(rounds, 2)
    group = "You are {} in a group of experts (a recruiter, a solver, a reviewer and a critic) that is {{job}}. "
    roles = {
        "recruiter": Role("recruiter", group.format("the recruiter") +
            "You do not solve the task. You read it and recruit the experts it needs: for the solver, the "
            "reviewer and the critic you name the expertise each should bring and what each must watch for."),
        "solver": Role("solver", group.format("the solver") +
            "In the role the recruiter gave you, you write {deliverable} and revise it with the reviews, "
            "accepting only criticism that is correct."),
        "reviewer": Role("reviewer", group.format("the reviewer") +
            "In the role the recruiter gave you, you review the solver's proposal: you name each error in its "
            "reasoning, calculations, code behaviour or meaning and how to fix it, or say that it is correct."),
        "critic": Role("critic", group.format("the critic") +
            "In the role the recruiter gave you, you review the solver's proposals for errors and for missed "
            "requirements, edge cases and the form of the answer. You also have the last word: you check the "
            "solver's final solution and give the group's answer, correcting every error you find."),
    }
    reviewers = ("reviewer", "critic")
    steps = [[Turn("recruiter", ("solver",) + reviewers,
                   "Recruit the experts: say, in a few lines each, what expertise the solver, the reviewer and "
                   "the critic should bring to this task and what each must watch for.")],
             [Turn("solver", reviewers, "Write your proposal: {deliverable}.")]]
    for r in range(rounds):
        steps.append([Turn(c, ("solver",), "Review the solver's latest proposal.") for c in reviewers])
        last = r == rounds - 1  # the final solution goes to the critic alone, who decides
        steps.append([Turn("solver", ("critic",) if last else reviewers,
                           "Revise your proposal with the reviews: {deliverable}.")])
    steps.append([Turn("critic", (), "Check the solver's final solution and give the group's final, corrected "
                                     "answer. {final}")])
    return System("agentverse", "hierarchical", roles, steps, "critic", faulty_role or "solver", rounds)


def _rounds(rounds, default, most=None):
    rounds = default if rounds is None else rounds
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    if most is not None and rounds > most:
        raise ValueError(f"a linear pipeline runs once: rounds must be 1, got {rounds}")
    return rounds


SYSTEMS = {"metagpt": metagpt, "self-collab": self_collab, "camel": camel, "spp": spp, "mad": mad,
           "agentverse": agentverse}


def build_system(name, faulty_role=None, rounds=None) -> System:
    """A system by name; faulty_role None: the system's default; rounds None: its default (linear: 1)."""
    if name not in SYSTEMS:
        raise ValueError(f"unknown system {name!r}; choose from {list(SYSTEMS)}")
    return SYSTEMS[name](faulty_role=faulty_role, rounds=rounds)
