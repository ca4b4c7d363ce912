"""The tasks of the resilience study (system 3): code, math, translation, text evaluation.

    load_resilience_task("humaneval", "../shared/data/HumanEval.jsonl.gz", limit=20, seed=0)
    load_resilience_task("ciar", "../shared/data")          a directory: its usual file name
    load_resilience_task("gen-code", limit=2)               built in, no file (also gen-arith)
    score_output(task, output_text) -> {"kind", "score", "correct", "detail"}
    aggregate([score_output(...), ...]) -> {"n", "score", "accuracy", "bleu", "chrf", ...}

Files are read in their original formats (JSONL, .gz, or the JSON arrays they were released as):
    humaneval  task_id, prompt, entry_point, canonical_solution, test        -> kind "code"
    ciar       question, answer (accepted strings), "incorrect answer"       -> kind "math"
    commonmt   chinese_source, english_target_correct, english_target_wrong  -> kind "translation"
    faireval   question_id, question, response {gpt35, vicuna}, human_label  -> kind "verdict"

Each task's `question` is what an agent is asked (with a line saying what to answer); the raw
fields stay in `metadata`. FairEval shows the gpt35 answer as "Assistant 1" (FairEval's own
order) unless `first="vicuna"`; the gold is "win" when the human judges preferred Assistant 1,
"lose" for Assistant 2, "tie".

Scores are in [0, 1] per item: code = pass@1 of one completion (tests run in the sandbox), math
and verdict = 1 if correct, translation = sentence chrF / 100 (BLEU too in `detail`). `aggregate`
averages them and adds corpus-level BLEU and chrF (sacrebleu) for translations, and BLEURT when
the `bleurt` package is importable and a checkpoint is given.
"""

import gzip
import json
import random
from pathlib import Path

from .answers import is_correct
from .generators import gen_arith
from .humaneval import check_humaneval
from .loaders import pick_tasks, read_records
from .record import Task
from .sandbox import SandboxUnavailable

RESILIENCE_TASKS = ("humaneval", "ciar", "commonmt", "faireval")
BUILTIN_TASKS = ("gen-code", "gen-arith")  # tiny problem sets for end-to-end tests, no files
DATA_FILES = {"humaneval": "HumanEval.jsonl.gz", "ciar": "ciar.jsonl", "commonmt": "commonmt_lexical.jsonl",
              "faireval": "faireval.jsonl"}
BUILTIN_N = 100

CODE_INSTRUCTION = ("Complete the following Python function. Answer with the complete function "
                    "in one ```python code block.")
TRANSLATION_INSTRUCTION = "Translate the following Chinese sentence into English. Answer with the translation only."
VERDICT_INSTRUCTION = ("Which assistant answered the question better? Consider helpfulness, relevance, "
                       "accuracy and level of detail. End with one line: \"Verdict: Assistant 1\", "
                       "\"Verdict: Assistant 2\" or \"Verdict: tie\".")
FAIREVAL_MODELS = ("gpt35", "vicuna")


# ---------------------------------------------------------------------------------------- loading

def load_resilience_task(name, path=None, limit=None, seed=None):
    """Tasks of one resilience task. For the four files, `path` is the file or a directory holding
    it under its usual name, and `seed` (when given) shuffles before `limit` picks; for the built-in
    sets `path` is ignored, `seed` is the generator seed (default 0) and `limit` the number of
    problems (default 100)."""
    if name in BUILTIN_TASKS:
        n = BUILTIN_N if limit is None else limit
        return (gen_code if name == "gen-code" else gen_arith)(n, seed=0 if seed is None else seed)
    if name not in RESILIENCE_TASKS:
        raise ValueError(f"unknown resilience task {name!r}; known: {RESILIENCE_TASKS + BUILTIN_TASKS}")
    if path is None:
        raise ValueError(f"task {name!r} needs its data file ({DATA_FILES[name]}): pass its path or its directory")
    path = Path(path)
    if path.is_dir():
        path = path / DATA_FILES[name]
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file (task {name!r} expects {DATA_FILES[name]})")
    records = read_records(path)
    if not records:
        raise ValueError(f"{path}: no records")
    return pick_tasks([parse_resilience_record(r, name, i) for i, r in enumerate(records)], limit, seed)


