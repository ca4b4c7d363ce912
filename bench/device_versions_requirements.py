"""Print the project's dependencies and its test extra, one a line, for `make test-device-versions`'s venv
(which runs the project from the tree, so it installs what the project needs but not the project)."""
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
sys.stdout.write("".join(f"{line}\n" for line in project["dependencies"] + project["optional-dependencies"]["test"]))
