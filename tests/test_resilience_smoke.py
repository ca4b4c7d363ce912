"""mas_main's smoke cell on the embedded model: AutoInject chooses a piece, asks and reads the reply (a
reduced cell: the faulty run only, with the smoke scale's own settings). SmolLM2-135M answers by
continuing the cut-off line, which is no rewrite (autoinject.completes): then no message changed."""
import json
import subprocess
import sys

from byzantium.sweep.config import load_sweep


def test_mas_main_smoke_autoinject_injects_on_the_embedded_model(tmp_path):
    cell = next(c for c in load_sweep("mas_main").cells if c.params["fault"] == "autoinject"
                and c.params["defence"] == "none")
    out = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "byzantium.cli", *cell.argv, "--out", str(out), "--no-progress"],
                   check=True, timeout=900)
    messages = json.loads((out / "summary.json").read_text())["messages"]
    assert messages["inject_pieces_chosen"] >= 1 and messages["inject_json_failures"] == 0
    assert (messages["injected"] >= 1) == (messages["inject_pieces_rewritten"] >= 1)
