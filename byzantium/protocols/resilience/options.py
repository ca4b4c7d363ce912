"""From the values of the command-line flags to the objects `run_system` takes, checked.

    --fault {none,autotransform,autoinject} --pm --pe --error-type   -> make_fault
    --defense {none,challenger,inspector,both}                          -> make_defense
`none` gives None: run_system then runs the system clean / undefended.
"""
from dataclasses import dataclass

from .autoinject import AutoInject
from .autotransform import AutoTransform
from .challenger import Challenger
from .inspector import Inspector

FAULTS = ("none", "autotransform", "autoinject")
DEFENSES = ("none", "challenger", "inspector", "both")


@dataclass
class Defense:
    name: str
    challenger: Challenger | None = None
    inspector: Inspector | None = None


def make_fault(name="none", pm=1.0, pe=0.2, error_type="semantic", seed=0, llm=None, cache_path=None):
    """llm: the model that writes the faults (None: the system's model); cache_path: AutoTransform's file."""
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; choose from {FAULTS}")
    if name == "autotransform":
        return AutoTransform(llm=llm, cache_path=cache_path)
    if name == "autoinject":
        return AutoInject(pm=pm, pe=pe, error_type=error_type, seed=seed, llm=llm)
    return None


def make_defense(name="none", llm=None):
    """llm: the Inspector's model (None: the system's model)."""
    if name not in DEFENSES:
        raise ValueError(f"unknown defense {name!r}; choose from {DEFENSES}")
    if name == "none":
        return None
    return Defense(name,
                   challenger=Challenger() if name in ("challenger", "both") else None,
                   inspector=Inspector(llm=llm) if name in ("inspector", "both") else None)
