"""Every code example of README.md and docs/ runs, or says why not.

Each fenced block is run here or carries `<!-- not run: REASON -->` on the line right before it (a GPU, a
cluster, downloads, runs of many minutes). `<!-- expect: TEXT -->` there: what the block prints contains
TEXT. `<!-- output of: COMMAND -->`: the block is what that byzantium command prints, and it is run and
compared. What runs, on the embedded model in
fp32 on the CPU: Python blocks, each alone in a fresh interpreter (so a block that uses a name it does not
define fails); shell blocks of quick `byzantium` commands, in document order in one directory, so that
`report` and `plot` read what an earlier block's `run` wrote; `curl` and OpenAI-client examples against a
`byzantium serve` this test starts on a free 127.0.0.1 port (their `127.0.0.1:8000` is pointed at it).
A block of anything else that is not marked fails the test.
"""
import os
import pathlib
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
FENCE = re.compile(r"^(```|~~~)\s*([\w+-]*)\s*$")
MARKER = re.compile(r"^<!-- (not run|expect|output of): (\S.*?) -->$")
SERVER_URL = "http://127.0.0.1:8000"
BYZANTIUM = str(pathlib.Path(sys.executable).with_name("byzantium"))
TIMEOUT_S = 600  # one command; generous, as a machine shared with other jobs loads a model far slower


class Block:
    def __init__(self, page, line, lang, code, marker):
        self.page, self.line, self.lang, self.code = page, line, lang, code
        self.marker, self.marked = marker.groups() if marker else (None, None)

    @property
    def name(self):
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def commands(self):
        """A shell block's commands: continuation lines joined, comments and blank lines dropped."""
        joined = re.sub(r"\\\n\s*", " ", self.code)
        return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]

    @property
    def kind(self):
        if self.marker in ("not run", "output of"):
            return self.marker
        if self.lang == "python":
            return "python"
        commands = self.commands()
        if self.lang in ("", "bash", "sh", "shell") and commands:
            if all(c.startswith("curl ") for c in commands):
                return "curl"
            if all(c.startswith("byzantium ") for c in commands):
                return "shell"
        return "unrunnable"


def blocks_of(page):
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, lang, start = match.group(1), match.group(2), i
        i += 1
        while i < len(lines) and lines[i].strip() != fence:
            i += 1
        marker = MARKER.match(lines[start - 1].strip()) if start else None
        out.append(Block(page, start + 1, lang, "\n".join(lines[start + 1:i]) + "\n", marker))
        i += 1
    return out


BLOCKS = [b for page in PAGES for b in blocks_of(page)]


def of_kind(kind):
    return [pytest.param(b, id=b.name) for b in BLOCKS if b.kind == kind]


def test_every_block_is_run_or_says_why_not():
    assert len(PAGES) > 10 and len(BLOCKS) > 20, "the docs are where this test looks for them"
    unrun = [f"{b.name} ({b.lang or 'no language'})" for b in BLOCKS if b.kind == "unrunnable"]
    assert not unrun, ("blocks this test cannot run and that carry no `<!-- not run: REASON -->` line "
                       f"right before them: {unrun}")


def test_the_readme_examples_run():
    kinds = {b.kind for b in BLOCKS if b.page.name == "README.md"}
    assert {"python", "shell", "curl"} <= kinds, kinds


def test_the_device_memory_default_the_docs_state_is_the_clis():
    from byzantium.plan.fit import H200_GB  # what `byzantium sweep --dry-run` plans for without a GPU
    stated = [(page.name, m.group(1)) for page in PAGES
              for m in re.finditer(r"--device-memory GB`?, default ([\d.]+)", page.read_text())]
    assert stated, "the docs state --device-memory's default somewhere"
    assert all(float(value) == H200_GB for _, value in stated), (stated, H200_GB)


def environment():
    env = dict(os.environ, BYZANTIUM_DEVICE="cpu", PYTHONPATH=str(ROOT), NO_COLOR="1")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def run(argv, cwd):
    done = subprocess.run(argv, cwd=cwd, env=environment(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, f"{argv}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    return done.stdout


def check_expected(block, printed):
    if block.marker == "expect":
        assert block.marked in printed, f"{block.name} should print {block.marked!r}, printed:\n{printed[-3000:]}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("docs-examples")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(workdir):
    """`byzantium serve` on the embedded model, as the serving examples start it, on a free port."""
    port = free_port()
    log = open(workdir / "serve.log", "w")
    proc = subprocess.Popen([BYZANTIUM, "serve", "--model", "smollm2-135m", "--port", str(port),
                             "--kv-cache-memory", "256MiB"], cwd=workdir, env=environment(),
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            assert proc.poll() is None, (workdir / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "byzantium serve did not answer /health"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


@pytest.mark.parametrize("block", of_kind("python"))
def test_python_block(block, workdir, request):
    code = block.code
    if SERVER_URL in code:
        code = code.replace(SERVER_URL, request.getfixturevalue("server"))
    check_expected(block, run([sys.executable, "-c", code], workdir))


@pytest.mark.parametrize("block", of_kind("shell"))
def test_shell_block(block, workdir):
    printed = "".join(run([BYZANTIUM] + shlex.split(command, comments=True)[1:], workdir)
                      for command in block.commands())
    check_expected(block, printed)


@pytest.mark.parametrize("block", of_kind("curl"))
def test_curl_block(block, workdir, server):
    printed = "".join(run(["curl", "-sS", "--fail-with-body"] + shlex.split(command.replace(SERVER_URL, server))[1:],
                          workdir) for command in block.commands())
    assert printed.strip(), block.name
    check_expected(block, printed)


@pytest.mark.parametrize("block", of_kind("output of"))
def test_output_shown_is_what_the_command_prints(block, workdir):
    command = shlex.split(block.marked)
    assert command[0] == "byzantium", block.marked
    printed = run([BYZANTIUM] + command[1:], workdir)
    shown = [line.rstrip() for line in block.code.strip().splitlines()]
    assert [line.rstrip() for line in printed.strip().splitlines()] == shown, printed
