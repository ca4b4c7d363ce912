"""The SAC paper's experiment files hold the paper's settings ("Robust Multi-Agent LLMs under Byzantine
Faults"): each file's paper scale against a table written from the paper's text (its Tables 3, 4, 7, 8
and 11 with their captions, Sections 5.1-5.2 and 5.5, Appendix C), so that a file drifting from the
paper fails here. Also: the dry run flags a data set that only the Hugging Face hub has, offline; and
SAC's RA under both tie rules (ours, drawn; the reference code's, the first honest agent)."""
import json
from types import SimpleNamespace

import pytest

from byzantium.cli import main, parser
from byzantium.experiments.sac import run_experiment
from byzantium.protocols import prompts
from byzantium.tasks import get_task
from byzantium.experiments.report_cells import matches
from byzantium.protocols.metrics.sac import first_honest_vote, instance_metrics
from byzantium.sweep.config import load_sweep
from byzantium.sweep.dry_run import describe

QWEN = ("Qwen/Qwen3-4B", "Qwen/Qwen2.5-1.5B-Instruct")  # (strong, weak): open-weight experiments
GPT_MATH = ("gpt-4o-mini", "gpt-3.5-turbo")  # (strong, weak): closed weights on Hendrycks MATH
MIX = ("IAA", "FAA", "BFTI", "RA", "H-Majority")  # the metrics of Tables 3, 7, 8 and 11

# From the paper's text: file -> the settings of its paper scale.
#   tasks: the data sets, each task label -> (record format, the data file as the file names it);
#          limit None: the full set (Tables 3/4 and Appendix C.2), 30: Tables 7/8's 30 problems
#   line_up: the (strong, weak, byzantine) compositions; topologies: the graphs of the table
PAPER = {
    "sac_table3_4": dict(
        models=QWEN, agents=7, F=3, rounds=6, limit=None, line_up={(4, 2, 1)},
        topologies={"merg", "complete", "er"},
        tasks={"math500": "math500", "arc": "arc", "hellaswag": "hellaswag", "boolq": "boolq", "obqa": "obqa",
               "rte": "rte"},
        published={"Table 3": 2 * 3 * 5, "Table 11": 5 * 2 * 3 * 5}),
    "sac_table7": dict(
        models=GPT_MATH, agents=7, F=3, rounds=6, limit=None, line_up={(4, 2, 1), (4, 1, 2), (4, 0, 3)},
        topologies={"merg", "complete", "er"}, tasks={"math-l4-30": "math500"},
        published={"Table 7": 2 * 3 * 3 * 5}),
    "sac_table8": dict(
        models=GPT_MATH, agents=9, F=3, rounds=6, limit=None, line_up={(6, 2, 1)},
        topologies={"merg", "complete", "preferential", "er"}, tasks={"math-l4-30": "math500"},
        published={"Table 8": 2 * 4 * 5}),
}
# Tables 7/8 run the 30 problems Table 9 lists: a file of exactly those, not a cut of a larger set.
THIRTY = "math_level4_30.jsonl"


@pytest.mark.parametrize("name", sorted(PAPER))
def test_the_paper_scale_holds_the_papers_settings(name):
    want = PAPER[name]
    sweep = load_sweep(name, scale="paper", check_files=False)
    assert sweep.paper == "sac"
    cells = sweep.cells
    assert {c.method for c in cells} == {"sac", "cpwbft"}  # SAC against the CP-WBFT baseline, every table
    for c in cells:
        p = c.params
        assert (p["strong_model"], p["weak_model"]) == want["models"], c.name
        assert p["agents"] == want["agents"] and p["F"] == want["F"] and p["rounds"] == want["rounds"], c.name
        assert p["limit"] == want["limit"], f"{c.name}: the paper runs the whole set, not a cut"
        assert p["adversary"] == "fixed" and p["temperature"] == 0.1 and p["seed"] == 1234, c.name
        assert p["max_tokens"] == 1000, c.name
        if c.method == "sac":
            assert p["score_mode"] == "generate" and p["judge_max_tokens"] == 1000, c.name
        fmt = c.argv[c.argv.index("--task") + 1]
        assert want["tasks"][p["task"]] == fmt, c.name
        if name != "sac_table3_4":
            assert p["data"] == THIRTY, c.name
    assert {c.params["topology"] for c in cells} == want["topologies"]
    assert {(c.params["agents"] - c.params["weak"] - c.params["byzantine"], c.params["weak"],
             c.params["byzantine"]) for c in cells} == want["line_up"]
    assert {c.params["task"] for c in cells} == set(want["tasks"])
    # Every combination once per method: topologies x compositions x data sets.
    assert len(cells) == 2 * len(want["topologies"]) * len(want["line_up"]) * len(want["tasks"])
    assert sweep.models.get(QWEN[0], {}).get("chat_template_kwargs", {}).get("enable_thinking") is not True


