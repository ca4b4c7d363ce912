"""`byzantium sweep`: every shipped experiment file is valid at both scales; a broken file is refused
naming the key, before any model loads; one smoke sweep per paper runs end to end on the embedded
model; an interrupted sweep resumes without redoing finished instances; a cell that cannot run fails
alone. main() is called in-process to save start-up time."""
import json
import os
import signal
from pathlib import Path

import pytest

import byzantium.backends
from byzantium.backends.native import NativeLLM
from byzantium.cli import main
from byzantium.sweep.config import ConfigError, load_sweep
from byzantium.sweep.needs import needed_len
from byzantium.sweep.pool import Borrowed
from byzantium.sweep.running import SWEEP

CONFIGS = sorted((Path(byzantium.__file__).parent / "experiments" / "configs").glob("*.toml"))
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # the real datasets, next to the repo


@pytest.fixture
def no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")
    monkeypatch.setattr(byzantium.backends, "LLMPool", refuse)


def rows(path):
    return [json.loads(line) for line in (Path(path) / "results.jsonl").read_text().splitlines()]


def test_the_shipped_files_are_there():
    names = {p.stem for p in CONFIGS}
    assert {"sac_table3_4", "sac_table7", "sac_table8", "ct_table1", "ct_table3", "ct_table5", "ct_table6_8",
            "ct_table9", "mas_main"} <= names


@pytest.mark.parametrize("scale", ["smoke", "paper"])
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_file_validates(path, scale, no_loading):
    sweep = load_sweep(path, scale, check_files=False)
    assert sweep.cells and sweep.analysis["kind"]
    assert set(sweep.paper.split(" + ")) <= {"sac", "consensus-trap", "mas"}  # frontier.toml names two
    names = [c.name for c in sweep.cells]
    assert len(set(names)) == len(names)
    for cell in sweep.cells:
        assert cell.name.replace("-", "").replace(".", "").replace("+", "").isalnum()  # filesystem-safe
        assert cell.params["task"] and needed_len(cell, sweep.prompt_budget) > 0
    for p in sweep.published:  # every published number matches at least one cell of the paper scale
        if scale == "paper" and p["where"]:
            assert any(c.method == p["method"] and all(c.params.get(k) == v for k, v in p["where"].items())
                       for c in sweep.cells), p
    if scale == "smoke":  # smoke runs on the embedded model, a few instances each
        assert all(m in (None, "smollm2-135m") for c in sweep.cells for m in c.models)
        assert all(c.params.get("limit", 99) <= 3 for c in sweep.cells)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_paper_scale_finds_its_data_files(path, no_loading):
    if not DATA.is_dir():
        pytest.skip("the datasets are not next to the repository (../shared/data)")
    sweep = load_sweep(path, "paper", data_root=DATA, check_files=False)
    missing = {Path(c.argv[c.argv.index("--data") + 1]).name for c in sweep.cells if "--data" in c.argv
               and not Path(c.argv[c.argv.index("--data") + 1]).exists()}
    assert missing <= NOT_SHARED, missing


# The SAC paper's Tables 7-8 run 30 Level 4 Hendrycks MATH problems that its Table 9 names by qid only:
# the user builds that file; no shared copy exists.
NOT_SHARED = {"math_level4_30.jsonl"}


BASE = """
paper = "consensus-trap"
table = "Table X"
method = "maj"
[analysis]
kind = "corruption"
[run]
limit = 2
"""


@pytest.mark.parametrize("extra, problem", [
    ("[axes]\ncorrupt = [7]\n", "[axes].corrupt: 7 is more than agents=5"),
    ("[axes]\npattern = ['3x2']\n", "[axes].pattern:"),
    ("[axes]\nattack = ['mild']\n", "[axes].attack:"),
    ("[axes]\nchunk = 5\n", "[axes].chunk: an axis is a non-empty list"),
    ("[axes]\nweak = [2]\n", "[axes].weak: does not apply to maj"),
    ("[axes]\nbogus = [1]\n", "[axes].bogus: unknown key"),
    ("[axes]\ntask = ['gen-nothing']\n", "[axes].task:"),
    ("[axes]\ntask = [{name = 'g', task = 'gsm8k', data = 'no-such.jsonl'}]\n", "[axes].task: data file 'no-such.jsonl' not found"),
    ("[axes]\nagents = [5]\nmodels = [['a', 'b']]\n", "[axes].models: names 2 models for agents=5"),
    ("[axes]\ncorrupted = [[0, 9]]\n", "[axes].corrupted: distinct agent indices"),
    ("[scale.smoke.run]\nlimit = 0\n", "[scale.smoke.run].limit: --limit must be >= 1"),
    ("[scale.paper.run]\nlimit = 1\n", "[scale.smoke]: missing"),
    ("[[published]]\ntable = 'T'\nmethod = 'maj'\nmetric = 'acc'\nvalue = 'high'\nwhere = {}\nsource = 's'\n",
     "[[published]] #1.value"),
    ("[models.'a/x']\nquantization = 'int4'\n", "[models.\"a/x\"].quantization: 'int4'; known: fp8"),
    ("[models.'a/x']\ntensor_parallel_size = 0\n", "[models.\"a/x\"].tensor_parallel_size: a positive integer, got 0"),
    ("[models.'a/x']\ntensor_parallel = 2\n", "[models.\"a/x\"].tensor_parallel: unknown key; known: "
                                             "chat_template_kwargs, max_model_len, tensor_parallel_size, quantization"),
])
def test_a_broken_file_is_refused_naming_the_key(extra, problem, tmp_path, no_loading, capsys):
    path = tmp_path / "sweep.toml"
    path.write_text(BASE + extra)
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"sweep.toml: {problem}" in err, err
    assert not (tmp_path / "out").exists()


