"""mas_main at paper scale holds the resilience paper's settings, as its text states them (table written
from the paper, not from the file): a drift in the file fails here."""
import pytest

from byzantium.sweep.config import load_sweep

SYSTEMS = {"metagpt": "linear", "self-collab": "linear", "camel": "flat", "spp": "flat", "mad": "hierarchical",
           "agentverse": "hierarchical"}
BACKBONES = {"gpt-3.5-turbo", "gpt-4o"}  # GPT-3.5 and GPT-4o for the main results
TASKS = {"humaneval": ("HumanEval.jsonl.gz", 164), "ciar": ("ciar.jsonl", 50),
         "commonmt": ("commonmt_lexical.jsonl", 100), "faireval": ("faireval.jsonl", 80)}
PM, PE = 1.0, 0.2  # AutoInject's defaults
# The defence study: Self-collaboration and Camel, code, GPT-3.5, each defence with no fault and both faults.
DEFENDED = {"self-collab", "camel"}
DEFENCES = {"challenger", "inspector", "both"}


@pytest.fixture(scope="module")
def sweep():
    return load_sweep("mas_main", scale="paper", check_files=False)


def conditions(cell):
    p = cell.params
    return (p["fault"], p.get("error_type"), p["defence"])


def test_main_results_every_system_task_and_backbone(sweep):
    got = {(c.params["model"], c.params["system"], c.params["task"], conditions(c)) for c in sweep.cells}
    for model in BACKBONES:
        for system in SYSTEMS:
            for task in TASKS:
                for cond in (("none", None, "none"), ("autotransform", None, "none"),
                             ("autoinject", "semantic", "none")):
                    assert (model, system, task, cond) in got


def test_error_types_and_defences_only_where_the_paper_ran_them(sweep):
    for c in sweep.cells:
        p = c.params
        if p.get("error_type") == "syntactic":  # the error-type study: GPT-3.5, code
            assert (p["model"], p["task"], p["defence"]) == ("gpt-3.5-turbo", "humaneval", "none")
        if p["defence"] != "none":
            assert p["defence"] in DEFENCES and p["system"] in DEFENDED
            assert (p["model"], p["task"]) == ("gpt-3.5-turbo", "humaneval")
    syntactic = {c.params["system"] for c in sweep.cells if c.params.get("error_type") == "syntactic"}
    assert syntactic == set(SYSTEMS)
    defended = {(c.params["system"], conditions(c)) for c in sweep.cells if c.params["defence"] != "none"}
    assert defended == {(s, (f, e, d)) for s in DEFENDED for d in DEFENCES
                        for f, e in (("none", None), ("autotransform", None), ("autoinject", "semantic"))}
    assert len(sweep.cells) == 2 * 6 * 4 * 3 + 6 + 2 * 3 * 3


def test_faults_tasks_sizes_and_one_faulty_agent(sweep):
    for c in sweep.cells:
        p = c.params
        assert p["system"] in SYSTEMS and p["model"] in BACKBONES
        data, size = TASKS[p["task"]]
        assert p["data"] == data and p["limit"] == size
        assert p["fault"] in ("none", "autotransform", "autoinject")
        if p["fault"] == "autoinject":
            assert (p["pm"], p["pe"]) == (PM, PE) and p["error_type"] in ("semantic", "syntactic")
        assert "faulty_role" not in p  # each system's own (the paper's) role, one at a time
        assert "--backend" not in c.argv  # served with --backend openai on the command line


def test_structures_and_metrics(sweep):
    assert sweep.analysis["structures"] == {s: [n for n, k in SYSTEMS.items() if k == s]
                                            for s in ("linear", "flat", "hierarchical")}
    from byzantium.experiments.resilience import METRICS
    assert METRICS["code"] == "pass@1" and METRICS["number"] == METRICS["verdict"] == "accuracy"
    # CommonMT: the paper's BLEURT-20; ours is chrF, and the published entries say so.
    assert "chrF" in METRICS["translation"]
    mt = [p for p in sweep.published if p.get("where", {}).get("task") == "commonmt"]
    assert mt and all(p["unit"] == "BLEURT-20 x100" and "chrF" in p["note"] for p in mt)


def test_published_numbers_match_cells_and_averages_say_so(sweep):
    params = [c.params for c in sweep.cells]
    for p in sweep.published:
        where = p["where"]
        if not where:  # a headline average (both backbones, tasks or structures): said in the metric
            assert "mean" in p["metric"]
            continue
        assert any(all(c.get(k) == v for k, v in where.items()) for c in params), p
        if "system" not in where:
            assert "mean of the six systems" in p["metric"]
    values = {(p["metric"], p["value"]) for p in sweep.published}
    for s, v in (("hierarchical", 5.51), ("flat", 10.54), ("linear", 23.72)):
        assert (f"average drop, {s} (mean of both backbones, both faults, all tasks)", v) in values
    share = [p for p in sweep.published if p["metric"] == "recovered share of the AutoTransform loss"]
    assert share[0]["value"] == 96.4 and share[0]["where"]["system"] == "self-collab"
