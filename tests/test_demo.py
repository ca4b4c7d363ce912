"""`byzantium demo` in miniature on the embedded model: 2 questions, 2 corruption levels, short answers."""
from byzantium.experiments.demo import run_demo


def test_demo_writes_table_and_plot(smollm2_dir, tmp_path, capsys):
    out = tmp_path / "demo"
    result = run_demo(questions=2, out=out, corrupt=(0, 3), k=4, max_len=8, progress=False)
    summary = (out / "summary.md").read_text()
    assert "| gen-sum | MAJ |" in summary and "| gen-sum | RRMaj |" in summary
    assert "0c5t (ceiling)" in summary and "Clean ceiling (0c5t)" in summary
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len((out / "results.jsonl").read_text().splitlines()) == 2 * 2 * 2
    methods = [r["method"] for r in result["table"]["rows"]]
    assert methods == ["MAJ", "RRMaj", "Δ"]
    assert result["table"]["rows"][0]["values"][1] is None  # 1c4t not run
    assert 0 <= result["ceiling"] <= 1
    assert "| gen-sum | MAJ |" in capsys.readouterr().out