def test_sac_and_resilience_settings_are_checked_too(tmp_path, no_loading):
    path = tmp_path / "s.toml"
    path.write_text('paper = "sac"\nmethod = "sac"\n[analysis]\nkind = "sac"\n[axes]\nweak = [5]\nbyzantine = [3]\n')
    with pytest.raises(ConfigError, match=r"s.toml: \[axes\].weak: weak 5 plus byzantine 3 is more than agents=7"):
        load_sweep(path)
    path.write_text('paper = "sac"\nmethod = "sac"\n[analysis]\nkind = "sac"\n[run]\nF = 6\n')
    with pytest.raises(ConfigError, match=r"\[run\].F:"):
        load_sweep(path)  # the graph cannot be 7-robust: sac.check_config's refusal, named by its key
    path.write_text('paper = "mas"\nmethod = "resilience"\n[analysis]\nkind = "resilience"\n[run]\npe = 2.0\n')
    with pytest.raises(ConfigError, match=r"\[run\].pe: --pe must be a probability"):
        load_sweep(path)


def test_cells_are_named_from_their_settings_and_cells_combine_with_axes(tmp_path):
    path = tmp_path / "k.toml"
    path.write_text(BASE.replace('method = "maj"', 'method = ["maj", "rrmaj"]') +
                    "[axes]\npattern = ['0c5t', '3c2t']\nchunk = [10, 300]\n"
                    "[[cells]]\nattack = 'strong'\n[[cells]]\nattack = 'moderate'\n")
    sweep = load_sweep(path)
    names = [c.name for c in sweep.cells]
    assert "rrmaj-gen-arith-3c2t-K300-moderate" in names
    assert "maj-gen-arith-3c2t-moderate" in names  # MAJ has no K: run once, not once per K
    assert len(names) == 2 * 2 + 2 * 2 * 2
    cell = next(c for c in sweep.cells if c.name == "rrmaj-gen-arith-3c2t-K300-moderate")
    assert cell.params | {"chunk": 300, "trajectories": 5, "pattern": "3c2t", "agents": 5, "corrupt": 3} == cell.params


def test_explicit_corrupted_agents_go_first_with_their_models(tmp_path):
    path = tmp_path / "h.toml"
    path.write_text(BASE + "models = ['a/x', 'a/x', 'a/x', 'b/y', 'b/y']\ncorrupted = [3, 4]\n")
    (cell,) = load_sweep(path).cells
    assert cell.argv[cell.argv.index("--models") + 1] == "b/y,b/y,a/x,a/x,a/x"
    assert cell.argv[cell.argv.index("--corrupt") + 1] == "2"
    assert cell.params["pattern"] == "2c3t" and cell.params["models"] == ["a/x", "a/x", "a/x", "b/y", "b/y"]
    assert cell.name == "maj-gen-arith"


def test_dry_run_at_paper_scale_lists_models_backends_and_lengths(no_loading, capsys, tmp_path):
    path = next(p for p in CONFIGS if p.stem == "sac_table3_4")
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--scale", "paper", "--dry-run"] +
                (["--data-root", str(DATA)] if DATA.is_dir() else [])) in (0, 2)
    out, err = capsys.readouterr()
    if not DATA.is_dir():
        assert "--data-root" in err  # the paper's data files are refused without it
        return
    assert "Qwen/Qwen3-4B" in out and "max_model_len needed 1960" in out
    assert "enable_thinking" in out
    assert "needs --backend openai --base-url" in out or "local engine" in out
    assert not (tmp_path / "o").exists()


def test_a_cell_whose_model_is_not_here_fails_alone(tmp_path, no_loading, capsys):
    path = tmp_path / "m.toml"
    path.write_text(BASE + "[axes]\nmodel = ['nobody-here/no-such-model-1', 'nobody-here/no-such-model-2']\n")
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--no-progress"]) == 1
    sweep = json.loads((tmp_path / "o" / SWEEP).read_text())
    assert [c["status"] for c in sweep["cells"]] == ["failed", "failed"]
    assert "is not on this machine" in sweep["cells"][0]["error"] and "--backend openai" in sweep["cells"][0]["error"]
    err = capsys.readouterr().err
    assert "2 cell(s) cannot run here" not in err and err.count("cannot run here") == 2  # once per model


def test_a_cell_longer_than_the_models_context_fails_alone(tmp_path, no_loading):
    path = tmp_path / "l.toml"
    path.write_text(BASE + "model = 'smollm2-135m'\n[axes]\nmax_len = [9000]\n"
                    "[models.'smollm2-135m']\nmax_model_len = 4096\n")  # e.g. what a server is configured with
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--no-progress"]) == 1
    (cell,) = json.loads((tmp_path / "o" / SWEEP).read_text())["cells"]
    assert cell["status"] == "failed" and "needs max_model_len 9512" in cell["error"] and "4096" in cell["error"]


def test_a_shipped_file_is_found_by_name(no_loading, tmp_path, capsys):
    assert main(["sweep", "ct_table9", "--out", str(tmp_path / "o"), "--dry-run"]) == 0
    assert "ct_table9.toml" in capsys.readouterr().out
    assert main(["sweep", "no_such_table", "--out", str(tmp_path / "o")]) == 2
    assert "ct_table1" in capsys.readouterr().err  # the shipped names
    assert main(["sweep", "ct_table9", "--out", str(tmp_path / "o"), "--backend", "openai"]) == 2
    assert "--base-url" in capsys.readouterr().err and not (tmp_path / "o").exists()
    assert main(["sweep", "ct_table9", "--dry-run"]) == 0  # a dry run writes nothing: no --out needed
    assert main(["sweep", "ct_table9"]) == 2 and "--out DIR is required" in capsys.readouterr().err


