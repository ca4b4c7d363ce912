"""`byzantium run`: bad arguments refused before any model loads; one real run on the embedded model,
and a rerun that skips what is done. main() is called in-process to save start-up time."""
import json

import pytest

import byzantium.backends
from byzantium.cli import main


@pytest.fixture
def no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded for a refused command")
    monkeypatch.setattr(byzantium.backends, "LLMPool", refuse)


@pytest.mark.parametrize("extra, problem", [
    (["--agents", "3", "--corrupt", "4"], "--corrupt"),
    (["--agents", "0"], "--agents"),
    (["--chunk", "0"], "--chunk"),
    (["--trajectories", "0"], "--trajectories"),
    (["--max-len", "0"], "--max-len"),
    (["--task", "gen-nothing"], "gen-nothing"),
    (["--data", "no/such/file.jsonl"], "no/such/file.jsonl"),
    (["--model", "no-such-model"], "no-such-model"),
    (["--agents", "3", "--models", "smollm2-135m,smollm2-135m"], "--models"),
    (["--limit", "0"], "--limit"),
])
def test_bad_arguments_are_refused_before_loading(extra, problem, no_loading, tmp_path, capsys):
    assert main(["run", "rrmaj", "--out", str(tmp_path / "o"), *extra]) == 2
    assert problem in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("extra, problem", [(["--attack", "mild"], "--attack"), (["--backend", "vllm"], "--backend")])
def test_bad_choices_are_refused_by_the_parser(extra, problem, no_loading, capsys):
    assert main(["run", "rr", *extra]) == 2
    assert problem in capsys.readouterr().err


def test_unknown_method_is_refused(no_loading, capsys):
    assert main(["run", "sac-nope"]) == 2
    assert "sac-nope" in capsys.readouterr().err


