"""`byzantium demo` in miniature on the embedded model: 2 questions, 2 corruption levels, short answers; then
`byzantium report` and `byzantium plot` on its output directory, as a newcomer runs them."""
import json

from byzantium.experiments.demo import run_demo
from byzantium.experiments.plot import make_plots
from byzantium.experiments.report import build_report, render


def test_demo_writes_table_and_plot_that_report_and_plot_read(smollm2_dir, tmp_path, capsys):
    out = tmp_path / "demo"
    result = run_demo(questions=2, out=out, corrupt=(0, 3), k=4, max_len=8, progress=False)
    summary = (out / "summary.md").read_text()
    printed = capsys.readouterr().out
    assert "loading" in printed and "model ready after" in printed  # said before the first token
    # The report's sweep table, intervals and their legend included; 0c is no ceiling.
    assert "| MAJ | " in summary and "| RRMaj | " in summary and "| Δ (points) |" in summary
    assert "0c5t (no adversary)" in summary and "ceiling" not in summary
    assert "] W" in summary and "intervals (95 %): W = Wilson score interval" in summary
    assert "No adversary (0c5t)" in summary
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert runs == ["maj-0c5t", "maj-3c2t", "rrmaj-0c5t", "rrmaj-3c2t"]
    for name in runs:
        rows = (out / name / "results.jsonl").read_text().splitlines()
        assert len(rows) == 2 and len({json.loads(r)["id"] for r in rows}) == 2
        cell = json.loads((out / name / "summary.json").read_text())
        assert cell["config"]["method"] == name.split("-")[0] and cell["instances"] == 2 and cell["complete"]
    methods = [r["method"] for r in result["table"]["rows"]]
    assert methods == ["MAJ", "RRMaj", "Δ"]
    assert result["table"]["rows"][0]["values"][1] is None  # 1c4t not run
    assert 0 <= result["ceiling"] <= 1
    assert "| MAJ | " in printed

    # report and plot read the demo's own output, and agree with its accuracies
    tables = {t.title: t for t in build_report([out])}
    (sweep,) = [t for title, t in tables.items() if title.startswith("Corruption sweep")]
    maj = next(row for row in sweep.rows if row[1] == "MAJ")
    assert maj[2].startswith(f"{100 * result['table']['rows'][0]['values'][0]:.1f} [")
    assert "Corruption sweep" in render(list(tables.values()), "md")
    written = [p.name for p in make_plots([out])]
    assert "sweep.png" in written and (out / "plots" / "sweep.png").read_bytes()[:4] == b"\x89PNG"