def test_chat_template_kwargs_reach_the_template(smollm2_dir):
    from transformers import AutoTokenizer
    from byzantium.backends.base import LLM

    class Plain(LLM):  # only the tokenizer side of an LLM
        async def _generate(self, ids, params, tag=None): ...
        async def _logprobs(self, ids, tag=None): ...
        async def open_session(self, prompt, untrusted=False): ...
        async def extend(self, session, tokens_or_text): ...
        async def continue_(self, session, params=None, tag=None): ...
        async def close_session(self, session): ...
    llm = Plain()
    llm.tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    llm.tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}{% if think %} think{% endif %}"
    messages = [{"role": "user", "content": "hi"}]
    assert llm.decode(llm.render_chat(messages)) == "hi"
    llm.chat_template_kwargs = {"think": True}
    assert llm.decode(llm.render_chat(messages)) == "hi think"


def test_borrowed_pool_sets_chat_template_kwargs_and_does_not_close():
    class Pool:
        shares, placement, closed = {}, None, False

        def get(self, model=None):
            return NativeLLM.__new__(NativeLLM)

        def close(self):
            self.closed = True
    pool = Pool()
    with Borrowed(pool, {"q/qwen3": {"chat_template_kwargs": {"enable_thinking": False}}}) as view:
        assert view.get("q/qwen3").chat_template_kwargs == {"enable_thinking": False}
        assert view.get("other/model").chat_template_kwargs == {}
    assert not pool.closed


def test_attack_modes_reach_the_runs_and_name_the_cells(tmp_path):
    path = tmp_path / "a.toml"
    path.write_text(BASE.replace('method = "maj"', 'method = ["maj", "rrmaj"]') +
                    "[axes]\npattern = ['2c3t']\n[[cells]]\nattack_mode = 'trajectory'\n"
                    "[[cells]]\nattack_mode = 'logprob'\ncandidates = 3\n")
    cells = {c.name: c for c in load_sweep(path).cells}
    assert set(cells) == {"maj-gen-arith-2c3t", "rrmaj-gen-arith-2c3t-trajectory", "rrmaj-gen-arith-2c3t-logprob-cand3"}
    argv = cells["rrmaj-gen-arith-2c3t-logprob-cand3"].argv
    assert argv[argv.index("--attack-mode") + 1] == "logprob" and argv[argv.index("--candidates") + 1] == "3"
    assert "--attack-mode" not in cells["maj-gen-arith-2c3t"].argv  # MAJ has no shared text: run once
    path.write_text(BASE.replace('"maj"', '"rrmaj"') + "[axes]\nattack_mode = ['sideways']\n")
    with pytest.raises(ConfigError, match=r"\[axes\].attack_mode:.*sideways"):
        load_sweep(path)  # the run parser's choices, named by the key


SAC_BASE = 'paper = "sac"\nmethod = ["sac", "cpwbft"]\n[analysis]\nkind = "sac"\n[run]\nstrong_model = "a/strong"\n'


@pytest.mark.parametrize("adversary, loaded", [("adaptive", True), ("decoy", True), ("judge-targeted", False),
                                               ("fixed", False)])
def test_an_adversary_that_runs_a_model_loads_it_and_an_adaptive_one_judges_in_cpwbft_too(adversary, loaded,
                                                                                              tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SAC_BASE + f"adversary = '{adversary}'\nadversary_model = 'b/adv'\njudge_max_tokens = 77\n")
    for cell in load_sweep(path).cells:
        assert ("b/adv" in cell.models) == loaded, (cell.method, cell.models)
        assert cell.argv[cell.argv.index("--judge-max-tokens") + 1] == "77"  # cpwbft's adaptive adversary judges
    path.write_text(SAC_BASE + "adversary = 'adaptive'\nadversary_model = 'b/adv'\nbyzantine = 0\n")
    assert all(cell.models == ["a/strong"] for cell in load_sweep(path).cells)  # no adversary: no model
    # the context a cell needs covers a judgement wherever one is made (SAC's receivers, an adaptive adversary)
    path.write_text(SAC_BASE + f"adversary = '{adversary}'\nmax_tokens = 10\njudge_max_tokens = 900\n")
    for cell in load_sweep(path).cells:
        assert (needed_len(cell, 0) > 900) == (cell.method == "sac" or adversary == "adaptive"), cell.name


def test_one_budget_for_both_families(tmp_path):
    path = tmp_path / "f.toml"
    path.write_text('paper = ["consensus-trap", "sac"]\nmethod = ["maj", "rrmaj", "sac", "cpwbft"]\n'
                    '[analysis]\nkind = "frontier"\n[run]\nagents = 5\nweak = 0\nF = 2\ntopology = "complete"\n'
                    'chunk = 8\nlimit = 2\n[axes]\nbudget = [0, 2]\n')
    sweep = load_sweep(path)
    assert sweep.paper == "consensus-trap + sac"
    assert {c.name for c in sweep.cells} == {f"{m}-gen-arith-{b}" for m in ("maj", "rrmaj") for b in ("0c5t", "2c3t")} | \
        {f"{m}-gen-arith-b{b}" for m in ("sac", "cpwbft") for b in (0, 2)}
    for cell in sweep.cells:
        flag = "--corrupt" if cell.method in ("maj", "rrmaj") else "--byzantine"
        other = "--byzantine" if flag == "--corrupt" else "--corrupt"
        b = int(cell.argv[cell.argv.index(flag) + 1])
        assert other not in cell.argv and b in (0, 2) and cell.params["agents"] == 5
        assert ("--chunk" in cell.argv) == (cell.method == "rrmaj") and ("--f" in cell.argv) == (flag == "--byzantine")
    assert len(sweep.cells) == 8
    for extra, problem in (("system = 'camel'\n", r"\[run\].system: does not apply to maj"),
                           ("corrupt = 1\n", r"\[axes\].budget: give budget or corrupt, not both")):
        path.write_text(path.read_text().replace("[axes]", extra + "[axes]"))
        with pytest.raises(ConfigError, match=problem):
            load_sweep(path)
        path.write_text(path.read_text().replace(extra, ""))


# ------------------------------------------------------------------------- on the embedded model

