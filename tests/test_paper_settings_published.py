"""Every published number the experiment files carry, held against a transcription of the papers made
apart from them (tests/published_numbers.py, in the papers' table layouts), both ways: each [[published]]
row has its number in the transcription, and each transcribed number sits in a file. The tables' own
arithmetic (deltas, BFTI = FAA - IAA, averages) checks the transcription itself."""
from collections import Counter

import pytest

import published_numbers as paper
from byzantium.sweep.config import load_sweep

FILES = ["ct_table1", "ct_table2", "ct_table3", "ct_table5", "ct_table6_8", "ct_table9", "mas_main", "sac_table3_4",
         "sac_table7", "sac_table8"]
L70, SCOUT = "meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Llama-4-Scout-17B-16E-Instruct"
MISTRAL, Q25, Q3 = "mistralai/Mistral-Small-3.1-24B-Instruct-2503", "Qwen/Qwen2.5-32B-Instruct", "Qwen/Qwen3-30B-A3B"
L8, GEMMA = "meta-llama/Meta-Llama-3-8B-Instruct", "google/gemma-3-12b-it"
CT_MODELS = {"Llama-3.3-70B": L70, "Llama-4-Scout-17B": SCOUT, "Mistral-3.1-24B": MISTRAL, "Qwen2.5-32B": Q25,
             "Qwen3-30B": Q3}
SIZES = {"70B": L70, "8B": L8, "17B": SCOUT, "24B": MISTRAL, "12B": GEMMA}
PATTERNS = ["1c4t", "2c3t", "3c2t", "4c1t"]
SAC_TASKS = {"MATH-500": "math500", "ARC-Challenge": "arc", "HellaSwag": "hellaswag", "BoolQ": "boolq",
             "OpenBookQA": "obqa", "RTE": "rte"}
GRAPHS = {"MERG": "merg", "Complete": "complete", "ER": "er", "Preferential": "preferential"}
SAC_METRICS = ["IAA", "FAA", "BFTI", "RA", "H-Majority"]
ROUNDING = 0.15  # two numbers each rounded to 0.1, and their difference rounded again


def key(table, method, metric, where):
    return table, method, metric, tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in where.items()))


def rows(text):
    return [line.split() for line in text.strip().splitlines()]


def num(text):
    return float(text)


def task_name(label):
    return label.lower().replace("-", "")


def close(a, b, tol=ROUNDING):
    return abs(a - b) <= tol + 1e-9


# ------------------------------------------------------------------ the transcription, as file rows

def consensus_trap():
    """{key: value} of the Consensus Trap's numbers as the experiment files key them; the strong tables
    run attack "directive" (Appendix C's wording)."""
    out = {}
    for table, text, attack in (("Table 1", paper.CT_TABLE1, "moderate"), ("Table 2", paper.CT_TABLE2, "directive")):
        model = None
        for r in rows(text):
            if r[0] == "model":
                model = CT_MODELS[r[1]]
                continue
            v = [num(x) for x in r[1:]]
            where = dict(attack=attack, model=model, task=task_name(r[0]))
            for method in ("maj", "rrmaj"):  # the ceiling and floor stand beside both methods' cells
                out[key(table, method, "accuracy", {**where, "pattern": "0c5t"})] = v[0]
                out[key(table, method, "accuracy", {**where, "pattern": "5c0t"})] = v[13]
            for i, pattern in enumerate(PATTERNS):
                out[key(table, "maj", "accuracy", {**where, "pattern": pattern})] = v[1 + 3 * i]
                out[key(table, "rrmaj", "accuracy", {**where, "pattern": pattern})] = v[2 + 3 * i]
    for r in rows(paper.CT_TABLE3):
        attack = "directive" if r[0] == "strong" else r[0]
        method = r[2].lower()
        where = dict(attack=attack, pattern=r[1]) if method == "rrmaj" else \
            dict(attack=attack, pattern={"3c2t": "30c20t", "4c1t": "40c10t"}[r[1]])
        if method == "rrmaj":
            where["trajectories"] = 50
        for m, v in zip((1, 5, 10, 20, 30, 40), r[3:9]):
            out[key("Table 3", method, f"accuracy at M={m}", where)] = num(v)
    for r in rows(paper.CT_TABLE4)[:-1]:  # the Average row is Table 3's
        task = task_name(r[0])
        for method, where, cols in (("maj", dict(attack="directive", pattern="30c20t", task=task), r[1:3]),
                                    ("rrmaj", dict(attack="directive", pattern="3c2t", trajectories=50, task=task),
                                     r[3:5])):
            for m, v in zip((1, 40), cols):
                out[key("Table 4", method, f"accuracy at M={m}", where)] = num(v)
    for r in rows(paper.CT_TABLE5):
        for model, cols in ((SCOUT, r[1:7]), (MISTRAL, r[7:13])):
            where = dict(attack="directive", model=model, pattern=r[0])
            out[key("Table 5", "rrmaj", "clean-last accuracy", where)] = num(cols[0])
            out[key("Table 5", "rrmaj", "corrupt-last accuracy", where)] = num(cols[2])
    table = ensemble = None
    for r in rows(paper.CT_TABLES6_8):
        if r[0] == "table":
            table, ensemble = f"Table {r[1]}", r[3:]
            continue
        models = [SIZES[m] for m in ensemble]
        if r[0] == "none":
            out[key(table, "maj", "accuracy", dict(attack="directive", models=models, corrupt=0))] = num(r[1])
            continue
        where = dict(attack="directive", models=models, corrupted=corrupted_members(ensemble, r[0]))
        out[key(table, "maj", "accuracy", where)] = num(r[1])
        out[key(table, "rrmaj", "accuracy", where)] = num(r[2])
    for r in rows(paper.CT_TABLE9):
        where = dict(model=L8, pattern="2c1t", attack="directive", chunk=int(r[0]))
        for task, v in zip(("logic7", "logic3", "track7"), r[1:4]):
            out[key("Table 9", "rrmaj", "accuracy", {**where, "task": task})] = num(v)
        out[key("Table 9", "rrmaj", "accuracy", where)] = num(r[4])
    return out


