"""Resilience of collaboration structures ("On the Resilience of LLM-Based Multi-Agent Collaboration with
Faulty Agents"): six systems as data, one runner, two faults (AutoTransform, AutoInject) and two
defences (Challenger, Inspector).

    system = build_system("self-collab", faulty_role="coder")
    fault = make_fault("autoinject", pm=1.0, pe=0.2, error_type="semantic", seed=0)
    defense = make_defense("both")
    records = await asyncio.gather(*(run_system(system, t, llm, fault, defense) for t in tasks))
    records[0]["output"]  # the system's final text, for the task layer to score
"""
from .autoinject import AutoInject
from .autotransform import AutoTransform
from .challenger import Challenger
from .inspector import Inspector
from .kinds import KINDS, kind_of
from .options import DEFENSES, FAULTS, Defense, make_defense, make_fault
from .structures import STRUCTURES, Fault, Role, System, Turn, run_system
from .systems import SYSTEMS, build_system

__all__ = ["AutoInject", "AutoTransform", "Challenger", "Inspector", "KINDS", "kind_of", "DEFENSES", "FAULTS",
           "Defense", "make_defense", "make_fault", "STRUCTURES", "Fault", "Role", "System", "Turn", "run_system",
           "SYSTEMS", "build_system"]