@pytest.mark.parametrize("stem", ["ct_table1", "sac_table3_4", "mas_main"])
def test_the_smoke_scale_runs_end_to_end(stem, smollm2_dir, tmp_path, monkeypatch):
    loads = []
    real = byzantium.backends.LLMPool

    class Counting(real):  # one engine per model for the whole sweep
        def get(self, model=None):
            if self._key(model) not in self._llms:
                loads.append(model)
            return super().get(model)
    monkeypatch.setattr(byzantium.backends, "LLMPool", Counting)
    path = next(p for p in CONFIGS if p.stem == stem)
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--device", "cpu", "--no-progress"]) == 0
    sweep = json.loads((out / SWEEP).read_text())
    assert sweep["name"] == stem and sweep["scale"] == "smoke" and sweep["config"] == str(path)
    assert sweep["cells"] and all(c["status"] == "done" for c in sweep["cells"]), sweep["cells"]
    assert len(loads) == 1
    for cell in sweep["cells"]:
        summary = json.loads((out / cell["dir"] / "summary.json").read_text())
        assert summary["complete"] and summary["instances"] == cell["params"]["limit"]
        assert len(rows(out / cell["dir"])) == cell["params"]["limit"]


def test_an_interrupted_sweep_resumes_without_redoing_instances(smollm2_dir, tmp_path, monkeypatch):
    path = tmp_path / "r.toml"
    path.write_text(BASE.replace("limit = 2", "limit = 3\nagents = 3\nmax_len = 8\nconcurrency = 1") +
                    "[axes]\ncorrupt = [0, 1]\n")
    out = tmp_path / "out"
    argv = ["sweep", str(path), "--out", str(out), "--device", "cpu", "--no-progress"]
    calls, stop_at = [], [5]
    real = NativeLLM._generate

    async def counting(self, ids, params, tag=None):
        calls.append(tag)
        if len(calls) == stop_at[0]:  # Ctrl-C in the middle of the first cell's second instance
            os.kill(os.getpid(), signal.SIGINT)
        return await real(self, ids, params, tag)
    monkeypatch.setattr(NativeLLM, "_generate", counting)

    assert main(argv) == 130
    sweep = json.loads((out / SWEEP).read_text())
    assert [c["status"] for c in sweep["cells"]] == ["pending", "pending"]
    first = sweep["cells"][0]["dir"]
    kept = rows(out / first)
    assert len(kept) == 1 and not (out / sweep["cells"][1]["dir"]).exists()  # one MAJ instance = 3 answers

    calls.clear()
    stop_at[0] = -1
    assert main(argv) == 0
    assert len(calls) == 2 * 3 + 3 * 3  # the first cell's two missing instances, the second cell's three
    again = rows(out / first)
    assert again[0] == kept[0] and len({r["id"] for r in again}) == 3
    sweep = json.loads((out / SWEEP).read_text())
    assert [c["status"] for c in sweep["cells"]] == ["done", "done"]

    calls.clear()
    monkeypatch.setattr(byzantium.backends, "LLMPool", lambda *a, **k: pytest.fail("loaded a model"))
    assert main(argv) == 0 and calls == []  # all done: no engine at all


# ------------------------------------------------------------------------- --limit and the dry run

def sweep_file(tmp_path, text, name="t.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_limit_cuts_every_cell_and_a_rerun_with_another_is_refused(tmp_path, no_loading, capsys):
    path = sweep_file(tmp_path, BASE + "[axes]\nmodel = ['nobody-here/no-such-model-1']\ncorrupt = [0, 1]\n")
    out = tmp_path / "o"
    argv = ["sweep", str(path), "--out", str(out), "--no-progress"]
    assert main(argv + ["--limit", "1"]) == 1  # the cells fail (no model here), after sweep.json is written
    sweep = json.loads((out / SWEEP).read_text())
    assert sweep["limit"] == 1 and [c["params"]["limit"] for c in sweep["cells"]] == [1, 1]
    assert path.read_text().count("limit = 2") == 1  # the file is not touched
    capsys.readouterr()
    before = (out / SWEEP).read_text()
    for other, said in ((None, "no --limit"), (3, "--limit 3")):
        assert main(argv + ([] if other is None else ["--limit", str(other)])) == 2
        err = capsys.readouterr().err
        assert f"was swept with --limit 1, this run has {said}" in err and "another --out" in err, err
        assert (out / SWEEP).read_text() == before  # refused before anything is written
    assert main(argv + ["--limit", "1"]) == 1  # the same --limit resumes


def test_a_sweep_without_limit_refuses_a_rerun_with_one(tmp_path, no_loading, capsys):
    path = sweep_file(tmp_path, BASE + "model = 'nobody-here/no-such-model-1'\n")
    out = tmp_path / "o"
    assert main(["sweep", str(path), "--out", str(out), "--no-progress"]) == 1
    assert json.loads((out / SWEEP).read_text())["limit"] is None
    assert main(["sweep", str(path), "--out", str(out), "--no-progress", "--limit", "5"]) == 2
    assert "was swept with no --limit, this run has --limit 5" in capsys.readouterr().err


@pytest.mark.parametrize("extra, flags, problem", [
    ("", ["--limit", "0"], "--limit must be >= 1, got 0"),
    ("[axes]\nlimit = [1, 2]\n", ["--limit", "3"], "t.toml: [axes].limit varies limit across cells"),
    ("", ["--dtype", "int3"], "unknown --dtype 'int3'"),
    ("", ["--device-memory", "0"], "--device-memory must be > 0 GB"),
])
def test_bad_sweep_flags_are_refused_before_anything(extra, flags, problem, tmp_path, no_loading, capsys):
    path = sweep_file(tmp_path, BASE + extra)
    assert main(["sweep", str(path), "--out", str(tmp_path / "o")] + flags) == 2
    assert problem in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_limit_reaches_the_runs(smollm2_dir, tmp_path):
    path = sweep_file(tmp_path, BASE.replace("limit = 2", "limit = 3\nagents = 2\nmax_len = 4\n"))
    out = tmp_path / "o"
    assert main(["sweep", str(path), "--out", str(out), "--device", "cpu", "--no-progress", "--limit", "1"]) == 0
    (cell,) = json.loads((out / SWEEP).read_text())["cells"]
    assert json.loads((out / cell["dir"] / "summary.json").read_text())["instances"] == 1
    assert len(rows(out / cell["dir"])) == 1


def dry_run_lines(capsys, path, tmp_path, *flags):
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--dry-run", *flags]) == 0
    out = capsys.readouterr().out
    assert not (tmp_path / "o").exists()
    return out, {line.split()[0]: line.split() for line in out.splitlines() if line.split()}


def test_dry_run_counts_problems_from_data_limit_and_generators(tmp_path, no_loading, capsys):
    data = tmp_path / "seven.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i} + 1?", "answer": f"#### {i + 1}"}) + "\n" for i in range(7)))
    path = sweep_file(tmp_path, BASE.replace("limit = 2\n", "agents = 3\nmax_len = 10\n") +
                      "[axes]\ntask = ['gen-arith', {name = 'seven', task = 'gsm8k', data = 'seven.jsonl'}]\n")
    out, rows_ = dry_run_lines(capsys, path, tmp_path)
    assert rows_["maj-gen-arith"][2:4] == ["100", "3.0k"]  # a generator's default 100, x N x L = 3 x 10
    assert rows_["maj-seven"][2:4] == ["7", "210"]  # the file's 7 records
    assert "total: 107 problems, 3.2k generated tokens" in out
    out, rows_ = dry_run_lines(capsys, path, tmp_path, "--limit", "4")
    assert rows_["maj-gen-arith"][2] == "4" and rows_["maj-seven"][2] == "4"


