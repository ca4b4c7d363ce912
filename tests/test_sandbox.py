"""The code sandbox: statuses, timeouts that take children with them, memory limits, a fresh
working directory, no inherited environment."""
import os
import resource
import time

import pytest

from byzantium.tasks import sandbox
from byzantium.tasks.sandbox import check_humaneval, extract_code, humaneval_program, run_code

PROBLEM = {  # a tiny HumanEval-format problem of our own
    "prompt": 'import math\n\n\ndef helper(x):\n    return x\n\n\ndef double(x: int) -> int:\n    """ Return 2 * x.\n'
              '    >>> double(3)\n    6\n    """\n',
    "entry_point": "double",
    "test": "def check(candidate):\n    assert candidate(3) == 6\n    assert candidate(-1) == -2\n",
}


def _alive(pid):
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def _gone(pid, within=5.0):
    end = time.monotonic() + within
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_statuses():
    ok = run_code("print('hi')")
    assert ok.status == "passed" and ok.passed and ok.returncode == 0 and ok.stdout == "hi\n"
    assert run_code("assert 1 + 1 == 3").status == "failed"
    err = run_code("raise ValueError('boom')")
    assert err.status == "failed" and err.returncode == 1 and "ValueError: boom" in err.stderr
    assert run_code("import sys; sys.exit(3)").returncode == 3
    seg = run_code("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert seg.status == "crashed" and seg.returncode < 0
    assert run_code("input()").status == "failed"  # stdin is closed: EOFError, not a hang


def test_infinite_loop_and_its_children_are_killed():
    code = ("import os, sys, time\n"
            "pid = os.fork()\n"
            "if pid == 0:\n    time.sleep(120)\n    os._exit(0)\n"
            "print(pid, os.getpgrp(), flush=True)\n"
            "while True:\n    pass\n")
    start = time.monotonic()
    res = run_code(code, timeout_s=1.5)
    assert res.status == "timeout" and res.returncode is None
    assert 1.4 < res.seconds < 6 and time.monotonic() - start < 10
    child, group = map(int, res.stdout.split())
    assert _gone(child)
    end = time.monotonic() + 5
    while any(_alive(p) for p in _members(group)) and time.monotonic() < end:
        time.sleep(0.05)
    assert not any(_alive(p) for p in _members(group))  # the whole group is gone


def _members(pgid):
    """Processes whose process group is pgid."""
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[2]) == pgid:
                        out.append(int(p))
            except (OSError, IndexError, ValueError):
                pass
    return out


def test_children_left_behind_after_a_normal_exit_are_killed():
    code = ("import os, time\n"
            "pid = os.fork()\n"
            "if pid == 0:\n    time.sleep(120)\n    os._exit(0)\n"
            "print(pid)\n")
    res = run_code(code, timeout_s=20)
    assert res.status == "passed" and res.seconds < 10  # it did not wait for the sleeper
    assert _gone(int(res.stdout))


def test_memory_bomb_is_contained():
    before = resource.getrlimit(resource.RLIMIT_AS)
    big = run_code("x = bytearray(8 * 1024 ** 3)", memory_mb=256)
    assert big.status == "crashed" and "MemoryError" in big.stderr
    grow = run_code("a = []\nwhile True:\n    a.append(bytearray(32 * 2 ** 20))", memory_mb=256, timeout_s=20)
    assert grow.status == "crashed"
    caught = run_code("try:\n    x = bytearray(8 * 1024 ** 3)\nexcept MemoryError:\n    print('fine')", memory_mb=256)
    assert caught.status == "passed"  # a program that handles it is a program that passed
    assert resource.getrlimit(resource.RLIMIT_AS) == before  # the limits were the child's alone
    assert bytearray(64 * 2 ** 20)  # and this process still allocates


def test_file_size_limit(monkeypatch):
    monkeypatch.setattr(sandbox, "FILE_MB", 1)
    res = run_code("open('big', 'wb').write(b'x' * 3 * 2 ** 20)")
    assert res.status == "crashed" and "File too large" in res.stderr