def detect_resilience_format(rec):
    """Which of RESILIENCE_TASKS a record belongs to, from its fields; None when none."""
    k = set(rec) if isinstance(rec, dict) else set()
    if {"prompt", "entry_point", "test"} <= k:
        return "humaneval"
    if {"question", "answer", "incorrect answer"} <= k:
        return "ciar"
    if {"chinese_source", "english_target_correct"} <= k:
        return "commonmt"
    if {"question", "response"} <= k and isinstance(rec["response"], dict):
        return "faireval"
    return None


def sniff_resilience_format(path):
    """The resilience format of a data file, from its first record (read cheaply); None if other."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        first = f.readline()
    try:
        rec = json.loads(first)
    except json.JSONDecodeError:  # a pretty-printed JSON array or object: read it whole
        rec = read_records(path)
    if isinstance(rec, list):
        rec = rec[0] if rec else None
    return detect_resilience_format(rec)


def parse_resilience_record(rec, name, index, **options):
    try:
        return _PARSERS[name](rec, index, **options)
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise ValueError(f"record {index} is not in {name} format: {type(e).__name__}: {e}") from None


def code_task(rec, index=0, fmt="humaneval"):
    """A Task from a HumanEval-format record (also what gen-code builds)."""
    prompt = rec["prompt"]
    question = f"{CODE_INSTRUCTION}\n\n```python\n{prompt.strip()}\n```"
    meta = {k: v for k, v in rec.items() if k != "canonical_solution"}
    return Task(str(rec.get("task_id") or f"{fmt}-{index}"), question, None, rec["canonical_solution"], "code",
                {**meta, "format": fmt})


def _ciar(rec, i):
    accepted = rec["answer"] if isinstance(rec["answer"], list) else [rec["answer"]]
    accepted = [str(a).strip() for a in accepted if str(a).strip()]
    if not accepted:
        raise ValueError("no accepted answer")
    meta = {k: v for k, v in rec.items() if k not in ("question", "answer")}
    return Task(_id("ciar", rec, i, "src_idx"), rec["question"], None, accepted[0], "math",
                {**meta, "accepted": accepted, "format": "ciar"})


def _commonmt(rec, i):
    source = rec["chinese_source"]
    return Task(_id("commonmt", rec, i, "src_idx"), f"{TRANSLATION_INSTRUCTION}\n\n{source}", None,
                rec["english_target_correct"], "translation",
                {"source": source, "reference": rec["english_target_correct"],
                 "wrong": rec.get("english_target_wrong"), "index": i, "format": "commonmt"})


def _faireval(rec, i, first="gpt35"):
    if first not in FAIREVAL_MODELS:
        raise ValueError(f"first must be one of {FAIREVAL_MODELS}, got {first!r}")
    if "human_label" not in rec:
        raise ValueError("no human_label (the MAS-Resilience FairEval.json has none; use the file with labels)")
    second = FAIREVAL_MODELS[1 - FAIREVAL_MODELS.index(first)]
    label = rec["human_label"]
    gold = {first: "win", second: "lose", "tie": "tie"}.get(label)
    if gold is None:
        raise ValueError(f"human_label must be one of {FAIREVAL_MODELS + ('tie',)}, got {label!r}")
    a1, a2 = rec["response"][first], rec["response"][second]
    question = (f"[Question]\n{rec['question']}\n\n"
                f"[The Start of Assistant 1's Answer]\n{a1}\n[The End of Assistant 1's Answer]\n\n"
                f"[The Start of Assistant 2's Answer]\n{a2}\n[The End of Assistant 2's Answer]\n\n"
                f"{VERDICT_INSTRUCTION}")
    meta = {k: v for k, v in rec.items() if k != "response"}
    return Task(_id("faireval", rec, i, "question_id"), question, None, gold, "verdict",
                {**meta, "first": first, "second": second, "user_question": rec["question"],
                 "answers": [a1, a2], "format": "faireval"})


def _id(fmt, rec, index, key):
    return f"{fmt}-{rec[key]}" if rec.get(key) not in (None, "") else f"{fmt}-{index}"


_PARSERS = {"humaneval": code_task, "ciar": _ciar, "commonmt": _commonmt, "faireval": _faireval}


def load_faireval(path, limit=None, seed=None, first="gpt35"):
    """FairEval with either model's answer shown first (positional bias is what FairEval studies)."""
    records = read_records(path)
    return pick_tasks([parse_resilience_record(r, "faireval", i, first=first) for i, r in enumerate(records)],
                      limit, seed)