def test_dry_run_weights_fit_and_rates(tmp_path, no_loading, capsys, monkeypatch):
    import byzantium.sweep.dry_run as sweep_mod
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "engine_throughput.json").write_text(json.dumps({"model": "smollm2-135m", "device": "cuda", "rows": [
        {"batch": 1, "byzantium": {"decode_tok_s": 10.0}}, {"batch": 32, "byzantium": {"decode_tok_s": 100.0}}]}))
    monkeypatch.setattr(sweep_mod, "BENCH", bench)
    sweep_mod.measured_rates.cache_clear()
    try:
        path = sweep_file(tmp_path, BASE.replace("limit = 2\n", "limit = 36\nagents = 5\nmax_len = 100\n") +
                          "[axes]\nmodel = ['smollm2-135m', 'meta-llama/Llama-3.3-70B-Instruct', "
                          "'meta-llama/Meta-Llama-3-8B-Instruct']\n")
        out, rows_ = dry_run_lines(capsys, path, tmp_path, "--device-memory", "141")
        small, big, mid = rows_["maj-gen-arith-smollm2-135m"], rows_["maj-gen-arith-Llama-3.3-70B"], \
            rows_["maj-gen-arith-Meta-Llama-3-8B"]
        assert small[3] == "18.0k" and small[5:11] == ["0.3", "GB", "yes", "3.0", "min", "(cuda)"]  # 18000 tokens at 100/s
        assert big[5:8] == ["140.0", "GB", "NO"] and "no measured rate" in " ".join(big)  # 70B x 2 > 0.8 x 141
        assert mid[5:8] == ["16.0", "GB", "yes"]
        assert "80% of 141 GB (--device-memory" in out
        assert "100 generated tok/s measured on cuda (bench/results/engine_throughput.json, batch 32)" in out
        assert "3.0 min at measured rates (2 cells with no measured rate not counted)" in out
        out, rows_ = dry_run_lines(capsys, path, tmp_path, "--device-memory", "141", "--dtype", "float32")
        assert rows_["maj-gen-arith-Meta-Llama-3-8B"][5:8] == ["32.0", "GB", "yes"]
        monkeypatch.setattr(sweep_mod, "BENCH", tmp_path / "nothing")
        sweep_mod.measured_rates.cache_clear()
        out, rows_ = dry_run_lines(capsys, path, tmp_path, "--device-memory", "141")
        assert "no measured rate for any cell" in out  # none is invented
    finally:
        sweep_mod.measured_rates.cache_clear()


def test_dry_run_names_each_models_plan(tmp_path, no_loading, capsys):
    path = sweep_file(tmp_path, BASE.replace("limit = 2\n", "limit = 36\nagents = 5\nmax_len = 100\n") +
                      "[axes]\nmodel = ['meta-llama/Llama-3.3-70B-Instruct', 'meta-llama/Meta-Llama-3-8B-Instruct', "
                      "'org/unknown-model']\n[models.'meta-llama/Llama-3.3-70B-Instruct']\nquantization = 'fp8'\n")
    out, rows_ = dry_run_lines(capsys, path, tmp_path, "--device-memory", "150.1")  # one H200: 139.8 GiB
    assert rows_["maj-gen-arith-Llama-3.3-70B"][5:8] == ["70.0", "GB", "yes"]  # fp8 (the file's): a byte a weight
    assert rows_["maj-gen-arith-Meta-Llama-3-8B"][5:8] == ["16.0", "GB", "yes"]
    models = {line.split(":")[0].strip(): line for line in out.splitlines() if line.startswith("  ")}
    big, small = models["meta-llama/Llama-3.3-70B-Instruct"], models["meta-llama/Meta-Llama-3-8B-Instruct"]
    assert "weights 70.0 GB (70.0B parameters from its name, fp8)" in big
    assert "plan on 1 x 139.8 GiB: TP 1 fp8, 184k KV tokens left (16 x 612 needed), as set" in big
    assert "plan on 1 x 139.8 GiB: TP 1 bf16" in small and "as set" not in small
    assert "plan unknown (not on this machine nor in the planner's table)" in models["org/unknown-model"]
    assert "plan: `byzantium plan`'s for each model alone on --gpus 1 such GPU" in out
    # Two GPUs: the planner prefers bf16 over two; the file's fp8 on one still fits, and is said.
    out, rows_ = dry_run_lines(capsys, path, tmp_path, "--device-memory", "150.1", "--gpus", "2")
    assert "plan on 2 x 139.8 GiB: TP 2 bf16, 381k KV tokens left (16 x 612 needed); as set, TP 1 fp8: 184k KV " \
           "tokens" in out
    # The sweep's own flags win over the file's: TP 2 over one GPU cannot run, and the cell does not fit.
    out, rows_ = dry_run_lines(capsys, path, tmp_path, "--device-memory", "150.1", "--tensor-parallel-size", "2")
    assert "as set, TP 2 fp8: needs 2 GPUs (--gpus 1)" in out
    assert rows_["maj-gen-arith-Llama-3.3-70B"][5:8] == ["35.0", "GB", "NO"]
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--dry-run", "--gpus", "0"]) == 2
    assert "--gpus must be >= 1, got 0" in capsys.readouterr().err


