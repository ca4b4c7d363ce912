"""The experiment runner on a trivial fake instance coroutine: lines as instances finish, resume,
damaged last line, summary, Ctrl-C."""
import asyncio
import json
from dataclasses import dataclass

import pytest

from byzantium.experiments.runner import RESULTS, SUMMARY, read_results, run_instances


@dataclass
class Item:
    id: str
    delay: float = 0.0


@dataclass
class Result:
    value: int
    note: tuple = ()


def lines(out):
    return [json.loads(line) for line in (out / RESULTS).read_text().splitlines()]


def test_writes_one_line_per_instance_and_summary(tmp_path):
    items = [Item(f"q{i}") for i in range(5)]

    async def solve(item):
        return Result(int(item.id[1:]) * 2, ("a", 1))

    records = run_instances(items, solve, tmp_path, summarize=lambda rs: {"total_value": sum(r["value"] for r in rs)},
                            config={"x": 1}, progress=False)
    assert sorted(r["id"] for r in lines(tmp_path)) == [f"q{i}" for i in range(5)]
    assert lines(tmp_path)[0]["note"] == ["a", 1]  # dataclass -> JSON-safe dict
    assert len(records) == 5
    summary = json.loads((tmp_path / SUMMARY).read_text())
    assert summary["total_value"] == 20 and summary["complete"] and summary["config"] == {"x": 1}


def test_lines_are_written_as_instances_finish(tmp_path):
    seen = []

    async def solve(item):
        if item.id == "slow":
            # by the time the slow one runs on, the fast one's line must already be on disk
            for _ in range(200):
                if (tmp_path / RESULTS).exists() and "fast" in (tmp_path / RESULTS).read_text():
                    break
                await asyncio.sleep(0.01)
            seen.append([r["id"] for r in lines(tmp_path)])
        return {"value": 1}

    run_instances([Item("slow"), Item("fast")], solve, tmp_path, progress=False)
    assert seen == [["fast"]]
    assert [r["id"] for r in lines(tmp_path)] == ["fast", "slow"]


def test_concurrency_is_bounded(tmp_path):
    active, peak = [0], [0]

    async def solve(item):
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        await asyncio.sleep(0.01)
        active[0] -= 1
        return {"value": 0}

    run_instances([Item(str(i)) for i in range(20)], solve, tmp_path, concurrency=4, progress=False)
    assert peak[0] == 4


def test_resume_skips_done_ids(tmp_path):
    calls = []

    async def solve(item):
        calls.append(item.id)
        return {"value": len(calls)}

    items = [Item(f"q{i}") for i in range(4)]
    run_instances(items[:2], solve, tmp_path, progress=False)
    records = run_instances(items, solve, tmp_path, summarize=lambda rs: {"n": len(rs)}, progress=False)
    assert calls == ["q0", "q1", "q2", "q3"]  # q0, q1 not run again
    assert len(records) == 4 and len(lines(tmp_path)) == 4
    run_instances(items, solve, tmp_path, progress=False)
    assert len(calls) == 4


def test_truncated_last_line_is_dropped_and_rerun(tmp_path):
    (tmp_path / RESULTS).write_text(json.dumps({"id": "q0", "value": 7}) + "\n" + '{"id": "q1", "val')
    assert [r["id"] for r in read_results(tmp_path)] == ["q0"]
    calls = []

    async def solve(item):
        calls.append(item.id)
        return {"value": 1}

    run_instances([Item("q0"), Item("q1")], solve, tmp_path, progress=False)
    assert calls == ["q1"]
    assert [(r["id"], r["value"]) for r in lines(tmp_path)] == [("q0", 7), ("q1", 1)]


def test_interrupt_keeps_finished_lines_and_writes_partial_summary(tmp_path):
    async def solve(item):
        if item.id == "boom":
            await asyncio.sleep(0.05)
            raise KeyboardInterrupt  # what Ctrl-C looks like inside the event loop
        return {"value": 1}

    with pytest.raises(KeyboardInterrupt):
        run_instances([Item("a"), Item("b"), Item("boom")], solve, tmp_path,
                      summarize=lambda rs: {"n": len(rs)}, progress=False)
    assert sorted(r["id"] for r in lines(tmp_path)) == ["a", "b"]
    summary = json.loads((tmp_path / SUMMARY).read_text())
    assert summary["n"] == 2 and summary["complete"] is False


def test_different_configuration_is_refused(tmp_path):
    async def solve(item):
        return {"value": 1}

    run_instances([Item("a")], solve, tmp_path, config={"corrupt": 1}, progress=False)
    with pytest.raises(ValueError, match="corrupt"):
        run_instances([Item("a")], solve, tmp_path, config={"corrupt": 2}, progress=False)


def test_progress_bar_runs(tmp_path, capsys):
    async def solve(item):
        return {"value": 1}

    run_instances([Item("a"), Item("b")], solve, tmp_path, stats=lambda: {"decode_tokens": 10}, progress=True)
    assert "2/2" in capsys.readouterr().err
