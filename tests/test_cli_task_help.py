"""Each run method's --task help lists what that method accepts, read from the tables the method checks
against (byzantium.tasks for maj/rr/rrmaj/sac/cpwbft, the resilience tasks for resilience), so that a
task added to a table shows in the help."""
import argparse
import re

import pytest

from byzantium.commands import load_questions
from byzantium.experiments.run_command import RUN_METHODS
from byzantium.tasks import FORMATS, HUB, TASKS


def task_action(method):
    """The --task flag of `byzantium run METHOD`, as the method's own flags define it."""
    ap = argparse.ArgumentParser()
    method.add_args(ap)
    return ap._option_string_actions["--task"]


def listed_names(action):
    return set(re.findall(r"[a-z][a-z0-9-]*", action.help))


@pytest.mark.parametrize("method", RUN_METHODS, ids=lambda method: method.name)
def test_the_task_help_lists_every_task_the_method_accepts(method):
    action = task_action(method)
    accepted = set(action.choices) if action.choices else {*TASKS, *FORMATS, *HUB}
    assert accepted <= listed_names(action), f"{method.name} --task help misses {sorted(accepted - listed_names(action))}"


@pytest.mark.parametrize("name", list(TASKS))
def test_each_generator_the_help_lists_is_accepted(name):
    args = argparse.Namespace(task=name, data=None, limit=2, seed=0, sample=None, sample_seed=0)
    tasks = load_questions(args)
    assert len(tasks) == 2 and all(task.question for task in tasks)