def test_each_models_engine_settings_reach_its_engine_only(tmp_path, smollm2_dir):
    from byzantium.sweep.running import run_sweep
    # One cell, two models with different settings: allowed (each engine has its own options).
    path = sweep_file(tmp_path, BASE.replace("limit = 2", "limit = 1\nagents = 3\nmax_len = 4") +
                      "models = ['smollm2-135m', 'smollm2-135m', 'org/other']\n"
                      "[models.'smollm2-135m']\ntensor_parallel_size = 2\nquantization = 'fp8'\n"
                      "[models.'org/other']\nchat_template_kwargs = {x = 1}\n")
    (cell,) = load_sweep(path).cells
    assert not {"--tensor-parallel-size", "--quantization"} & set(cell.argv)  # no longer run flags
    seen = []

    class Refusing:  # the run's pool: records its options, loads nothing
        def __init__(self, backend, **kwargs):
            seen.append(kwargs)
            raise RuntimeError("no engine in this test")
    sweep = load_sweep(path)
    sweep.cells[0].models = ["smollm2-135m"]  # the other model is not on this machine: run the cell anyway
    result = run_sweep(sweep, tmp_path / "o", progress=False, factory=Refusing)
    assert seen[0]["model_options"] == {"smollm2-135m": {"tensor_parallel_size": 2, "quantization": "fp8"}}
    assert "tensor_parallel_size" not in seen[0] and "quantization" not in seen[0]
    assert "no engine in this test" in result["cells"][0]["error"]
    # The sweep's own flag wins for every model: the file's setting of it is left out.
    seen.clear()
    run_sweep(sweep, tmp_path / "o2", ["--no-progress", "--tensor-parallel-size", "4"], progress=False,
              factory=Refusing)
    assert seen[0]["tensor_parallel_size"] == 4 and seen[0]["model_options"] == {"smollm2-135m": {"quantization": "fp8"}}
    seen.clear()
    run_sweep(sweep, tmp_path / "o3", ["--no-progress", "--tensor-parallel-size", "1", "--quantization", "fp8"],
              progress=False, factory=Refusing)
    assert "model_options" not in seen[0]


def test_the_shared_pool_gives_each_model_its_options_and_plans_them_together():
    from byzantium.sweep.pool import SharedPool
    made = []

    class Pool:
        def __init__(self, backend, **kwargs):
            self.backend, self.kwargs, self.planned, self.closed = backend, kwargs, [], False
            made.append(self)

        def plan(self, models):
            self.planned.append(list(models))
            if len(models) > 2:
                raise ValueError("do not fit together")

        def close(self):
            self.closed = True
    settings = {"big/70B": {"quantization": "fp8"}, "small/8B": {"chat_template_kwargs": {"x": 1}},
                "huge/Scout": {"tensor_parallel_size": 2}}
    shared = SharedPool(["big/70B", "small/8B"], settings, Pool)
    shared.next = ["big/70B", "small/8B"]
    shared("native", device="cuda")
    shared.next = ["small/8B"]
    shared("native", device="cuda")  # planned with the 70B: the same pool
    assert len(made) == 1 and made[0].planned == [["big/70B", "small/8B"]]
    assert made[0].kwargs == {"device": "cuda", "model_options": {"big/70B": {"quantization": "fp8"},
                                                                  "huge/Scout": {"tensor_parallel_size": 2}}}
    shared("native", device="cuda", quantization="fp8")  # other pool kwargs: a new pool; the flag wins
    assert len(made) == 2 and made[0].closed
    assert made[1].kwargs["model_options"] == {"huge/Scout": {"tensor_parallel_size": 2}}
    shared("hf")  # not the engine: no engine options
    assert "model_options" not in made[2].kwargs
    # Models that do not fit together: the next cell's only.
    shared = SharedPool(["big/70B", "small/8B", "huge/Scout"], settings, Pool)
    shared.next = ["huge/Scout"]
    shared("native")
    assert made[3].planned == [["big/70B", "small/8B", "huge/Scout"], ["huge/Scout"]]


@pytest.mark.parametrize("name, params", [
    ("meta-llama/Llama-3.3-70B-Instruct", 70e9), ("Qwen/Qwen2.5-1.5B-Instruct", 1.5e9), ("Qwen/Qwen3-4B", 4e9),
    ("Qwen/Qwen3-30B-A3B", 30e9), ("mistralai/Mistral-Small-3.1-24B-Instruct-2503", 24e9),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", 109e9), ("mistralai/Mixtral-8x7B-Instruct-v0.1", 46.7e9),
    (None, 135e6), ("gpt-3.5-turbo", None), ("someone/Foo-20B-64E", None),
])
def test_parameters_from_a_models_name(name, params):
    from byzantium.sweep.dry_run import model_params
    assert model_params(name)[0] == params