def corrupted_members(ensemble, spec):
    """The ensemble's indices a row corrupts: "1x70B+2x8B" (the first of each size) or "70B,17B" (by name)."""
    if "x" in spec:
        counts = {size: int(n) for n, size in (part.split("x") for part in spec.split("+"))}
        picked = []
        for size, n in counts.items():
            picked += [i for i, m in enumerate(ensemble) if m == size][:n]
        return sorted(picked)
    return sorted(ensemble.index(name) for name in spec.split(","))


def robust_sac():
    out = {}
    models = dict(strong_model="Qwen/Qwen3-4B", weak_model="Qwen/Qwen2.5-1.5B-Instruct")
    task = None
    for r in rows(paper.SAC_TABLE3_11):
        if r[0] == "dataset":
            task = r[1]
            continue
        table = "Table 3" if task == "MATH-500" else "Table 11"
        where = dict(task=SAC_TASKS[task], topology=GRAPHS[r[1]], agents=7, weak=2, byzantine=1, F=3, rounds=6,
                     **models)
        values = r[2:6] + r[10:11]
        for metric, v in zip(SAC_METRICS, values):
            out[key(table, r[0].lower().replace("-", ""), metric, where)] = num(v)
    gpt = dict(strong_model="gpt-4o-mini", weak_model="gpt-3.5-turbo")
    for r in rows(paper.SAC_TABLE7):
        for i, (b, w) in enumerate(((1, 2), (2, 1), (3, 0))):
            where = dict(topology=GRAPHS[r[1]], byzantine=b, weak=w, task="math-l4-30", agents=7, F=3, rounds=6,
                         **gpt)
            for j, metric in enumerate(SAC_METRICS):
                out[key("Table 7", r[0].lower().replace("-", ""), metric, where)] = num(r[2 + 3 * j + i])
    for r in rows(paper.SAC_TABLE8):
        where = dict(topology=GRAPHS[r[1]], task="math-l4-30", agents=9, weak=2, byzantine=1, F=3, rounds=6, **gpt)
        for metric, v in zip(SAC_METRICS, r[3:8]):
            out[key("Table 8", r[0].lower().replace("-", ""), metric, where)] = num(v)
    return out


