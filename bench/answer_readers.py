"""Every answer reader over every data set of a data directory, with the current answer readers
(byzantium/tasks/answers/) and with answers.py from before issue 30 (git 0734688 by default).

The replies are realistic answer strings built from each gold (the gold itself, "The answer is X.",
\\boxed{X}, a unit word, a reordered list, an option's value in other spacing or currency, ...) and the
reply texts a data set holds (GSM8K and MATH solutions, AQuA rationales, CIAR's right and wrong
explanations, CommonMT's right and wrong translations). Each reply is marked right (it states the
gold) or wrong (it states another answer). Prints, per data set and per reply style, how many
replies each version parses, how many right ones it judges correct, how many wrong ones it accepts,
and how many readings changed (the extracted answer or the verdict).

    python bench/answer_readers.py DATA_DIR [--old 0734688] [--limit N]
"""
import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from byzantium.tasks import answers as new_answers  # noqa: E402
from byzantium.tasks.loaders import FORMATS, detect_format, parse_record, read_records  # noqa: E402
from byzantium.tasks.resilience import detect_resilience_format, parse_resilience_record  # noqa: E402

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class Answer(str):
    """An answer as an extractor hands it on (goes straight to is_correct), not a whole reply."""


def old_module(commit):
    """answers.py as it was at `commit`, imported from a temp file (it imports only the stdlib)."""
    src = subprocess.run(["git", "show", f"{commit}:byzantium/tasks/answers.py"], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / f"answers_{commit}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load(path):
    """(records, tasks) of one data file, or None when its format is not known."""
    records = read_records(path)
    fmt = detect_resilience_format(records[0])
    if fmt:
        return records, [parse_resilience_record(r, fmt, i) for i, r in enumerate(records)]
    fmt = detect_format(records[0])
    if fmt not in FORMATS:
        return None
    return records, [parse_record(r, fmt, i) for i, r in enumerate(records)]


# ---------------------------------------------------------------------------------------- replies

def replies(task, rec):
    """[(style, reply text, right)] for one task: `right` when the reply states the gold."""
    builders = {"number": _value_replies, "math": _value_replies, "choice": _choice_replies,
                "bool": _bool_replies, "verdict": _verdict_replies, "translation": _translation_replies,
                "code": _code_replies}
    return builders[task.kind](task, rec)


def _value_replies(task, rec):
    golds = task.metadata.get("accepted") or [task.gold]
    out = []
    for g in golds:
        out += [("gold", Answer(g), True), ("answer is", f"The answer is {g}.", True),
                ("boxed", rf"So the answer is $\boxed{{{g}}}$.", True)]
        out += _respellings(g)
        out += _wrong_values(g)
    for name, field, right in (("solution", "solution", True), ("solution", "answer", True),
                               ("explanation", "explanation", True), ("explanation", "incorrect explanation", False)):
        if isinstance(rec.get(field), str) and (field != "answer" or "####" in rec[field]):
            out.append((name, rec[field], right))
    out += [("wrong answer", f"The answer is {w}.", False) for w in rec.get("incorrect answer") or []]
    return out


def _respellings(g):
    """The same answer written another way, as models write it."""
    out, items = [], _top_items(g)
    if NUMBER.fullmatch(g):
        out.append(("unit word", f"The answer is {g} pears.", True))
        if "." not in g and abs(int(g)) >= 1000:
            out.append(("thousands", f"The answer is {int(g):,}.", True))
    if items and not re.match(r"[(\[]", g):  # a bare list of solutions
        out += [("reordered list", rf"\boxed{{{', '.join(reversed(items))}}}", True),
                ("set", rf"\boxed{{\{{{', '.join(items)}\}}}}", True),
                ("x = list", f"The answer is $x = {', x = '.join(items)}$.", True),
                ("or list", r"\boxed{" + r" \text{ or } ".join(items) + "}", True)]
    if g.count(r"\pm") == 1:
        a, b = g.split(r"\pm")
        out.append(("pm expanded", rf"\boxed{{{a.strip()} - {b.strip()}, {a.strip()} + {b.strip()}}}", True))
    if re.fullmatch(r"\w+_\w", g):
        out.append(("base in braces", r"\boxed{" + re.sub(r"_(\w)$", r"_{\1}", g) + "}", True))
    if "pmatrix" in g:
        out.append(("bmatrix", rf"\boxed{{{g.replace('pmatrix', 'bmatrix')}}}", True))
    if re.fullmatch(r"[(\[].*[)\]]", g) and "," in g and "\\cup" not in g:
        out.append(("x in interval", rf"\boxed{{x \in {g}}}", True))
    return out


def _wrong_values(g):
    """Other answers close to the gold: the next integer, a tuple reversed, an item dropped, other brackets."""
    out, items = [], _top_items(g)
    if re.fullmatch(r"-?\d+", g):
        out.append(("next integer", f"The answer is {int(g) + 1}.", False))
    m = re.fullmatch(r"([(\[])(.*)([)\]])", g)
    if m and items is None and len(_top_items(m.group(2)) or []) > 1:
        inner = _top_items(m.group(2))
        if inner != inner[::-1]:
            out.append(("tuple reversed", rf"\boxed{{{m.group(1)}{', '.join(reversed(inner))}{m.group(3)}}}", False))
        swap = {"(": "[", "[": "(", ")": "]", "]": ")"}
        out.append(("other brackets", rf"\boxed{{{swap[m.group(1)]}{m.group(2)}{swap[m.group(3)]}}}", False))
    if items and not re.match(r"[(\[]", g):
        out.append(("item dropped", rf"\boxed{{{', '.join(items[:-1])}}}", False))
    return out


def _top_items(s):
    """Items of s split at its top-level commas, or None when it has none (a thousands comma is none)."""
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?|.*\\!.*", s):
        return None
    parts, depth, cur = [], 0, ""
    for ch in s:
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return parts + [cur.strip()] if parts else None


def _choice_replies(task, rec):
    gold, letters = task.gold, task.letters
    other = next(x for x in letters if x != gold)
    text, wrong_text = task.choices[letters.index(gold)], task.choices[letters.index(other)]
    out = [("letter", Answer(gold), True), ("answer is", f"The answer is ({gold}).", True),
           ("boxed", rf"$\boxed{{{gold}}}$", True), ("option text", f"Answer: {text}", True),
           ("other letter", f"The answer is ({other}).", False), ("other option text", f"Answer: {wrong_text}", False)]
    out += [("option value", f"Answer: {v}", True) for v in _value_spellings(text)]
    out += [("other option value", f"Answer: {v}", False) for v in _value_spellings(wrong_text)]
    if isinstance(rec.get("rationale"), str):
        out.append(("rationale", rec["rationale"], True))
    return out


def _value_spellings(option):
    """An option that states a value ("4km", "Rs. 750", "$61", "4,000", "36 minutes"), written other ways."""
    m = re.fullmatch(r"\s*(Rs\.?\s*|\$)?(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?\s*([A-Za-z][A-Za-z /]*)?\s*", option)
    if not m:
        return []
    cur, whole, frac, unit = m.group(1) or "", m.group(2), m.group(3) or "", m.group(4) or ""
    plain = whole.replace(",", "") + frac
    number = f"{int(plain.split('.')[0]):,}{frac}" if "," not in whole and len(plain.split(".")[0]) > 3 else plain
    out = []
    if unit:
        out += [f"{number} {unit}"] + ([f"{number}{unit}"] if " " not in unit else [])
    if cur.startswith("Rs"):
        out += [f"Rs.{number}", f"Rs. {number}", f"{number} rupees"]
    elif cur == "$":
        out += [f"${number}.00" if not frac else f"${number}", f"{number} dollars"]
    elif not unit:
        out.append(number)
    return [v for v in dict.fromkeys(out) if v.strip() != option.strip()]


def _bool_replies(task, rec):
    other = "no" if task.gold == "yes" else "yes"
    said = {"yes": "The premise entails the hypothesis.", "no": "The premise does not entail the hypothesis."}
    if "premise" not in rec:
        said = {"yes": "Yes, that is true.", "no": "No, that is not true."}
    return [("gold", Answer(task.gold), True), ("answer is", f"The answer is {task.gold}.", True),
            ("boxed", rf"\boxed{{{task.gold}}}", True), ("prose", said[task.gold], True),
            ("other", f"The answer is {other}.", False), ("other prose", said[other], False)]


def _verdict_replies(task, rec):
    said = {"win": ("Assistant 1", "[[A]]", "9 7"), "lose": ("Assistant 2", "[[B]]", "6 8"),
            "tie": ("tie", "[[C]]", "8 8")}
    other = "lose" if task.gold != "lose" else "win"
    who, bracket, scores = said[task.gold]
    return [("verdict line", f"Verdict: {who}", True), ("brackets", bracket, True),
            ("scores", f"{scores}\nBoth are fine.", True),
            ("other verdict", f"Verdict: {said[other][0]}", False)]


def _translation_replies(task, rec):
    return [("translation", f"Translation: {task.gold}", True),
            ("wrong translation", f"Translation: {task.metadata.get('wrong')}", False)]


def _code_replies(task, rec):
    return [("code block", f"Here is the function:\n```python\n{task.gold}```\n", True)]


# ---------------------------------------------------------------------------------------- reading

def judge(mod, task, text):
    """(extracted answer, judged correct) under one version of the readers."""
    answer = text if isinstance(text, Answer) else mod.extract_answer(text, task.kind, task.choices)
    if task.kind == "translation":  # scored by BLEU/chrF elsewhere; here: the same sentence or not
        same = answer is not None and mod.normalize_answer(answer, task.kind) == mod.normalize_answer(task.gold, task.kind)
        return answer, same
    return answer, mod.is_correct(answer, task.metadata.get("accepted") or task.gold, task.kind)


def count(rows, key, mods, task, rec):
    """Add one task's replies to rows[key]: replies, parsed, right matched, wrong accepted, changed."""
    for style, text, right in replies(task, rec):
        (ea, oa), (eb, ob) = (judge(m, task, text) for m in mods)
        for k in (key, (task.kind, style)):
            c = rows.setdefault(k, Counter())
            c["replies"] += 1
            c["right" if right else "wrong"] += 1
            c["parsed before"] += ea is not None
            c["parsed after"] += eb is not None
            c[("matched" if right else "accepted") + " before"] += oa
            c[("matched" if right else "accepted") + " after"] += ob
            c["changed"] += (ea, oa) != (eb, ob)


COLUMNS = ("replies", "parsed before", "parsed after", "right", "matched before", "matched after",
           "wrong", "accepted before", "accepted after", "changed")


def table(title, rows, records=None):
    head = [title] + (["records"] if records else []) + list(COLUMNS)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, c in rows.items():
        name = key if isinstance(key, str) else " / ".join(key)
        cells = [name] + ([str(records[key])] if records else []) + [str(c[col]) for col in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", type=Path, help="directory of data files (.jsonl, .jsonl.gz)")
    ap.add_argument("--old", default="0734688", help="git commit of the earlier answers.py")
    ap.add_argument("--limit", type=int, default=None, help="records per data set (default: all)")
    args = ap.parse_args()
    mods = (old_module(args.old), new_answers)
    by_set, by_style, records = {}, {}, {}
    for path in sorted(args.data.glob("*.jsonl*")):
        loaded = load(path)
        if loaded is None:
            print(f"skipped {path.name}: format not known", file=sys.stderr)
            continue
        name = path.name.split(".")[0]
        recs, tasks = loaded
        records[name] = len(tasks[:args.limit])
        for rec, task in list(zip(recs, tasks))[:args.limit]:
            styles = {}
            count(styles, name, mods, task, rec)
            by_set[name] = by_set.get(name, Counter()) + styles.pop(name)
            for k, c in styles.items():
                by_style[k] = by_style.get(k, Counter()) + c
    print(table("data set", by_set, records))
    print()
    print(table("kind / reply style", dict(sorted(by_style.items()))))


if __name__ == "__main__":
    main()
