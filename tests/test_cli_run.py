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
        assert r["chunks"] and {c["agent"] for c in r["chunks"]} <= {0, 1, 2}
        assert sum(c["tokens"] for c in r["chunks"]) == r["num_tokens"] <= 32
        assert all(c["tokens"] == 8 for c in r["chunks"][:-1])  # K tokens a turn, fewer only at the end
    summary = json.loads((out / "summary.json").read_text())
    assert 0.0 <= summary["accuracy"] <= 1.0 and summary["complete"]
    assert summary["config"]["agents"] == 3 and summary["config"]["corrupt"] == 1 and summary["config"]["k"] == 8
    engine = summary["engine"]
    assert engine["prefill_tokens"] > 0 and engine["decode_tokens"] > 0 and "cached_tokens" in engine
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
