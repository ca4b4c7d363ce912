"""Loaders for benchmark files in their original formats, and for `datasets` hub ids.

One parser per format turns a raw record into a `Task`. The format is named, or detected from the
fields of the first record. Besides each benchmark's original release format, the parsers accept
the shapes of the same data on the Hugging Face hub (ARC/OpenBookQA `choices` as a dict of lists,
integer RTE labels) and MosaicML's eval-gauntlet copies (`query`/`choices`/`gold`) of ARC, BoolQ
and OpenBookQA.
"""

import gzip
import json
import random
import re
from pathlib import Path

from .answers.choice import LETTERS
from .answers.reading import last_boxed
from .record import Task

FORMATS = ("math500", "gsm8k", "aqua", "bbh", "arc", "boolq", "obqa", "rte", "hellaswag")

# Dataset name -> (hub id, config, split) for `load_hub`.
HUB = {
    "math500": ("HuggingFaceH4/MATH-500", None, "test"),
    "gsm8k": ("openai/gsm8k", "main", "test"),
    "aqua": ("deepmind/aqua_rat", "raw", "test"),
    "bbh": ("lukaemon/bbh", None, "test"),  # needs a config: "bbh:logical_deduction_three_objects"
    "arc": ("allenai/ai2_arc", "ARC-Challenge", "test"),
    "boolq": ("google/boolq", None, "validation"),
    "obqa": ("allenai/openbookqa", "main", "test"),
    "rte": ("aps/super_glue", "rte", "validation"),
    "hellaswag": ("Rowan/hellaswag", None, "validation"),
}


# ---------------------------------------------------------------------------------------- reading

