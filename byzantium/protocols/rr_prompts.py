"""The prompt every agent of MAJ and RR reads, and the sampling temperature: the same for both, so their
accuracies compare."""

# The paper's method treats the M trajectories (and MAJ's N answers) as independent samples; at
# temperature 0 agents with the same model and prompt would all write the same text. The paper states
# no temperature; 0.7 is ours.
TEMPERATURE = 0.7

SYSTEM = "You are a careful problem solver. Reason briefly, step by step, then state the final answer."

FORMAT = {
    "choice": 'Choose one option. End your reply with "The answer is (X)." where X is the option letter.',
    "number": 'End your reply with "The answer is N." where N is a number.',
    "bool": 'End your reply with "The answer is yes." or "The answer is no."',
}
DEFAULT_FORMAT = 'End your reply with "The answer is ..." followed by your final answer.'


def agent_messages(task, injection=None, system=SYSTEM) -> list[dict]:
    """System + user messages: the question (with lettered options), the answer format and, for a
    corrupted agent, the injection appended at the end of the user query."""
    user = f"{task.prompt()}\n\n{FORMAT.get(task.kind, DEFAULT_FORMAT)}"
    if injection:
        user += f"\n\n{injection}"
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


__all__ = ["TEMPERATURE", "SYSTEM", "agent_messages"]