def resilience():
    m, out = paper.MAS, {}

    def put(table, metric, value, **where):
        out[key(table, "resilience", metric, where)] = value

    for s, v in m["decline by structure"].items():
        put("Main results", f"average drop, {s} (mean of both backbones, both faults, all tasks)", v)
    for t, v in m["decline by task"].items():
        put("Main results", f"average drop, {t} (mean of both backbones, both faults, six systems)", v)
    for f, v in m["decline by fault"].items():
        put("Main results", f"average drop, {f} (mean of both backbones, four tasks, six systems)", v)
    conditions = ("clean", "AutoTransform", "AutoInject")
    faults = {"clean": {"fault": "none"}, "AutoTransform": {"fault": "autotransform"},
              "AutoInject": {"fault": "autoinject", "error_type": "semantic"}}
    backbones = {"GPT-3.5": "gpt-3.5-turbo", "GPT-4o": "gpt-4o"}
    for bb, by in m["scores by structure"].items():
        for s, values in by.items():
            for c, v in zip(conditions, values):
                put("Main results by structure", f"{bb} {s}, {c}: mean of its 2 systems and 4 tasks", v)
    for bb, by in m["scores by task"].items():
        for c, values in by.items():
            for task, v in zip(("humaneval", "ciar", "commonmt", "faireval"), values[:4]):
                put("Main results by task", f"{bb} {c}: mean of the six systems", v, model=backbones[bb], task=task,
                    defence="none", **faults[c])
            put("Main results by task", f"{bb} {c}: mean of six systems and four tasks", values[4])
    code = dict(model="gpt-3.5-turbo", task="humaneval")
    for system, (clean, semantic, syntactic) in m["error types"].items():
        put("Error types", "GPT-3.5 clean", clean, system=system, defence="none", fault="none", **code)
        put("Error types", "GPT-3.5 AutoInject", semantic, system=system, defence="none", **faults["AutoInject"], **code)
        put("Error types", "GPT-3.5 AutoInject syntactic", syntactic, system=system, defence="none",
            fault="autoinject", error_type="syntactic", **code)
    put("Error types", "GPT-3.5 AutoInject syntactic: mean of the six systems", m["error types, average"][2],
        defence="none", fault="autoinject", error_type="syntactic", **code)
    for system, by in m["defences"].items():
        for c, values in by.items():
            for defence, v in zip(("challenger", "inspector", "both"), values[1:]):
                put("Defences", f"GPT-3.5 {c} + {defence}", v, system=system, defence=defence, **faults[c], **code)
        # Without a defence: the clean and AutoInject scores are Error types' rows (checked equal below)
        put("Defences", "GPT-3.5 AutoTransform", by["AutoTransform"][0], system=system, defence="none",
            **faults["AutoTransform"], **code)
    put("Defences", "recovered share of the AutoTransform loss", m["recovered by both defences"],
        system="self-collab", defence="both", **faults["AutoTransform"], **code)
    return out


def transcription():
    parts = [consensus_trap(), robust_sac(), resilience()]
    assert sum(map(len, parts)) == len({k for p in parts for k in p}), "two transcribed numbers share a key"
    return {k: v for p in parts for k, v in p.items()}


def files(names=FILES):
    out, seen = {}, Counter()
    for name in names:
        for p in load_sweep(name, "paper", check_files=False).published:
            k = key(p["table"], p["method"], p["metric"], p["where"])
            seen[k] += 1
            out[k] = (name, p["value"])
    assert not [k for k, n in seen.items() if n > 1], "a published number appears twice in the files"
    return out


def compare(mine, theirs):
    """(file rows without a transcribed number, transcribed numbers in no file, numbers that differ)."""
    missing = sorted(set(theirs) - set(mine), key=str)
    extra = sorted(set(mine) - set(theirs), key=str)
    wrong = [(name, k, value, mine[k]) for k, (name, value) in theirs.items() if k in mine and value != mine[k]]
    return missing, extra, wrong


# ------------------------------------------------------------------------------------------- tests

def test_every_published_row_is_in_the_transcription_and_the_other_way_round():
    theirs = files()
    missing, extra, wrong = compare(transcription(), theirs)
    assert not missing, f"{len(missing)} file rows the transcription has no number for, e.g. {missing[:3]}"
    assert not extra, f"{len(extra)} transcribed numbers in no file, e.g. {extra[:3]}"
    assert not wrong, f"{len(wrong)} numbers differ (file, row, file's, paper's): {wrong[:5]}"
    assert len(theirs) == 1325


