"""Every answer reader over every data set of a data directory, with the current answer readers
(byzantium/tasks/answers/) and with answers.py from before issue 30 (git 0734688 by default).

The replies are realistic answer strings built from each gold (the gold itself, "The answer is X.",
\\boxed{X}, a unit word, a reordered list, an option's value in other spacing or currency, ...) and the
reply texts a data set holds (GSM8K and MATH solutions, AQuA rationales, CIAR's right and wrong
explanations, CommonMT's right and wrong translations). Each reply is marked right (it states the
gold) or wrong (it states another answer). Prints, per data set and per reply style, how many
replies each version parses, how many right ones it judges correct, how many wrong ones it accepts,
and how many readings changed (the extracted answer or the verdict).

Then the reference texts each record holds, read as a reply (`read_answer(text, kind, choices)`, or
`extract_answer` where a version has no read_answer: None is unread) and checked with `is_correct`
against the gold: GSM8K solutions ("#### N"), MATH-500 solutions (their last \\boxed{}), AQuA
rationales and "Answer: <option value>", BBH targets, ARC/OpenBookQA option texts, BoolQ and RTE
labels, FairEval verdicts, CIAR explanations; counted per file and kind as read right / read wrong /
unread / ambiguous, with the ids read wrong. And gold equivalence: each MATH/GSM8K/CIAR gold against
rewritings of itself (\\frac{a}{b} as a/b, \\dfrac, spaces, $...$, \\text{}, a trailing unit,
decimals as fractions and back), which `is_correct` must accept and `normalize_answer` group.

    python bench/answer_readers.py DATA_DIR [--old 0734688] [--limit N]

`--old` names a revision whose readers are compared: byzantium/tasks/answers.py before issue 30,
the byzantium/tasks/answers/ package after it.
"""
import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
from collections import Counter
from fractions import Fraction
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
    """The answer readers as they were at `commit`, imported under another name: answers.py (it
    imports only the stdlib) or, from issue 30 on, the answers/ package (relative imports only)."""
    tmp = Path(tempfile.mkdtemp())
    listing = subprocess.run(["git", "ls-tree", "--name-only", commit, "byzantium/tasks/"], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout.split()
    name = f"answers_{commit}"
    if "byzantium/tasks/answers.py" in listing:
        path = tmp / f"{name}.py"
        path.write_text(_git_show(commit, "byzantium/tasks/answers.py"))
        spec = importlib.util.spec_from_file_location(name, path)
    else:
        archive = subprocess.run(["git", "archive", commit, "byzantium/tasks/answers"], cwd=REPO, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        package = tmp / "byzantium" / "tasks" / "answers"
        spec = importlib.util.spec_from_file_location(name, package / "__init__.py",
                                                      submodule_search_locations=[str(package)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _git_show(commit, path):
    return subprocess.run(["git", "show", f"{commit}:{path}"], cwd=REPO, check=True, capture_output=True, text=True).stdout


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


# ------------------------------------------------------------------------ reference texts and golds

def read(mod, text, kind, choices):
    """(value, status) of a reply under one version: read_answer where it has one, else extract_answer
    (None is "unread")."""
    if hasattr(mod, "read_answer"):
        r = mod.read_answer(text, kind, choices)
        return r.value, r.status
    value = mod.extract_answer(text, kind, choices)
    return value, "read" if value is not None else "unread"


def references(task, rec):
    """[(source, text)]: the texts a record holds that state its gold, as a reply would."""
    out = [(field, rec[field]) for field in ("solution", "rationale", "explanation") if isinstance(rec.get(field), str)]
    if isinstance(rec.get("answer"), str) and "####" in rec["answer"]:
        out.append(("answer", rec["answer"]))
    if task.kind == "choice":
        out.append(("target", rec["target"] if isinstance(rec.get("target"), str) else f"({task.gold})"))
        option = task.choices[task.letters.index(task.gold)]
        out.append(("option text", f"Answer: {option}"))
        out += [("option value", f"Answer: {v}") for v in _value_spellings(option)]
    elif task.kind == "bool":
        out.append(("label", str(rec.get("answer") or rec.get("label"))))
    elif task.kind == "verdict":
        out.append(("label", {"win": "Assistant 1", "lose": "Assistant 2", "tie": "tie"}[task.gold]))
    return out


STATUSES = ("read right", "read wrong", "unread", "ambiguous")


def reference_counts(rows, wrong_ids, name, mods, task, rec):
    """Add one record's reference texts to rows[(file, kind, source)]: each version's status counts."""
    if task.kind in ("code", "translation"):
        return
    gold = task.metadata.get("accepted") or task.gold
    for source, text in references(task, rec):
        c = rows.setdefault((name, task.kind, source), Counter())
        c["texts"] += 1
        for when, mod in zip(("before", "after"), mods):
            value, status = read(mod, text, task.kind, task.choices)
            if status == "read":
                status = "read right" if mod.is_correct(value, gold, task.kind) else "read wrong"
            c[f"{status} {when}"] += 1
            if when == "after" and status != "read right":
                wrong_ids.setdefault((name, task.kind, source, status), []).append(task.id)


def rewritings(g):
    """The same gold written another way: (how, text)."""
    # spaces around operators, or none (but after a command: "\\cot x" is not "\\cotx")
    # (not a comma, which may separate thousands; not between words: "6 or 12")
    out = [("$...$", f"${g}$"), ("spaces", re.sub(r"\s*([+=]|(?<=\w)-)\s*", r" \1 ", g).strip())]
    if not re.search(r"(?<!\\)\b[A-Za-z]{2,}", g):
        out.append(("no spaces", re.sub(r"(\\[A-Za-z]+) +| +", lambda m: m.group(1) + " " if m.group(1) else "", g)))
    if r"\frac" in g:
        out.append(("dfrac", g.replace(r"\frac", r"\dfrac")))
    if r"\frac" in g and not re.search(r"[\d.]\s*\\frac", g):  # a mixed number "1\frac{4}{5}" is no "14/5"
        out.append(("a/b", re.sub(r"\\frac\{([^{}]+)\}\{([^{}]+)\}", lambda m: "/".join(map(_atom, m.groups())), g)))
    if re.fullmatch(r"[-\w.]+", g) and not re.fullmatch(r"-?\d+(\.\d+)?", g):
        out.append((r"\text{}", rf"\text{{{g}}}"))
    num = re.fullmatch(r"-?\d+(?:\.\d+)?", g)
    if num:
        out += [("unit", f"{g} cm"), (r"\text{ unit}", rf"{g}\text{{ units}}")]
        if "." in g:
            f = Fraction(g)
            out.append(("fraction", rf"\frac{{{f.numerator}}}{{{f.denominator}}}"))
    m = re.fullmatch(r"(-?)\\frac\{(\d+)\}\{(\d+)\}", g)
    if m and _terminates(Fraction(int(m.group(2)), int(m.group(3)))):
        out.append(("decimal", m.group(1) + str(float(Fraction(int(m.group(2)), int(m.group(3)))))))
    return [(how, text) for how, text in out if text != g]


def _atom(s):
    return s if re.fullmatch(r"-?\w+", s) else f"({s})"


def _terminates(f):
    d = f.denominator
    while d % 2 == 0:
        d //= 2
    while d % 5 == 0:
        d //= 5
    return d == 1


def gold_counts(rows, failed, name, mods, task):
    """Each gold against its rewritings: accepted by is_correct and grouped by normalize_answer."""
    if task.kind not in ("number", "math"):
        return
    for g in (task.metadata.get("accepted") or [task.gold]):
        for how, text in rewritings(str(g)):
            c = rows.setdefault((name, task.kind, how), Counter())
            c["pairs"] += 1
            for when, mod in zip(("before", "after"), mods):
                ok = mod.is_correct(text, g, task.kind)
                grouped = mod.normalize_answer(text, task.kind) == mod.normalize_answer(g, task.kind)
                c[f"accepted {when}"] += ok
                c[f"grouped {when}"] += grouped
                if when == "after" and not (ok and grouped):
                    failed.setdefault((name, task.kind, how), []).append(f"{task.id}: {text!r} vs {g!r}")


def counts_table(title, rows, columns):
    lines = ["| " + " | ".join([title, *columns]) + " |", "|" + "---|" * (len(columns) + 1)]
    for key, c in sorted(rows.items()):
        lines.append("| " + " | ".join([" / ".join(key), *(str(c[col]) for col in columns)]) + " |")
    return "\n".join(lines)


def listing(title, items, limit=12):
    """The ids (or pairs) that went wrong, a line each, the first `limit` of each group."""
    out = [title]
    for key, ids in sorted(items.items()):
        shown = ", ".join(ids[:limit]) + (f", ... ({len(ids)} in all)" if len(ids) > limit else "")
        out.append(f"- {' / '.join(key)}: {shown}")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", type=Path, help="directory of data files (.jsonl, .jsonl.gz)")
    ap.add_argument("--old", default="0734688", help="git commit of the earlier answers.py")
    ap.add_argument("--limit", type=int, default=None, help="records per data set (default: all)")
    args = ap.parse_args()
    mods = (old_module(args.old), new_answers)
    by_set, by_style, records = {}, {}, {}
    refs, ref_wrong, golds, gold_failed = {}, {}, {}, {}
    for path in sorted(args.data.glob("*.jsonl*")):
        loaded = load(path)
        if loaded is None:
            print(f"skipped {path.name}: format not known", file=sys.stderr)
            continue
        name = path.name.split(".")[0]
        recs, tasks = loaded
        records[name] = len(tasks[:args.limit])
        for rec, task in list(zip(recs, tasks))[:args.limit]:
            reference_counts(refs, ref_wrong, name, mods, task, rec)
            gold_counts(golds, gold_failed, name, mods, task)
            styles = {}
            count(styles, name, mods, task, rec)
            by_set[name] = by_set.get(name, Counter()) + styles.pop(name)
            for k, c in styles.items():
                by_style[k] = by_style.get(k, Counter()) + c
    print(table("data set", by_set, records))
    print()
    print(table("kind / reply style", dict(sorted(by_style.items()))))
    print()
    print(counts_table("file / kind / reference", refs,
                       ["texts"] + [f"{st} {when}" for st in STATUSES for when in ("before", "after")]))
    print()
    print(listing("Reference texts not read right (after):", ref_wrong))
    print()
    print(counts_table("file / kind / gold rewritten as", golds,
                       ["pairs", "accepted before", "accepted after", "grouped before", "grouped after"]))
    print()
    print(listing("Rewritten golds not accepted or not grouped (after):", gold_failed))


if __name__ == "__main__":
    main()