def read_records(path):
    """Records of a JSONL file (optionally .gz), a JSON array, or a BBH-style {"examples": [...]}."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read()
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, list):
        return whole
    if isinstance(whole, dict):
        return whole["examples"] if isinstance(whole.get("examples"), list) else [whole]
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
    return records


def detect_format(rec: dict) -> str:
    """The format name for a record, from its fields."""
    k = set(rec)
    if {"problem", "solution"} <= k:
        return "math500"
    if {"question", "options", "correct"} <= k:
        return "aqua"
    if {"input", "target"} <= k:
        return "bbh"
    if {"ctx", "endings"} <= k:
        return "hellaswag"
    if {"premise", "hypothesis"} <= k or {"sentence1", "sentence2"} <= k:
        return "rte"
    if {"question", "passage"} <= k:
        return "boolq"
    if "question_stem" in k or ("fact1" in k and "answerKey" in k):
        return "obqa"
    if "answerKey" in k:
        return "arc"  # ARC and OpenBookQA share this shape; the parser is the same
    if {"question", "answer"} <= k and "####" in str(rec["answer"]):
        return "gsm8k"
    if {"query", "choices", "gold"} <= k:
        q = str(rec["query"])
        if [str(c).lower() for c in rec["choices"]] == ["no", "yes"] or q.startswith("Passage:"):
            return "boolq"
        return "arc" if q.startswith("Question:") else "obqa"
    raise ValueError(f"cannot tell the dataset format from the fields {sorted(k)}; "
                     f"pass format= one of {FORMATS}")


def load_jsonl(path, format=None, limit=None, seed=None):
    """Tasks from a local file. With `seed`, a seeded shuffle picks which `limit` records."""
    records = read_records(path)
    if not records:
        raise ValueError(f"{path}: no records")
    fmt = format or detect_format(records[0])
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; known: {FORMATS}")
    return pick_tasks([parse_record(r, fmt, i) for i, r in enumerate(records)], limit, seed)


def load_hub(name, config=None, split=None, format=None, limit=None, seed=None):
    """Tasks from a `datasets` hub id (or a dataset name in HUB), mapped by the same parsers."""
    if name.split(":")[0] in HUB:
        base, _, cfg = name.partition(":")
        hub_id, hub_cfg, hub_split = HUB[base]
        format, config, split = format or base, config or cfg or hub_cfg, split or hub_split
    else:
        hub_id = name
    try:
        import datasets
    except ImportError:
        raise RuntimeError(f"loading {name!r} from the hub needs the `datasets` package "
                           f"(pip install datasets); or pass a local JSONL file") from None
    try:
        ds = datasets.load_dataset(hub_id, config, split=split or "test")
    except Exception as e:
        raise RuntimeError(f"could not load {hub_id!r} (config={config}, split={split}) from the "
                           f"hub; offline? Pass a local JSONL file instead. ({type(e).__name__}: {e})") from None
    records = [dict(r) for r in ds]
    if not records:
        raise ValueError(f"{hub_id}: no records")
    fmt = format or detect_format(records[0])
    return pick_tasks([parse_record(r, fmt, i) for i, r in enumerate(records)], limit, seed)


def sample_tasks(tasks, n, seed=0):
    """n of the tasks drawn at random by `seed`, kept in the data set's order: a fixed sample that does
    not move with the generation seed (the papers test "128 random questions" a data set)."""
    if n > len(tasks):
        raise ValueError(f"--sample {n}: the data set has only {len(tasks)} problems")
    keep = sorted(random.Random(seed).sample(range(len(tasks)), n))
    return [tasks[i] for i in keep]


def pick_tasks(tasks, limit, seed):
    """The tasks a load returns: all of them, shuffled by `seed` when one is given, then the first `limit`."""
    if seed is not None:
        tasks = list(tasks)
        random.Random(seed).shuffle(tasks)
    return tasks[:limit] if limit is not None else tasks


# ---------------------------------------------------------------------------------------- parsers

def parse_record(rec: dict, fmt: str, index: int) -> Task:
    try:
        return _PARSERS[fmt](rec, index)
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise ValueError(f"record {index} is not in {fmt} format: {type(e).__name__}: {e}") from None


def _id(fmt, rec, index, *keys):
    for k in keys + ("src_idx",):
        if rec.get(k) not in (None, ""):
            return f"{fmt}-{rec[k]}"
    return f"{fmt}-{index}"


def _meta(rec, used, **extra):
    return {**{k: v for k, v in rec.items() if k not in used}, **extra}


def _math500(rec, i):
    gold = rec.get("answer") or last_boxed(rec["solution"])
    if gold is None:
        raise ValueError("no `answer` field and no \\boxed{} in the solution")
    return Task(_id("math500", rec, i, "unique_id"), rec["problem"], None, str(gold), "math",
                _meta(rec, {"problem", "answer"}, format="math500"))


def _gsm8k(rec, i):
    gold = rec.get("final_answer") or rec["answer"].split("####")[-1]
    gold = gold.strip().replace(",", "")
    return Task(_id("gsm8k", rec, i), rec["question"], None, gold, "number",
                _meta(rec, {"question", "final_answer"}, format="gsm8k"))


def _aqua(rec, i):
    choices = [re.sub(r"^\s*[A-Ja-j]\s*\)\s*", "", o) for o in rec["options"]]
    return Task(_id("aqua", rec, i), rec["question"], choices, rec["correct"].strip().upper(), "choice",
                _meta(rec, {"question", "options", "correct"}, format="aqua"))


def _bbh(rec, i):
    text, target = rec["input"], str(rec["target"]).strip()
    base = dict(format="bbh")
    m = re.fullmatch(r"\(([A-J])\)", target)
    if m and "\nOptions:\n" in text:
        question, opts = text.split("\nOptions:\n", 1)
        choices = [re.sub(r"^\([A-J]\)\s*", "", o) for o in opts.strip().split("\n")]
        return Task(_id("bbh", rec, i), question, choices, m.group(1), "choice", _meta(rec, {"input", "target"}, **base))
    if target.lower() in ("true", "false", "yes", "no"):
        gold, kind = ("yes" if target.lower() in ("true", "yes") else "no"), "bool"
    elif re.fullmatch(r"-?\d+", target):
        gold, kind = target, "number"
    else:
        gold, kind = target, "text"
    return Task(_id("bbh", rec, i), text, None, gold, kind, _meta(rec, {"input", "target"}, **base))


def _multiple_choice(fmt):
    """ARC / OpenBookQA: original ({question: {stem, choices: [{text, label}]}, answerKey}),
    hub ({question or question_stem, choices: {text: [], label: []}, answerKey}) or gauntlet."""
    def parse(rec, i):
        if "query" in rec:
            question = re.sub(r"^Question:\s*", "", rec["query"])
            choices, gold = list(rec["choices"]), LETTERS[int(rec["gold"])]
            return Task(_id(fmt, rec, i), question, choices, gold, "choice",
                        _meta(rec, {"query", "choices", "gold", "answer"}, format=fmt))
        q = rec.get("question_stem") or rec["question"]
        if isinstance(q, dict):
            stem, ch = q["stem"], q["choices"]
            texts, labels = [c["text"] for c in ch], [str(c["label"]) for c in ch]
        else:
            stem, ch = q, rec["choices"]
            texts, labels = list(ch["text"]), [str(x) for x in ch["label"]]
        # ARC labels are sometimes "1".."4": the gold is the position of answerKey among labels.
        gold = LETTERS[labels.index(str(rec["answerKey"]).strip())]
        return Task(_id(fmt, rec, i, "id"), stem, texts, gold, "choice",
                    _meta(rec, {"question", "question_stem", "choices", "answerKey"}, format=fmt))
    return parse


def _boolq(rec, i):
    if "query" in rec:
        gold = str(rec["choices"][int(rec["gold"])]).lower()
        return Task(_id("boolq", rec, i), rec["query"], None, gold, "bool",
                    _meta(rec, {"query", "choices", "gold", "answer"}, format="boolq"))
    ans = rec["answer"] if "answer" in rec else rec["label"]
    if isinstance(ans, str):
        ans = ans.strip().lower() in ("true", "yes", "1")
    question = rec["question"].strip()
    question = question[0].upper() + question[1:] + ("" if question.endswith("?") else "?")
    return Task(_id("boolq", rec, i, "idx"), f"Passage: {rec['passage']}\nQuestion: {question}", None,
                "yes" if ans else "no", "bool", _meta(rec, {"question", "passage", "answer", "label"}, format="boolq"))


def _rte(rec, i):
    premise = rec.get("premise", rec.get("sentence1"))
    hypothesis = rec.get("hypothesis", rec.get("sentence2"))
    label = rec["label"]
    if isinstance(label, str) and label.strip().lstrip("-").isdigit():
        label = int(label)
    if label in (-1, "", None):
        raise ValueError("record has no label (a test split?)")
    entails = label == 0 if isinstance(label, int) else label.strip().lower() == "entailment"
    question = (f"Premise: {premise}\nHypothesis: {hypothesis}\n"
                f"Does the premise entail the hypothesis? Answer yes or no.")
    return Task(_id("rte", rec, i, "idx"), question, None, "yes" if entails else "no", "bool",
                _meta(rec, {"premise", "hypothesis", "sentence1", "sentence2"}, format="rte"))


def _hellaswag(rec, i):
    label = rec["label"]
    if label in ("", None):
        raise ValueError("record has no label (a test split?)")
    endings = list(rec["endings"])
    context = rec["ctx"]
    if rec.get("activity_label"):
        context = f"{rec['activity_label']}: {context}"
    question = f"Which ending is the most plausible continuation?\n{context}"
    return Task(_id("hellaswag", rec, i, "ind"), question, endings, LETTERS[int(label)], "choice",
                _meta(rec, {"ctx", "endings"}, format="hellaswag"))


_PARSERS = {"math500": _math500, "gsm8k": _gsm8k, "aqua": _aqua, "bbh": _bbh,
            "arc": _multiple_choice("arc"), "obqa": _multiple_choice("obqa"),
            "boolq": _boolq, "rte": _rte, "hellaswag": _hellaswag}