def test_fresh_working_directory_removed_afterwards(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = ("import os, tempfile\n"
            "open('out.txt', 'w').write('x')\n"
            "open(os.path.expanduser('~/home.txt'), 'w').write('x')\n"
            "fd, tmp = tempfile.mkstemp()\n"
            "print(os.getcwd(), os.environ['HOME'], os.environ['TMPDIR'], tmp, sorted(os.listdir('.')))\n")
    res = run_code(code)
    assert res.status == "passed", res.stderr
    cwd, home, tmpdir, tmpfile, listing = res.stdout.split(" ", 4)
    assert home == tmpdir == cwd and tmpfile.startswith(cwd + os.sep)
    assert "'out.txt'" in listing and "'home.txt'" in listing
    assert not os.path.exists(cwd)  # removed, with everything the program wrote there
    assert os.listdir(tmp_path) == []  # nothing landed in the caller's directory
    again = run_code("import os; print(os.getcwd())")
    assert again.stdout.strip() != cwd


def test_read_only_leftovers_are_removed():
    res = run_code("import os\nos.makedirs('d/e')\nopen('d/e/f', 'w').write('x')\n"
                   "os.chmod('d/e', 0o500)\nos.chmod('d', 0o500)\nprint(os.getcwd())")
    assert res.status == "passed" and not os.path.exists(res.stdout.strip())


def test_no_inherited_environment(monkeypatch):
    monkeypatch.setenv("BYZ_TEST_SECRET", "hunter2")
    res = run_code("import os; print(sorted(os.environ.items()))")
    assert res.status == "passed"
    assert "hunter2" not in res.stdout and "BYZ_TEST_SECRET" not in res.stdout
    env = dict(eval(res.stdout))
    assert set(env) <= {"PATH", "LANG", "HOME", "TMPDIR", "LC_CTYPE"}


def test_output_tail_is_bounded():
    res = run_code("print('y' * 100000)")
    assert res.status == "passed" and len(res.stdout) == sandbox.TAIL_CHARS


# ---------------------------------------------------------------------------------- HumanEval

@pytest.mark.parametrize("completion", [
    "    return 2 * x\n",  # the harness's bare body
    "return x + x",  # flush left
    "Sure!\n```python\ndef double(x: int) -> int:\n    return helper(x) * 2\n```\nThis doubles x.",
    "```python\nimport math\n\ndef double(x):\n    return 2 * x\n\n"
    "if __name__ == '__main__':\n    print(double(int(input())))\n```",  # a demo that would wait on input
    "Here is the code:\ndef double(x):\n    return x * 2\n",  # prose, then a definition, no fence
])
def test_humaneval_completion_styles_pass(completion):
    res = check_humaneval(PROBLEM, completion)
    program = humaneval_program(PROBLEM["prompt"], completion, PROBLEM["test"], "double")
    assert res.status == "passed", (program, res.stderr)


@pytest.mark.parametrize("completion,status", [
    ("    return x\n", "failed"),
    ("```python\ndef double(x):\n    return x +\n```", "failed"),  # a syntax error
    ("    while True:\n        pass\n", "timeout"),
])
def test_humaneval_wrong_completions(completion, status):
    assert check_humaneval(PROBLEM, completion, timeout_s=1.5).status == status


def test_extract_code_prefers_the_block_that_defines_the_entry_point():
    text = "```python\ndef double(x):\n    return 2 * x\n```\nTest it:\n```python\nprint(double(2))\n```"
    assert extract_code(text, "double").startswith("def double")
    assert extract_code(text).startswith("print")  # without an entry point: the last block
    assert extract_code("```python\ndef f():\n    return 1\n", "f") == "def f():\n    return 1\n"  # unclosed fence
    with pytest.raises(ValueError, match="entry_point"):
        check_humaneval({"prompt": "", "test": ""}, "pass")


def test_extract_code_prefers_a_complete_block_to_one_cut_off():
    text = ("Tested:\n```python\ndef f(x):\n    return x + 1\n```\nOnce more:\n```python\ndef f(x):\n    ret")
    assert extract_code(text, "f") == "def f(x):\n    return x + 1\n"
    assert extract_code("```python\ndef f(x):\n    re", "f") == "def f(x):\n    re"  # only a cut-off one: still used
