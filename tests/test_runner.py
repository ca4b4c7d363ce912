"""The experiment runner on a trivial fake instance coroutine: lines as instances finish, resume,
damaged last line, summary, Ctrl-C."""
import asyncio
import json
from dataclasses import dataclass

import pytest

from byzantium.experiments.runner import RESULTS, SUMMARY, read_results, run_async, run_instances


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
    assert [r["id"] for r in lines(tmp_path)] == ["slow", "fast"]  # at the end: put in the items' order


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


def test_one_failing_instance_becomes_an_error_row(tmp_path, capsys):
    async def solve(item):  # a fake protocol that breaks on one problem
        await asyncio.sleep(0.01 * int(item.id[1:]))
        if item.id == "q2":
            raise ValueError("no distractor for q2")
        return {"value": int(item.id[1:])}

    seen = []

    def summarize(records):
        seen.extend(records)
        return {"total_value": sum(r["value"] for r in records)}  # would fail on an error row

    items = [Item(f"q{i}") for i in range(5)]
    records = run_instances(items, solve, tmp_path, summarize=summarize, progress=False)
    rows = {r["id"]: r for r in lines(tmp_path)}
    assert sorted(rows) == [f"q{i}" for i in range(5)]  # the others finished and were written
    error = rows["q2"]["error"]
    assert error["type"] == "ValueError" and error["message"] == "no distractor for q2"
    assert any("in solve" in frame for frame in error["traceback"])
    assert sorted(r["id"] for r in records) == sorted(r["id"] for r in seen) == ["q0", "q1", "q3", "q4"]
    summary = json.loads((tmp_path / SUMMARY).read_text())
    assert summary["total_value"] == 8 and summary["errors"] == 1 and summary["failed"] == ["q2"]
    assert summary["instances"] == 4 and summary["total"] == 5 and summary["complete"] is False
    assert "1 of 5 instances failed (q2)" in capsys.readouterr().err


def test_error_rows_run_again_on_resume_and_are_replaced(tmp_path):
    calls, broken = [], {"q1", "q3"}

    async def solve(item):
        calls.append(item.id)
        if item.id in broken:
            raise RuntimeError("engine hiccup")
        return {"value": 1}

    items = [Item(f"q{i}") for i in range(4)]
    run_instances(items, solve, tmp_path, progress=False)
    broken.discard("q1")
    run_instances(items, solve, tmp_path, progress=False)
    assert calls == ["q0", "q1", "q2", "q3", "q1", "q3"]  # only the error rows run again
    rows = lines(tmp_path)
    assert sorted(r["id"] for r in rows) == ["q0", "q1", "q2", "q3"]  # one row per id: the new one replaced it
    assert "error" not in next(r for r in rows if r["id"] == "q1") and "error" in rows[-1]
    summary = json.loads((tmp_path / SUMMARY).read_text())
    assert summary["errors"] == 1 and summary["failed"] == ["q3"] and summary["instances"] == 3
    broken.clear()
    records = run_instances(items, solve, tmp_path, summarize=lambda rs: {"n": len(rs)}, progress=False)
    assert len(records) == 4 and len(lines(tmp_path)) == 4
    summary = json.loads((tmp_path / SUMMARY).read_text())
    assert summary["errors"] == 0 and summary["complete"] and summary["n"] == 4


def test_cancellation_still_stops_the_run(tmp_path):
    async def solve(item):
        if item.id == "slow":
            await asyncio.sleep(30)
        return {"value": 1}

    async def main():
        run = asyncio.create_task(run_async([Item("fast"), Item("slow")], solve, tmp_path, progress=False))
        while not (tmp_path / RESULTS).exists() or "fast" not in (tmp_path / RESULTS).read_text():
            await asyncio.sleep(0.01)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    asyncio.run(main())
    assert [r["id"] for r in lines(tmp_path)] == ["fast"]  # no error row for the cancelled instance


def test_callers_do_not_count_error_rows_as_done(tmp_path, capsys):
    from byzantium.commands import already_done
    from byzantium.experiments.resilience_command import _all_done

    async def solve(item):
        if item.id == "b":
            raise KeyError("missing field")
        return {"value": 1}

    items = [Item("a"), Item("b")]
    run_instances(items, solve, tmp_path, progress=False)
    assert not already_done(tmp_path, items, print)
    assert not _all_done({"run": tmp_path}, items)


def test_a_resilience_run_scores_around_an_error_row(tmp_path, capsys):
    from byzantium.experiments.resilience import run_resilience_experiment
    from byzantium.tasks.resilience import load_resilience_task

    tasks = load_resilience_task("gen-arith", limit=3)

    class Broken:  # answers right, except that its calls for the second problem fail
        name, stats = "broken", {}

        async def chat(self, messages, params=None, untrusted=False, tag=None):
            if tasks[1].question in messages[1]["content"]:
                raise ConnectionError("server went away")
            gold = next(t.gold for t in tasks if t.question in messages[1]["content"])
            return type("Reply", (), {"text": f"Answer: {gold}"})()

    summary = run_resilience_experiment("self-collab", "gen-arith", tasks, Broken(), out=tmp_path, progress=False)
    assert summary["score"] == 1.0 and summary["instances"] == 2 and summary["errors"] == 1
    assert summary["failed"] == [tasks[1].id] and not summary["complete"]
    assert "over 2/3 problems, 1 failed" in capsys.readouterr().out


def test_a_resumed_run_counts_every_invocations_cost(tmp_path):
    # The cost table once read the last invocation only (RRMaj/MAJ decode 1.59 instead of 1.12).
    from byzantium.experiments.runner import COSTS
    counter = {"decode_tokens": 0}

    async def solve(item):
        counter["decode_tokens"] += 10 * item
        return {"value": item}

    def stats():
        return dict(counter)
    run_instances([1, 2], solve, tmp_path, key=str, stats=stats)
    run_instances([1, 2, 3], solve, tmp_path, key=str, stats=stats)  # resumed: runs 3 only
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["cost"]["decode_tokens"] == 60 and summary["cost"]["instances"] == 3
    assert summary["cost"]["invocations"] == 2
    lines = [json.loads(x) for x in (tmp_path / COSTS).read_text().splitlines()]
    assert [x["ids"] for x in lines] == [["1", "2"], ["3"]] and [x["decode_tokens"] for x in lines] == [30, 30]
    assert all("seconds" not in r for r in map(json.loads, (tmp_path / "results.jsonl").read_text().splitlines()))