def test_generated_tokens_per_method(tmp_path):
    from byzantium.sweep.dry_run import cell_tokens
    path = sweep_file(tmp_path, BASE.replace('method = "maj"', 'method = ["maj", "rr", "rrmaj"]') +
                      "agents = 4\nmax_len = 50\ntrajectories = 3\n")
    assert {c.method: cell_tokens(c) for c in load_sweep(path).cells} == {"maj": 200, "rr": 50, "rrmaj": 150}
    path = sweep_file(tmp_path, 'paper = "sac"\nmethod = ["sac", "cpwbft"]\n[analysis]\nkind = "sac"\n[run]\n'
                      'topology = "complete"\nagents = 4\nweak = 0\nbyzantine = 1\nF = 1\nrounds = 2\n'
                      'max_tokens = 10\njudge_max_tokens = 3\n', "s.toml")
    tokens = {c.method: cell_tokens(c) for c in load_sweep(path).cells}
    # SAC: 4 solves + self-scores, then per round 4 refines + re-scores and 4 x 3 neighbours judged
    assert tokens == {"sac": 4 * 13 + 2 * (4 * 13 + 12 * 3), "cpwbft": 4 * 3 * 10}
    path = sweep_file(tmp_path, 'paper = "mas"\nmethod = "resilience"\n[analysis]\nkind = "resilience"\n[run]\n'
                      'system = "metagpt"\nmax_tokens = 7\n', "r.toml")
    assert cell_tokens(load_sweep(path).cells[0]) == 5 * 7  # five roles, one turn each


def test_generated_tokens_from_the_defaults(tmp_path):
    """The estimate where the file leaves a setting to the run: RRMaj's M is N, SAC's logprob scoring
    generates no judgement, resilience's turns run to the agents' own limit (run resilience --help: 1024)."""
    from byzantium.sweep.dry_run import cell_tokens
    path = sweep_file(tmp_path, BASE.replace('method = "maj"', 'method = ["maj", "rr", "rrmaj"]') + "agents = 4\n")
    assert {c.method: cell_tokens(c) for c in load_sweep(path).cells} == {"maj": 4 * 512, "rr": 512, "rrmaj": 4 * 512}
    path = sweep_file(tmp_path, 'paper = "sac"\nmethod = "sac"\n[analysis]\nkind = "sac"\n[run]\n'
                      'topology = "complete"\nagents = 4\nweak = 0\nbyzantine = 1\nF = 1\nrounds = 2\n'
                      'max_tokens = 10\nscore_mode = "logprob"\n', "s.toml")
    assert cell_tokens(load_sweep(path).cells[0]) == 4 * 10 + 2 * 4 * 10  # solves and refines only
    path = sweep_file(tmp_path, 'paper = "mas"\nmethod = "resilience"\n[analysis]\nkind = "resilience"\n[run]\n'
                      'system = "metagpt"\n', "r.toml")
    assert cell_tokens(load_sweep(path).cells[0]) == 5 * 1024


def test_the_context_a_cell_needs(tmp_path):
    """needed_len past the prompt: RR the shared answer (L); SAC the neighbours' answers (64 tokens each)
    and the longer of a solve and a judgement (CP-WBFT: a solve); resilience 4 earlier messages and its
    own, at max_tokens (unset: 1024) each."""
    path = sweep_file(tmp_path, BASE.replace('method = "maj"', 'method = ["maj", "rrmaj"]') + "max_len = 50\n")
    assert [needed_len(c, 0) for c in load_sweep(path).cells] == [50, 50]
    path = sweep_file(tmp_path, 'paper = "sac"\nmethod = ["sac", "cpwbft"]\n[analysis]\nkind = "sac"\n[run]\n'
                      'agents = 4\nweak = 0\nbyzantine = 1\nF = 1\ntopology = "complete"\nmax_tokens = 10\n'
                      'judge_max_tokens = 30\n', "s.toml")
    assert {c.method: needed_len(c, 100) for c in load_sweep(path).cells} == {"sac": 100 + 4 * 64 + 30,
                                                                               "cpwbft": 100 + 4 * 64 + 10}
    path = sweep_file(tmp_path, 'paper = "mas"\nmethod = "resilience"\n[analysis]\nkind = "resilience"\n'
                      '[[cells]]\nsystem = "camel"\n[[cells]]\nsystem = "metagpt"\nmax_tokens = 8\n', "r.toml")
    assert [needed_len(c, 0) for c in load_sweep(path).cells] == [5 * 1024, 5 * 8]


def test_every_run_method_tells_the_sweep_what_it_shows_and_generates():
    """No method is left to a table in the sweep: each declares what its cells show (keys a file may
    set), how many tokens a cell generates, the context it needs and the run's checks that load nothing;
    a cell's default task is its --task flag's."""
    from byzantium.experiments.run_command import RUN_METHODS
    from byzantium.sweep.cells import DEFAULT_TASK, PARSERS
    for command in RUN_METHODS:
        assert None not in (command.sweep_shown, command.sweep_tokens, command.sweep_length, command.sweep_check)
        args = PARSERS[command.name].parse_args([])
        assert set(command.sweep_shown(args)) <= set(command.sweep_keys), command.name
    assert DEFAULT_TASK == {"maj": "gen-arith", "rr": "gen-arith", "rrmaj": "gen-arith", "sac": "gen-arith",
                            "cpwbft": "gen-arith", "resilience": "gen-code"}


# A run method the sweep has never heard of: its Command alone (flags and what it tells the sweep).
ECHO = """
import json, sys
from byzantium.commands import TASK_KEYS, Command, task_args
from byzantium.experiments import run_command


def echo_args(ap):
    ap.add_argument("--agents", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--model", default=None)
    task_args(ap, 100)


def check(args):
    if args.agents > 9:
        raise ValueError(f"--agents {args.agents}: at most 9")


run_command.RUN_METHODS = run_command.RUN_METHODS + [Command(
    "echo", "a method of one model", echo_args, sweep_keys=("agents", "max_tokens", "model") + TASK_KEYS,
    sweep_shown=lambda args: {"agents": args.agents, "max_tokens": args.max_tokens, "limit": args.limit},
    sweep_tokens=lambda params: params["agents"] * params["max_tokens"],
    sweep_length=lambda params, budget: budget + params["max_tokens"], sweep_check=check)]
from byzantium.sweep.config import ConfigError, load_sweep
from byzantium.sweep.dry_run import cell_tokens
from byzantium.sweep.needs import needed_len
try:
    cells = load_sweep(sys.argv[1], check_files=False).cells
except ConfigError as error:
    print(json.dumps(str(error)))
else:
    print(json.dumps([[c.method, c.params, c.models, cell_tokens(c), needed_len(c, 0)] for c in cells]))
"""