# --------------------------------------------------------------------------------------- gen-code

# name, signature, docstring, body, reference, input maker. The reference computes the tests'
# expected values, so a template cannot disagree with its own solution.
_CODE_TEMPLATES = [
    ("add_{k}", "x: int) -> int", "Return x plus {k}.", "return x + {k}",
     lambda k: lambda x: x + k, lambda r: (r.randint(-20, 50),)),
    ("multiply", "a: int, b: int) -> int", "Return the product of a and b.", "return a * b",
     lambda k: lambda a, b: a * b, lambda r: (r.randint(-9, 12), r.randint(0, 12))),
    ("largest", "numbers: list) -> int", "Return the largest number in the non-empty list numbers.",
     "return max(numbers)", lambda k: max, lambda r: ([r.randint(-30, 30) for _ in range(r.randint(1, 6))],)),
    ("total", "numbers: list) -> int", "Return the sum of the numbers in the list numbers.",
     "return sum(numbers)", lambda k: sum, lambda r: ([r.randint(-10, 30) for _ in range(r.randint(0, 6))],)),
    ("reverse_text", "text: str) -> str", "Return text reversed.", "return text[::-1]",
     lambda k: lambda s: s[::-1], lambda r: (_word(r),)),
    ("count_vowels", "text: str) -> int",
     "Return how many of the letters in the lowercase text are vowels (a, e, i, o, u).",
     "return sum(ch in 'aeiou' for ch in text)", lambda k: lambda s: sum(ch in "aeiou" for ch in s),
     lambda r: (_word(r),)),
    ("is_even", "n: int) -> bool", "Return True if n is even and False otherwise.", "return n % 2 == 0",
     lambda k: lambda n: n % 2 == 0, lambda r: (r.randint(-50, 50),)),
    ("squares", "numbers: list) -> list", "Return a list of the squares of the numbers in numbers, in order.",
     "return [x * x for x in numbers]", lambda k: lambda xs: [x * x for x in xs],
     lambda r: ([r.randint(-9, 9) for _ in range(r.randint(0, 5))],)),
    ("times_{k}", "x: int) -> int", "Return x multiplied by {k}.", "return x * {k}",
     lambda k: lambda x: x * k, lambda r: (r.randint(-12, 20),)),
]


def _word(rng):
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 8)))


def gen_code(n, seed=0):
    """Simple Python function problems in HumanEval format (prompt with signature and docstring,
    entry_point, canonical_solution, test with check(candidate)); problem i depends only on
    (seed, i)."""
    tasks = []
    for i in range(n):
        rng = random.Random(f"gen-code:{seed}:{i}")
        name, sig, doc, body, ref, make = rng.choice(_CODE_TEMPLATES)
        k = rng.randint(2, 9)
        name, doc, body, fn = name.format(k=k), doc.format(k=k), body.format(k=k), ref(k)
        cases = [make(rng) for _ in range(5)]
        example = cases[0]
        args = ", ".join(map(repr, example))
        prompt = (f"def {name}({sig}:\n    \"\"\" {doc}\n    >>> {name}({args})\n    {fn(*example)!r}\n"
                  f"    \"\"\"\n")
        test = "def check(candidate):\n" + "".join(
            f"    assert candidate({', '.join(map(repr, c))}) == {fn(*c)!r}\n" for c in cases)
        rec = {"task_id": f"gen-code-{seed}-{i}", "prompt": prompt, "entry_point": name,
               "canonical_solution": f"    {body}\n", "test": test}
        task = code_task(rec, i, fmt="gen-code")
        task.metadata.update(seed=seed, index=i)
        tasks.append(task)
    return tasks