def test_run_rr_end_to_end_and_resume(smollm2_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "rr"
    argv = ["run", "rr", "--model", str(smollm2_dir), "--task", "gen-track", "--limit", "2", "--agents", "3",
            "--corrupt", "1", "--chunk", "8", "--max-len", "32", "--out", str(out), "--device", "cpu"]
    assert main(argv) == 0
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for r in records:
        assert r["chunks"] and sorted(r["order"]) == [0, 1, 2]  # the speaking order, recorded
        assert [c["agent"] for c in r["chunks"]] == [r["order"][j % 3] for j in range(len(r["chunks"]))]
        assert sum(c["tokens"] for c in r["chunks"]) == r["num_tokens"] <= 32
        assert all(c["tokens"] == 8 for c in r["chunks"][:-1])  # K tokens a turn, fewer only at the end
    summary = json.loads((out / "summary.json").read_text())
    assert 0.0 <= summary["accuracy"] <= 1.0 and summary["complete"]
    assert summary["config"]["agents"] == 3 and summary["config"]["corrupt"] == 1 and summary["config"]["k"] == 8
    assert (summary["config"]["temperature"], summary["config"]["order"]) == (0.7, "shuffle")
    engine = summary["engine"]
    assert engine["prefill_tokens"] > 0 and engine["decode_tokens"] > 0 and "cached_tokens" in engine
    (described,) = engine["engines"].values()  # Engine.describe(): what produced these numbers
    assert described["backend"] == "native" and described["attention_backend"] and described["kv_cache"]["num_blocks"] > 0
    assert "accuracy" in capsys.readouterr().out  # the table

    def fail(*args, **kwargs):
        raise AssertionError("a rerun with everything done must not run anything")
    monkeypatch.setattr(byzantium.backends, "LLMPool", fail)
    assert main(argv) == 0
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
    assert "already done" in capsys.readouterr().out


def test_run_lists_every_method_and_keeps_the_round_robin_flags(no_loading, capsys):
    from byzantium.cli import parser
    assert main(["run", "--help"]) == 0
    listing = capsys.readouterr().out
    assert all(m in listing for m in ("maj", "rrmaj", "sac", "cpwbft"))
    args = parser().parse_args(["run", "rrmaj", "--agents", "5", "--corrupt", "3", "--chunk", "32", "--trajectories",
                                "5", "--max-len", "128", "--attack", "moderate", "--model", "m", "--backend", "hf",
                                "--task", "gen-track", "--limit", "2", "--seed", "1", "--temperature", "0.5",
                                "--out", "o", "--concurrency", "3", "--device", "cpu", "--dtype", "float32",
                                "--no-progress"])
    assert (args.method, args.agents, args.corrupt, args.chunk, args.trajectories, args.max_len, args.attack) == \
        ("rrmaj", 5, 3, 32, 5, 128, "moderate")
    assert main(["run", "sac", "--corrupt", "1"]) == 2  # each method has its own flags
    assert "--corrupt" in capsys.readouterr().err


def test_run_resilience_is_wired_and_refuses_before_loading(no_loading, capsys, tmp_path):
    assert main(["run", "--help"]) == 0
    assert "resilience" in capsys.readouterr().out
    assert main(["run", "resilience", "--task", "humaneval"]) == 2  # a file task needs --data
    assert "--data" in capsys.readouterr().err
    assert main(["run", "resilience", "--system", "camel", "--faulty-role", "nobody", "--out", str(tmp_path)]) == 2
    assert "nobody" in capsys.readouterr().err
    assert main(["run", "resilience", "--fault", "autoinject", "--pe", "1.5", "--out", str(tmp_path)]) == 2
    assert "pe" in capsys.readouterr().err.lower()


def test_round_robin_defaults_sample_shuffle_and_offer_the_directive():
    from byzantium.cli import parser
    args = parser().parse_args(["run", "rrmaj"])
    assert (args.temperature, args.order, args.allow_identical, args.attack) == (0.7, "shuffle", False, "strong")
    args = parser().parse_args(["run", "maj", "--attack", "directive", "--order", "rotate", "--allow-identical"])
    assert (args.attack, args.order, args.allow_identical) == ("directive", "rotate", True)


@pytest.mark.parametrize("argv, problem", [
    (["maj", "--temperature", "0"], "MAJ agents 0 and 1"),  # all clean agents on one model vote alike
    (["maj", "--temperature", "0", "--corrupt", "4"], "MAJ agents 0 and 1"),  # so do the corrupted ones
    (["rrmaj", "--temperature", "0", "--corrupt", "3", "--order", "fixed"], "--order fixed"),
    (["rrmaj", "--temperature", "0", "--corrupt", "3", "--order", "rotate", "--trajectories", "6"],
     "trajectories 0 and 5"),
    (["rrmaj", "--temperature", "0"], "same model and prompt"),  # one context: every order is the same
    (["rrmaj", "--temperature", "0", "--corrupt", "5", "--models", ",".join(["smollm2-135m"] * 5)],
     "same model and prompt"),
])
def test_identical_samples_are_refused_before_loading(argv, problem, no_loading, tmp_path, capsys):
    assert main(["run", *argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert problem in err and "--allow-identical" in err and "--temperature" in err
    assert not (tmp_path / "o").exists()


def test_what_counts_as_identical_by_construction():
    from byzantium.experiments.rr import check_config
    ok = dict(k=8, max_len=16, attack="strong")
    check_config("rrmaj", 5, 3, m=5, temperature=0.0, order="shuffle", **ok)  # orders differ per trajectory
    check_config("rrmaj", 5, 3, m=5, temperature=0.0, order="rotate", **ok)  # 5 distinct rotations
    check_config("rrmaj", 5, 0, m=1, temperature=0.0, order="fixed", **ok)  # one trajectory
    check_config("rr", 5, 0, m=None, temperature=0.0, order="fixed", **ok)
    check_config("maj", 3, 0, m=None, temperature=0.0, models=["a", "b", "c"], **ok)  # three models
    check_config("maj", 2, 1, m=None, temperature=0.0, **ok)  # one clean and one corrupted prompt
    check_config("rrmaj", 5, 0, m=5, temperature=0.7, order="fixed", **ok)  # sampled
    check_config("maj", 5, 0, m=None, temperature=0.0, allow_identical=True, **ok)
    with pytest.raises(ValueError, match="MAJ agents 1 and 2"):
        check_config("maj", 3, 0, m=None, temperature=0.0, models=["a", "b", "b"], **ok)
    with pytest.raises(ValueError, match="--order"):
        check_config("rrmaj", 5, 3, m=5, temperature=0.7, order="backwards", **ok)


def test_allow_identical_lifts_the_refusal(smollm2_dir, no_loading, tmp_path, capsys):
    argv = ["run", "maj", "--model", str(smollm2_dir), "--task", "gen-arith", "--limit", "1", "--temperature", "0",
            "--out", str(tmp_path / "o")]
    assert main(argv) == 2 and "--allow-identical" in capsys.readouterr().err
    with pytest.raises(AssertionError, match="a model was loaded"):  # past every check, on to loading
        main(argv + ["--allow-identical"])


def test_demo_summary_says_what_the_numbers_show(smollm2_dir, tmp_path):
    from byzantium.experiments.demo import cell_name, run_demo, verdict
    from byzantium.protocols.metrics.rr import config_label, sweep_table
    acc = {("d", "maj", 0): 0.9, ("d", "rrmaj", 0): 0.9, ("d", "maj", 1): 0.5, ("d", "rrmaj", 1): 0.7,
           ("d", "maj", 2): 0.4, ("d", "rrmaj", 2): 0.3, ("d", "maj", 3): 0.1}
    table = sweep_table(acc, 3)
    table["rows"] = table["rows"][:3]
    assert verdict(table, 20) == ("RRMaj beats MAJ at 1 of 3 corruption levels, loses at 1 and ties at 1; Δ runs "
                                  "from -10.0 points (2c1t) to +20.0 (1c2t), where one question is 5.0 points.")

    out = tmp_path / "demo"
    result = run_demo(questions=2, out=out, corrupt=(0, 3), k=4, max_len=8, progress=False)
    summary = (out / "summary.md").read_text()
    assert result["verdict"] == verdict(result["table"], 2) and result["verdict"] in summary
    assert "temperature 0.7" in summary and "speaking order shuffle" in summary
    for c in (0, 3):  # the distinct counts in the summary are those of the transcripts (one directory per cell)
        rr = [json.loads(line) for line in (out / cell_name("rrmaj", c, 5) / "results.jsonl").read_text().splitlines()]
        assert len(rr) == 2
        assert result["distinct"][("rrmaj", c)] == sum(len({t["text"] for t in r["trajectories"]}) for r in rr) / 2
        assert f"{config_label(c, 5)} {result['distinct'][('rrmaj', c)]:.1f}" in summary
        assert all(len({tuple(t["order"]) for t in r["trajectories"]}) > 1 for r in rr)  # each its own order
    assert max(result["distinct"][("rrmaj", c)] for c in (0, 3)) > 1  # samples, not one trajectory M times