def test_the_transcription_agrees_with_the_tables_own_arithmetic():
    for text in (paper.CT_TABLE1, paper.CT_TABLE2):
        for r in rows(text):
            if r[0] == "model":
                continue
            v = [num(x) for x in r[1:]]
            for i in range(4):
                maj, rr, delta = v[1 + 3 * i:4 + 3 * i]
                assert close(rr - maj, delta), r
    for r in rows(paper.CT_TABLE3):
        assert close(num(r[8]) - num(r[3]), num(r[9])), r
    t3 = {(r[0], r[1], r[2]): r for r in rows(paper.CT_TABLE3)}
    average = rows(paper.CT_TABLE4)[-1]
    assert average[1:] == [t3["strong", "3c2t", "MAJ"][3], t3["strong", "3c2t", "MAJ"][8],
                           t3["strong", "3c2t", "RRMaj"][3], t3["strong", "3c2t", "RRMaj"][8]]
    # The paper's own: Table 4's Average row is Table 3's, but only its MAJ M=40 column is the mean of the
    # six rows above it (M=1: 43.9 and 62.9 against 46.2 and 59.5; RRMaj M=40: 74.7 against 74.9).
    cols = list(zip(*[[num(x) for x in r[1:]] for r in rows(paper.CT_TABLE4)[:-1]]))
    off = [name for name, c, a in zip(("MAJ M=1", "MAJ M=40", "RRMaj M=1", "RRMaj M=40"), cols, average[1:])
           if not close(sum(c) / len(c), num(a), 0.05)]
    assert off == ["MAJ M=1", "RRMaj M=1", "RRMaj M=40"]
    for r in rows(paper.CT_TABLE5):
        for clean, corrupt, delta in ((r[1], r[3], r[5]), (r[7], r[9], r[11])):
            assert close(num(clean) - num(corrupt), num(delta), 0.006), r
    for r in rows(paper.CT_TABLES6_8):
        if r[0] not in ("table", "none"):
            assert close(num(r[2]) - num(r[1]), num(r[3])), r
    # The paper's own: Table 9's AVG is 0.4 to 1.0 below the plain mean of its three columns on every row (a
    # mean weighted by questions, perhaps); it stays within them.
    for r in rows(paper.CT_TABLE9):
        three = [num(x) for x in r[1:4]]
        assert min(three) < num(r[4]) < sum(three) / 3 - 0.35, r
    for text, bfti in ((paper.SAC_TABLE3_11, lambda r: (r[2], r[3], r[4])),
                       (paper.SAC_TABLE8, lambda r: (r[3], r[4], r[5]))):
        for r in rows(text):
            if r[0] != "dataset":
                iaa, faa, d = map(num, bfti(r))
                assert close(faa - iaa, d), r
    for r in rows(paper.SAC_TABLE7):
        for i in range(3):
            assert close(num(r[5 + i]) - num(r[2 + i]), num(r[8 + i])), r
    m = paper.MAS
    for bb in ("GPT-3.5", "GPT-4o"):
        for values in m["scores by task"][bb].values():  # the overall score is the mean of the four tasks
            assert close(sum(values[:4]) / 4, values[4], 0.01)

    for s_name, drop in m["decline by structure"].items():
        by = m["scores by structure"]
        drops = [by[bb][s_name][0] - by[bb][s_name][f] for bb in by for f in (1, 2)]
        assert close(sum(drops) / 4, drop, 0.01), s_name
    tasks = {"code": 0, "math": 1, "translation": 2, "text evaluation": 3}
    by = m["scores by task"]
    for t, drop in m["decline by task"].items():
        drops = [by[bb]["clean"][tasks[t]] - by[bb][f][tasks[t]] for bb in by for f in ("AutoTransform", "AutoInject")]
        assert close(sum(drops) / 4, drop, 0.01), t
    for f, drop in m["decline by fault"].items():
        assert close(sum(by[bb]["clean"][4] - by[bb][f][4] for bb in by) / 2, drop, 0.01), f
    at = m["defences"]["self-collab"]["AutoTransform"]
    recovered = (at[3] - at[0]) / (m["defences"]["self-collab"]["clean"][0] - at[0]) * 100
    assert close(recovered, m["recovered by both defences"], 0.05)
    # Knowl 8's averages of the six systems are Knowl 5's GPT-3.5 code scores, and its clean and AutoInject
    # scores of Self-collaboration and Camel are Knowl 6's scores without a defence.
    errors = m["error types"]
    for i in range(3):
        assert close(sum(v[i] for v in errors.values()) / 6, m["error types, average"][i], 0.01)
    assert m["error types, average"][:2] == (m["scores by task"]["GPT-3.5"]["clean"][0],
                                             m["scores by task"]["GPT-3.5"]["AutoInject"][0])
    for system in ("self-collab", "camel"):
        d = m["defences"][system]
        assert close(d["clean"][0], errors[system][0], 0.05) and close(d["AutoInject"][0], errors[system][1], 0.05)


@pytest.mark.parametrize("spec, members", [("0x70B+1x8B", [2]), ("1x70B+1x8B", [0, 2]), ("70B,17B", [0, 1])])
def test_corrupted_members_read_the_papers_row_labels(spec, members):
    ensemble = ["70B", "17B", "8B"] if "17B" in spec else ["70B", "70B", "8B"]
    assert corrupted_members(ensemble, spec) == members


def test_a_mistyped_or_missing_file_number_is_caught(tmp_path):
    from byzantium.sweep.config import find_file
    text = find_file("ct_table9").read_text()
    assert text.count('["logic3", 150, 33.5]') == 1
    (tmp_path / "typo.toml").write_text(text.replace('["logic3", 150, 33.5]', '["logic3", 150, 35.5]'))
    (tmp_path / "short.toml").write_text(text.replace('["logic3", 150, 33.5],', ""))
    mine = {k: v for k, v in transcription().items() if k[0] == "Table 9"}
    missing, extra, wrong = compare(mine, files([str(tmp_path / "typo.toml")]))
    assert not missing and not extra and [(w[1][-1], w[2], w[3]) for w in wrong] == [
        ((("attack", "directive"), ("chunk", 150), ("model", L8), ("pattern", "2c1t"), ("task", "logic3")), 35.5, 33.5)]
    missing, extra, wrong = compare(mine, files([str(tmp_path / "short.toml")]))
    assert not missing and not wrong and len(extra) == 1