def test_a_new_run_method_needs_no_sweep_table(tmp_path):
    """A method registered with its Command alone (no line in the sweep): a file runs it beside MAJ, each
    method keeping its own keys; its cells show, estimate and refuse what its Command says."""
    import subprocess
    import sys
    script = tmp_path / "echo.py"
    script.write_text(ECHO)
    path = sweep_file(tmp_path, BASE.replace('method = "maj"', 'method = ["maj", "echo"]') +
                      'corrupt = 1\nmax_tokens = 10\nmodel = "org/Thing-1B"\n[axes]\nagents = [4, 12]\n')

    def run():
        done = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, check=True)
        return json.loads(done.stdout)
    assert run() == f"{path.name}: [axes].agents: --agents 12: at most 9 (cell echo-gen-arith-N12)"
    path.write_text(path.read_text().replace("[4, 12]", "[4]"))
    (maj, maj_params, maj_models, *_), echo = run()
    assert maj == "maj" and maj_params["corrupt"] == 1 and "max_tokens" not in maj_params
    assert maj_models == ["org/Thing-1B"]
    assert echo == ["echo", {"limit": 2, "max_tokens": 10, "model": "org/Thing-1B", "agents": 4, "task": "gen-arith"},
                    ["org/Thing-1B"], 40, 10]


def test_what_every_cell_shows(tmp_path):
    """Each method's cells show its settings with the run's defaults filled in (run <method> --help),
    whether or not the file set them: RRMaj's M is N when unset, SAC's topology merg, CP-WBFT shows no
    judge, resilience shows max_tokens only when set (unset: the agents' own limit)."""
    from byzantium.protocols.prompts import TEMPERATURE as SAC_TEMPERATURE
    from byzantium.protocols.rr_prompts import TEMPERATURE as RR_TEMPERATURE
    path = sweep_file(tmp_path, BASE.replace('method = "maj"', 'method = ["maj", "rr", "rrmaj"]') + "agents = 4\n")
    maj = dict(limit=2, agents=4, task="gen-arith", corrupt=0, pattern="0c4t", max_len=512, attack="strong",
               temperature=RR_TEMPERATURE, seed=0)
    assert {c.method: c.params for c in load_sweep(path).cells} == {
        "maj": maj, "rr": maj | {"chunk": 100}, "rrmaj": maj | {"chunk": 100, "trajectories": 4}}
    path = sweep_file(tmp_path, BASE.replace('method = "maj"', 'method = "rrmaj"') +
                      "trajectories = 3\n[[cells]]\ncorrupted = [1, 3]\nagents = 6\n")
    params = load_sweep(path).cells[0].params
    assert (params["pattern"], params["corrupt"], params["trajectories"]) == ("2c4t", 2, 3)
    path = sweep_file(tmp_path, 'paper = "sac"\nmethod = ["sac", "cpwbft"]\n[analysis]\nkind = "sac"\n[run]\n'
                      'limit = 2\n', "s.toml")
    cpwbft = dict(limit=2, task="gen-arith", agents=7, weak=2, byzantine=1, adversary="fixed", F=3, rounds=6,
                  topology="merg", max_tokens=1000, temperature=SAC_TEMPERATURE, seed=0)
    assert {c.method: c.params for c in load_sweep(path).cells} == {
        "sac": cpwbft | {"judge_max_tokens": 1000, "score_mode": "generate"}, "cpwbft": cpwbft}
    path = sweep_file(tmp_path, 'paper = "mas"\nmethod = "resilience"\n[analysis]\nkind = "resilience"\n[run]\n'
                      'limit = 2\n[axes]\nsystem = ["metagpt", "camel"]\n[[cells]]\n[[cells]]\nmax_tokens = 64\n',
                      "r.toml")
    shown = [{k: v for k, v in c.params.items() if k != "task"} for c in load_sweep(path).cells]
    resilience = dict(limit=2, defence="none", fault="none", seed=0)
    assert shown == [resilience | {"system": "metagpt"}, resilience | {"system": "metagpt", "max_tokens": 64},
                     resilience | {"system": "camel"}, resilience | {"system": "camel", "max_tokens": 64}]


def test_dry_run_makes_no_network_call(tmp_path, no_loading, capsys, monkeypatch):
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError("a network call")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    path = sweep_file(tmp_path, BASE + "[axes]\nmodel = ['meta-llama/Llama-3.3-70B-Instruct', 'org/unknown-model']\n")
    out, rows_ = dry_run_lines(capsys, path, tmp_path)
    assert "weights unknown (no parameter count in its name)" in out


def test_a_cell_without_a_task_is_labelled_with_the_task_it_runs(tmp_path, no_loading):
    """A cell that names no task runs its method's --task default, and its params and directory say that
    task (a resilience cell runs gen-code, a MAJ cell gen-arith), not one default for every method."""
    path = sweep_file(tmp_path, 'paper = "mas"\nmethod = "resilience"\n[analysis]\nkind = "resilience"\n[run]\n'
                                'system = "camel"\n')
    (cell,) = load_sweep(path).cells
    assert "--task" not in cell.argv and cell.params["task"] == "gen-code" and "gen-code" in cell.name
    path = sweep_file(tmp_path, BASE, "m.toml")
    (cell,) = load_sweep(path).cells
    assert "--task" not in cell.argv and cell.params["task"] == "gen-arith"