def test_the_open_weight_data_sets_are_the_full_evaluation_sets():
    sweep = load_sweep("sac_table3_4", scale="paper", check_files=False)
    data = {c.params["task"]: c.params.get("data") for c in sweep.cells}
    assert data == {"math500": "math500.jsonl", "arc": "arc_challenge.jsonl", "hellaswag": None,
                    "boolq": "boolq.jsonl", "obqa": "openbookqa.jsonl", "rte": "rte.jsonl"}  # HellaSwag: the hub


@pytest.mark.parametrize("name", sorted(PAPER))
def test_published_numbers_match_exactly_the_cells_at_the_papers_settings(name):
    paper = load_sweep(name, scale="paper", check_files=False)
    tables = {}
    for p in paper.published:
        tables[p["table"]] = tables.get(p["table"], 0) + 1
        assert p["metric"] in MIX
        hit = [c.name for c in paper.cells if matches(p, c)]
        assert len(hit) == 1, (p, hit)
    assert tables == PAPER[name]["published"]
    for c in paper.cells:  # and every cell has the table's five numbers
        assert sorted(p["metric"] for p in paper.published if matches(p, c)) == sorted(MIX), c.name
    smoke = load_sweep(name, scale="smoke")
    assert not [c.name for c in smoke.cells for p in smoke.published if matches(p, c)]


def test_a_few_published_numbers_are_the_papers():
    def value(name, **where):
        sweep = load_sweep(name, scale="paper", check_files=False)
        (p,) = [p for p in sweep.published if all(p["where"].get(k, p.get(k)) == v for k, v in where.items())]
        return p["value"]
    assert value("sac_table3_4", method="sac", metric="BFTI", task="math500", topology="merg") == 6.5
    assert value("sac_table3_4", method="cpwbft", metric="BFTI", task="rte", topology="complete") == -24.2
    assert value("sac_table7", method="sac", metric="H-Majority", topology="merg", byzantine=1) == 96.7
    assert value("sac_table8", method="cpwbft", metric="RA", topology="preferential") == 26.7


# ------------------------------------------------------------------------- the dry run, offline

