"""The task record every protocol and metric works with."""

from dataclasses import dataclass, field

from .answers import AMBIGUOUS, KINDS, READ, Reading, is_correct, read_answer
from .answers.choice import LETTERS
from .answers.judgements import VERDICTS


@dataclass
class Task:
    """One problem. `gold` is the canonical gold answer: a letter for "choice", "yes"/"no" for
    "bool", "win"/"lose"/"tie" for "verdict", the final answer string otherwise (for a task with
    several accepted answers, metadata["accepted"] lists them all and `check` accepts any).
    `question` never contains the options; `prompt()` renders them as lettered lines the way BBH
    does."""
    id: str
    question: str
    choices: list | None
    gold: str
    kind: str
    metadata: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"task {self.id}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "choice":
            if not self.choices or len(self.choices) > len(LETTERS):
                raise ValueError(f"task {self.id}: a choice task needs 1..{len(LETTERS)} choices")
            if self.gold not in self.letters:
                raise ValueError(f"task {self.id}: gold {self.gold!r} is not one of {self.letters}")
        if self.kind == "verdict" and self.gold not in VERDICTS:
            raise ValueError(f"task {self.id}: a verdict's gold must be one of {VERDICTS}, got {self.gold!r}")
        if self.gold is None or str(self.gold).strip() == "":
            raise ValueError(f"task {self.id}: no gold answer")

    @property
    def letters(self) -> str:
        return LETTERS[:len(self.choices)] if self.choices else ""

    def prompt(self) -> str:
        """Question plus lettered options (for choice tasks)."""
        if not self.choices:
            return self.question
        opts = "\n".join(f"({l}) {c}" for l, c in zip(self.letters, self.choices))
        return f"{self.question}\nOptions:\n{opts}"

    def read(self, text) -> Reading:
        """What this output commits to (read_answer). A gold that is itself a disjunction ("6 or 12":
        both are answers) is stated by a reply that names exactly those alternatives."""
        reading = read_answer(text, self.kind, self.choices)
        if reading.status == AMBIGUOUS and reading.said:
            golds = self.accepted if isinstance(self.accepted, (list, tuple)) else [self.accepted]
            if any(" or " in str(g) and is_correct(reading.said, g, "text") for g in golds):
                return Reading(reading.said, READ)
        return reading

    def extract(self, text):
        return self.read(text).value

    @property
    def accepted(self):
        """What `is_correct` compares with: the list of accepted answers when there are several, else gold."""
        return self.metadata.get("accepted") or self.gold

    def accepts(self, answer) -> bool:
        """Is this extracted answer correct? (the one `is_correct`, against every accepted answer)"""
        return is_correct(answer, self.accepted, self.kind)

    def check(self, text) -> bool:
        """Is this model output's stated answer correct? (extract, then `accepts`)."""
        return self.accepts(self.extract(text))