# ---------------------------------------------------------------------------------------- scoring

def score_output(task, output_text, timeout_s=10.0, memory_mb=1024, allow_missing=()):
    """Score one system output for one task: {"kind", "score" in [0, 1], "correct" (None for
    translations), "detail"}. JSON-serialisable, so it can go straight into results.jsonl."""
    kind = task.kind
    if kind == "code" and "test" in task.metadata:
        try:
            res = check_humaneval(task, output_text or "", timeout_s=timeout_s, memory_mb=memory_mb,
                                  allow_missing=allow_missing)
        except SandboxUnavailable:
            raise  # this machine cannot run code: no verdict on any completion
        except Exception as e:  # noqa: BLE001 - whatever a completion makes go wrong is its failure, and counted
            return {"kind": kind, "score": 0.0, "correct": False,
                    "detail": {"status": "error", "seconds": 0.0, "stderr": f"{type(e).__name__}: {str(e)[:1000]}"}}
        return {"kind": kind, "score": float(res.passed), "correct": res.passed,
                "detail": {"status": res.status, "seconds": round(res.seconds, 3), "stderr": res.stderr[-1000:]}}
    if kind == "translation":
        import sacrebleu
        hyp, ref = task.extract(output_text) or "", task.gold
        bleu = sacrebleu.sentence_bleu(hyp, [ref]).score
        chrf = sacrebleu.sentence_chrf(hyp, [ref]).score
        return {"kind": kind, "score": chrf / 100, "correct": None,
                "detail": {"hypothesis": hyp, "reference": ref, "bleu": bleu, "chrf": chrf}}
    answer = task.extract(output_text)
    correct = is_correct(answer, task.metadata.get("accepted") or task.gold, kind)
    return {"kind": kind, "score": float(correct), "correct": correct, "detail": {"answer": answer, "gold": task.gold}}


def aggregate(scores, bleurt_checkpoint=None):
    """Corpus-level numbers from score_output dicts: n, score (mean of item scores: pass@1,
    accuracy or mean sentence chrF / 100), accuracy (over items with a `correct`), and for
    translations corpus BLEU and chrF (0-100, sacrebleu) and, with `bleurt_checkpoint` and the
    `bleurt` package, mean BLEURT."""
    scores = list(scores)
    out = {"n": len(scores), "score": sum(s["score"] for s in scores) / len(scores) if scores else None}
    judged = [s["correct"] for s in scores if s.get("correct") is not None]
    if judged:
        out["accuracy"] = sum(judged) / len(judged)
    tr = [s["detail"] for s in scores if s.get("kind") == "translation"]
    if tr:
        import sacrebleu
        hyps, refs = [d["hypothesis"] for d in tr], [[d["reference"] for d in tr]]
        out["bleu"] = sacrebleu.corpus_bleu(hyps, refs).score
        out["chrf"] = sacrebleu.corpus_chrf(hyps, refs).score
        if bleurt_checkpoint is not None:
            out["bleurt"] = _bleurt(hyps, refs[0], bleurt_checkpoint)
    return out


def _bleurt(hyps, refs, checkpoint):
    try:
        from bleurt import score as bleurt_score
    except ImportError:
        raise RuntimeError("BLEURT needs the `bleurt` package (github.com/google-research/bleurt)") from None
    values = bleurt_score.BleurtScorer(str(checkpoint)).score(references=refs, candidates=hyps)
    return sum(values) / len(values)