def test_the_dry_run_flags_a_hub_only_data_set_offline(tmp_path, monkeypatch):
    for var in ("HF_HUB_CACHE", "HF_DATASETS_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache: nothing downloaded before
    sweep = load_sweep("sac_table3_4", scale="paper", check_files=False)
    hub = [c.name for c in sweep.cells if c.params["task"] == "hellaswag"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lines = {line.split()[0]: line for line in describe(sweep).splitlines()[2:] if line and line[0] != " "}
    for name in hub:
        assert "Hugging Face hub (Rowan/hellaswag)" in lines[name] and "HF_HUB_OFFLINE" in lines[name], lines[name]
    assert not any("hub" in lines[c.name] for c in sweep.cells if c.name not in hub)
    monkeypatch.delenv("HF_HUB_OFFLINE")  # online: a download at run time, said per cell
    lines = {line.split()[0]: line for line in describe(sweep).splitlines()[2:] if line and line[0] != " "}
    assert all("downloaded at run time" in lines[name] for name in hub)
    (tmp_path / "hf" / "hub" / "datasets--Rowan--hellaswag").mkdir(parents=True)  # in the cache: no flag
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert not any("hub" in line for line in describe(sweep).splitlines()[2:] if "hellaswag" in line.split()[0])


# --------------------------------------------------------------------------------- RA on a tie

def tie_record(ra_ties=None):
    """Honest final answers 42, 42 (strong agents 0, 1) against 7, 7 (weak agents 2, 3): a 2-2 tie."""
    rnd = {"agents": [{"id": i, "answer": a} for i, a in enumerate(["42", "42", "7", "7", "9"])]}
    roles = ["strong", "strong", "weak", "weak", "adversary"]
    record = {"protocol": "sac", "task_id": "t", "seed": 0, "gold": "42", "kind": "number",
              "agents": [{"id": i, "role": r} for i, r in enumerate(roles)], "rounds": [rnd, rnd]}
    return record if ra_ties is None else {**record, "ra_ties": ra_ties}


def test_ra_ties_first_honest_follows_the_references_agent_order():
    # The reference puts its weak honest agents first among the honest ones: their answer wins the tie.
    assert first_honest_vote(tie_record(), [0, 1, 2, 3]) == "7"
    assert instance_metrics(tie_record("first-honest"))["RA"] == 0.0
    one_weak = tie_record("first-honest")
    one_weak["agents"][3]["role"] = "strong"  # weak agent 2 still comes first
    assert first_honest_vote(one_weak, [0, 1, 2, 3]) == "7"


def test_ra_ties_drawn_is_our_vote_and_the_same_as_h_majority():
    drawn = [instance_metrics({**tie_record(), "task_id": f"t{k}"}) for k in range(12)]
    assert all(m["RA"] == m["H-Majority"] for m in drawn)
    assert {m["RA"] for m in drawn} == {0.0, 1.0}  # drawn per problem, not always the same side
    assert instance_metrics(tie_record("drawn"))["RA"] == instance_metrics(tie_record())["RA"]
    with pytest.raises(ValueError, match="ra_ties"):
        instance_metrics(tie_record("last-honest"))


def test_ra_ties_is_a_flag_of_run_sac_and_a_sweep_key(tmp_path, capsys):
    assert parser().parse_args(["run", "sac", "--ra-ties", "first-honest"]).ra_ties == "first-honest"
    assert parser().parse_args(["run", "sac"]).ra_ties == "drawn"
    assert main(["run", "sac", "--ra-ties", "nearest", "--out", str(tmp_path / "o")]) == 2
    assert "--ra-ties" in capsys.readouterr().err
    path = tmp_path / "s.toml"
    path.write_text('paper = "sac"\nmethod = ["sac", "cpwbft"]\n[analysis]\nkind = "sac"\n'
                    '[run]\nra_ties = "first-honest"\nlimit = 1\n')
    cells = {c.method: c for c in load_sweep(path).cells}
    argv = cells["sac"].argv
    assert argv[argv.index("--ra-ties") + 1] == "first-honest"
    assert "--ra-ties" not in cells["cpwbft"].argv  # CP-WBFT's RA is its global decision: no vote


class Scripted:
    """Answers `answer` to every solve and refine, `Score: 0.7` to every judgement."""
    name, stats = "scripted", {}

    def __init__(self, answer):
        self.answer = answer

    async def chat(self, messages, params=None, untrusted=False, tag=None):
        judge = messages[0]["content"] == prompts.JUDGE_SYSTEM
        return SimpleNamespace(text="Score: 0.7" if judge else f"Answer: {self.answer}")


def test_the_tie_rule_reaches_the_records_and_the_summary(tmp_path):
    tasks = get_task("gen-sum", 2)
    kwargs = dict(n=7, weak=2, byzantine=1, F=3, T=1, topology="complete", progress=False, table=False)
    first = run_experiment("sac", tasks, Scripted(tasks[0].gold), Scripted("1"), out=tmp_path / "f",
                           ra_ties="first-honest", **kwargs)
    drawn = run_experiment("sac", tasks, Scripted(tasks[0].gold), Scripted("1"), out=tmp_path / "d", **kwargs)
    def rows(name):
        return [json.loads(line) for line in (tmp_path / name / "results.jsonl").read_text().splitlines()]
    assert all(r["ra_ties"] == "first-honest" for r in rows("f")) and all("ra_ties" not in r for r in rows("d"))
    assert first["RA"] == drawn["RA"] == drawn["H-Majority"]  # 4 strong against 2 weak: no tie to break
    with pytest.raises(ValueError, match="tie rule"):
        run_experiment("sac", tasks, Scripted("1"), out=tmp_path / "x", ra_ties="last", **kwargs)
