"""bench/arc_eval.py's task writer: ARC rows in the eval gauntlet's format (written here, not the shared
data) become an lm-eval task that lm-eval loads, with the standard ARC prompt, choices and gold; bad rows
are refused with the line named; --help works. The timed run itself is not run here."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parent.parent / "bench"
spec = importlib.util.spec_from_file_location("arc_eval", BENCH / "arc_eval.py")
arc_eval = importlib.util.module_from_spec(spec)
spec.loader.exec_module(arc_eval)

ROWS = [{"query": "Question: Which gas do plants take in?", "choices": ["oxygen", "carbon dioxide", "helium"],
         "gold": 1, "answer": "carbon dioxide", "src_idx": 0},
        {"query": "Question: What melts ice?", "choices": ["heat", "cold", "dark", "salt water only"], "gold": 0,
         "answer": "heat", "src_idx": 3},
        {"query": "Question: Not read (past the limit)?", "choices": ["a", "b"], "gold": 0}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_task_writer_gives_a_task_lm_eval_loads(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    import datasets
    import huggingface_hub
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    rows = arc_eval.read_questions(write_jsonl(tmp_path / "arc.jsonl", ROWS), limit=2)
    (tmp_path / "task").mkdir()
    from lm_eval.tasks import TaskManager
    manager = TaskManager(include_path=str(arc_eval.write_task(rows, tmp_path / "task")))
    task = manager.load([arc_eval.TASK])["tasks"][arc_eval.TASK]
    docs = list(task.test_docs())
    assert len(docs) == 2
    assert [task.doc_to_text(d) for d in docs] == ["Question: Which gas do plants take in?\nAnswer:",
                                                   "Question: What melts ice?\nAnswer:"]
    assert [task.doc_to_choice(d) for d in docs] == [ROWS[0]["choices"], ROWS[1]["choices"]]
    assert [task.doc_to_target(d) for d in docs] == [1, 0]
    assert task.config.output_type == "multiple_choice"
    assert {m["metric"] for m in task.config.metric_list} == {"acc", "acc_norm"}


@pytest.mark.parametrize("row, said", [({"query": "Q?", "choices": ["a", "b"], "gold": 2}, "'gold' must be an index"),
                                       ({"query": "Q?", "choices": "ab", "gold": 0}, "list of 2 or more")])
def test_bad_rows_are_refused_with_the_line(tmp_path, row, said):
    data = write_jsonl(tmp_path / "bad.jsonl", [ROWS[0], row])
    with pytest.raises(SystemExit, match=f"bad.jsonl:2: .*{said}"):
        arc_eval.read_questions(data, limit=2)
    with pytest.raises(SystemExit, match="has 1 questions"):
        arc_eval.read_questions(write_jsonl(tmp_path / "one.jsonl", ROWS[:1]), limit=2)


def test_help_works():
    out = subprocess.run([sys.executable, str(BENCH / "arc_eval.py"), "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--data" in out.stdout and "--vllm-venv" in out.stdout
