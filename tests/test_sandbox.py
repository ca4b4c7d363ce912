"""The code sandbox: statuses, timeouts that take children with them, memory limits, a fresh
working directory, no inherited environment; and, by default, isolation: no network, no files but
its own, no other processes, not root, nothing left behind (each probe a test)."""
import errno
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from byzantium.tasks import sandbox
from byzantium.tasks.humaneval import check_humaneval, extract_code, solution_program
from byzantium.tasks.sandbox import SandboxUnavailable, run_code

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


def _named(marker):
    """Live processes (host view) whose name is `marker`: a program names a process it starts by
    writing /proc/self/comm, so the test can find it from outside whatever PID it has inside."""
    found = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/comm") as f:
                    if f.read().strip() == marker and _alive(p):
                        found.append(int(p))
            except OSError:
                pass
    return found


def _none_named(marker, within=3.0):
    end = time.monotonic() + within
    while _named(marker) and time.monotonic() < end:
        time.sleep(0.05)
    left = _named(marker)
    for pid in left:  # do not leave them running when the test fails
        os.kill(pid, signal.SIGKILL)
    return not left


def _marker():
    return f"byzprobe{random.randrange(10**6):06d}"


@pytest.mark.parametrize("isolation", ["namespace", "process"])
def test_statuses(isolation):
    def run(code):
        return run_code(code, isolation=isolation)
    ok = run("print('hi')")
    assert ok.status == "passed" and ok.passed and ok.returncode == 0 and ok.stdout == "hi\n"
    assert run("assert 1 + 1 == 3").status == "failed"
    err = run("raise ValueError('boom')")
    assert err.status == "failed" and err.returncode == 1 and "ValueError: boom" in err.stderr
    assert run("import sys; sys.exit(3)").returncode == 3
    seg = run("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert seg.status == "crashed" and seg.returncode < 0
    assert run("input()").status == "failed"  # stdin is closed: EOFError, not a hang


def test_bad_arguments_and_no_silent_fallback(monkeypatch):
    with pytest.raises(ValueError, match="isolation"):
        run_code("pass", isolation="none")
    monkeypatch.setattr(sandbox.sys, "platform", "darwin")
    with pytest.raises(SandboxUnavailable, match="isolation='process'"):
        run_code("pass")


@pytest.mark.skipif(os.geteuid() != 0, reason="a root caller chooses the outside uid")
def test_a_jail_that_cannot_be_built_refuses_to_run(monkeypatch):
    monkeypatch.setattr(sandbox, "NOBODY", 2**32 - 1)  # not a uid: the id map is refused
    with pytest.raises(SandboxUnavailable, match="id map"):
        run_code("print('ran')")


# ----------------------------------------------------------------------------- isolation probes

def test_no_network_not_even_loopback():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.setblocking(False)
    port = srv.getsockname()[1]
    code = ("import socket\n"
            f"for addr in [('127.0.0.1', {port}), ('1.1.1.1', 53)]:\n"
            "    try:\n        socket.create_connection(addr, timeout=5)\n        print('connected')\n"
            "    except OSError as e:\n        print(e.errno)\n")
    try:
        res = run_code(code, timeout_s=20)
        with pytest.raises(BlockingIOError):
            srv.accept()  # nobody came
    finally:
        srv.close()
    assert res.status == "passed", res.stderr
    # The seccomp filter refuses an AF_INET socket (EPERM) before the empty network namespace
    # would refuse the connect (ENETUNREACH); at once either way, not by a timeout.
    assert res.stdout.split() == [str(errno.EPERM)] * 2
    assert res.seconds < 5


def test_writes_nothing_outside_its_directory(tmp_path):
    targets = [os.path.join(tempfile.gettempdir(), _marker()), str(tmp_path / "probe")]
    code = ("for path in %r:\n"
            "    try:\n        open(path, 'w').write('x')\n    except OSError as e:\n        print(e)\n" % targets)
    try:
        res = run_code(code)
        assert res.status == "passed", res.stderr
        assert not any(os.path.exists(t) for t in targets)
    finally:
        for t in targets:
            if os.path.exists(t):
                os.remove(t)


def test_cannot_see_home_nor_project():
    home = os.path.expanduser("~")
    code = ("import os\n"
            f"try:\n    print(sorted(os.listdir({home!r})))\nexcept OSError:\n    print([])\n"
            f"try:\n    print('read', len(open({__file__!r}).read()))\nexcept OSError as e:\n    print(type(e).__name__)\n")
    res = run_code(code)
    assert res.status == "passed", res.stderr
    seen, rest = res.stdout.split("\n", 1)
    # In the home at most the way to a Python installation under it (a pyenv, a venv).
    prefixes = {sys.prefix, sys.base_prefix}
    assert all(any(p.startswith(os.path.join(home, e) + os.sep) for p in prefixes) for e in eval(seen))
    assert rest.strip() == "FileNotFoundError"  # this very file


def test_cannot_read_other_processes_environment():
    secret = f"hunter-{random.randrange(10**9)}"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, "BYZ_PROBE_SECRET": secret})
    code = ("import os\n"
            f"for pid in [{os.getpid()}, {other.pid}] + [p for p in os.listdir('/proc') if p.isdigit()]:\n"
            "    try:\n        print(pid, open(f'/proc/{pid}/environ', 'rb').read())\n"
            "    except OSError as e:\n        print(pid, type(e).__name__)\n"
            "print('procs', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n")
    try:
        res = run_code(code)
    finally:
        other.kill()
        other.wait()
    assert res.status == "passed", res.stderr
    assert secret not in res.stdout
    lines = res.stdout.splitlines()
    assert lines[0] == f"{os.getpid()} FileNotFoundError" and lines[1] == f"{other.pid} FileNotFoundError"
    assert 2 in set(eval(lines[-1].split(" ", 1)[1])) <= {1, 2}  # itself (and its PID 1, the jail's init)


def test_cannot_signal_the_caller():
    got = []
    old = signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
    try:
        res = run_code(f"import os, signal\ntry:\n    os.kill({os.getpid()}, signal.SIGUSR1)\n    print('sent')\n"
                       "except OSError as e:\n    print(type(e).__name__)\n")
        time.sleep(0.2)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert res.stdout.strip() == "ProcessLookupError" and not got


def test_runs_unprivileged_as_seen_from_outside():
    marker = _marker()
    code = ("import os, sys, time\n"
            f"open('/proc/self/comm', 'w').write({marker!r})\n"
            "print(os.access(os.__file__, os.W_OK), os.access(sys.prefix, os.W_OK), flush=True)\n"
            "import ctypes\nprint(ctypes.CDLL(None).unshare(0x10000000), flush=True)\n"  # a user namespace
            "time.sleep(3)\n")
    box = {}
    worker = threading.Thread(target=lambda: box.update(res=run_code(code, timeout_s=20)))
    worker.start()
    try:
        end = time.monotonic() + 10
        while not _named(marker) and time.monotonic() < end:
            time.sleep(0.02)
        pids = _named(marker)
        assert pids, "the program never showed up"
        with open(f"/proc/{pids[0]}/status") as f:
            status = dict(line.split(":", 1) for line in f)
    finally:
        worker.join()
    uids, gids = status["Uid"].split(), status["Gid"].split()
    assert "0" not in uids and "0" not in gids and "0" not in status["Groups"].split()
    if os.geteuid() == 0:
        assert set(uids) == {str(sandbox.NOBODY)}
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0 and int(status["CapBnd"], 16) == 0
    res = box["res"]
    # Nor can it change the Python installation, nor make a namespace where it would have powers.
    assert res.status == "passed" and res.stdout.split() == ["False", "False", "-1"], res.stderr


def test_fork_bomb_is_capped():
    code = ("import os, time\nn = 0\n"
            "try:\n"
            "    while n < 300:\n"  # a bound, so that an unconfined run does not take the machine down
            "        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n"
            "        n += 1\n"
            "except OSError as e:\n    print(e.errno)\n"
            "print(n)\n")
    start = time.monotonic()
    res = run_code(code, timeout_s=20)
    assert time.monotonic() - start < 15
    assert res.status == "passed", res.stderr
    err, n = map(int, res.stdout.split())
    assert err == errno.EAGAIN and 0 < n <= sandbox.EXTRA_PROCS


@pytest.mark.parametrize("spin", [False, True])
def test_setsid_grandchild_dies_with_the_program(spin):
    """At the timeout (spin) or at a normal end: a grandchild that left the session is gone too."""
    marker = _marker()
    code = ("import os, time\n"
            "if os.fork() == 0:\n"
            "    if os.fork() == 0:\n"
            "        os.setsid()\n"
            f"        open('/proc/self/comm', 'w').write({marker!r})\n"
            "        open('ready', 'w').close()\n"
            "        time.sleep(60)\n"
            "    os._exit(0)\n"
            "while not os.path.exists('ready'):\n    time.sleep(0.01)\n"
            "print('started', flush=True)\n"
            + ("while True:\n    pass\n" if spin else ""))
    res = run_code(code, timeout_s=2 if spin else 20)
    assert res.stdout.strip() == "started"
    assert res.status == ("timeout" if spin else "passed") and res.seconds < 10
    assert _none_named(marker)


def test_infinite_loop_and_its_children_are_killed_in_process_mode():
    code = ("import os, sys, time\n"
            "pid = os.fork()\n"
            "if pid == 0:\n    time.sleep(120)\n    os._exit(0)\n"
            "print(pid, os.getpgrp(), flush=True)\n"
            "while True:\n    pass\n")
    start = time.monotonic()
    res = run_code(code, timeout_s=1.5, isolation="process")
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


def test_infinite_loop_times_out():
    start = time.monotonic()
    res = run_code("while True:\n    pass\n", timeout_s=1.5)
    assert res.status == "timeout" and res.returncode is None
    assert 1.4 < res.seconds < 6 and time.monotonic() - start < 10


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
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where run_code makes its directory
    code = ("import os, tempfile\n"
            "open('out.txt', 'w').write('x')\n"
            "open(os.path.expanduser('~/home.txt'), 'w').write('x')\n"
            "fd, tmp = tempfile.mkstemp()\n"
            "open('/tmp/literal.txt', 'w').write('x')\n"
            "print(os.getcwd(), os.environ['HOME'], os.environ['TMPDIR'], tmp, sorted(os.listdir('.')))\n")
    res = run_code(code)
    assert res.status == "passed", res.stderr
    cwd, home, tmpdir, tmpfile, listing = res.stdout.split(" ", 4)
    assert home == tmpdir == cwd == "/sandbox" and tmpfile.startswith(cwd + os.sep)
    assert "'out.txt'" in listing and "'home.txt'" in listing  # /tmp is a private scratch of its own
    assert os.listdir(scratch) == []  # removed, with everything the program wrote there
    assert sorted(os.listdir(tmp_path)) == ["scratch"]  # nothing landed in the caller's directory
    again = run_code("import os; print(os.listdir('.'))")
    assert again.stdout.strip() == "['main.py']"  # a fresh directory each time


def test_read_only_leftovers_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for isolation in ("namespace", "process"):
        res = run_code("import os\nos.makedirs('d/e')\nopen('d/e/f', 'w').write('x')\n"
                       "os.chmod('d/e', 0o500)\nos.chmod('d', 0o500)\n", isolation=isolation)
        assert res.status == "passed" and os.listdir(tmp_path) == []


@pytest.mark.parametrize("isolation", ["namespace", "process"])
def test_no_inherited_environment(monkeypatch, isolation):
    monkeypatch.setenv("BYZ_TEST_SECRET", "hunter2")
    res = run_code("import os; print(sorted(os.environ.items()))", isolation=isolation)
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
    program = solution_program(PROBLEM["prompt"], completion, "double")
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


# Verdicts: each of these completions is wrong and tries to be scored as passed.
@pytest.mark.parametrize("completion", [
    "def double(x):\n    raise SystemExit(0)\n",
    "import os\nos._exit(0)\ndef double(x):\n    return 0\n",
    "import atexit, os\natexit.register(os._exit, 0)\ndef double(x):\n    return 0\n",
    "import sys\nsys.exit(0)\n",
    "class Any:\n    def __eq__(self, other):\n        return True\n\ndef double(x):\n    return Any()\n",
    "class Any(int):\n    def __eq__(self, other):\n        return True\n\ndef double(x):\n    return [Any(0)]\n",
    # Its own test blocks: the second one used to survive and exit 0 before check() ran.
    "def double(x):\n    return x\n\nif __name__ == '__main__':\n    print(double(2))\n\n"
    "import unittest\nif __name__ == \"__main__\":\n    unittest.main()\n",
    "def double(x):\n    return x\n\nif '__main__' == __name__:\n    import sys; sys.exit(0)\n",
])
def test_humaneval_early_exits_and_forged_values_fail(completion):
    assert check_humaneval(PROBLEM, completion, timeout_s=5).status == "failed"


# Verdicts: wrong solutions that look for the tests or the verdict's channel. The tests run in another
# sandbox (their own PID, mount and IPC namespaces): nothing of them is in the solution's file, memory,
# process tree or output, and only plain data crosses back.
_FIND_THE_TESTS = {
    "reads its own file": "def double(x):\n    src = open(__file__).read()\n"
                          "    import re\n    m = re.search(r'candidate\\(%d\\) == (-?\\d+)' % x, src)\n"
                          "    return int(m.group(1)) if m else 0\n",
    "reads every file it can": "import os\ndef double(x):\n    for d, _, fs in os.walk('/'):\n"
                               "        for f in fs:\n            p = os.path.join(d, f)\n"
                               "            try:\n                if b'def check(' in open(p, 'rb').read(1 << 20):\n"
                               "                    raise SystemExit(p)\n            except OSError:\n"
                               "                pass\n    return 0\n",
    "walks the caller's frames": "import sys\ndef double(x):\n    f = sys._getframe(1)\n    while f:\n"
                                 "        cs = list(f.f_code.co_consts)\n"
                                 "        if x in cs and cs.index(x) + 1 < len(cs):\n"
                                 "            return cs[cs.index(x) + 1]\n        f = f.f_back\n    return 0\n",
    "finds the end marker": "import os, sys\ndef double(x):\n    f = sys._getframe(1)\n    while f:\n"
                            "        for c in f.f_code.co_consts:\n"
                            "            if isinstance(c, str) and c.startswith('byzantium-tests-done-'):\n"
                            "                print(c.strip(), flush=True)\n                os._exit(0)\n"
                            "        f = f.f_back\n    return 0\n",
    "forges the end marker": "import sys\ndef double(x):\n    print('byzantium-tests-done-' + '0' * 32)\n"
                             "    sys.stdout.flush()\n    return 0\n",
    "writes to every descriptor": "import os\ndef double(x):\n    for fd in range(3, 64):\n"
                                  "        try:\n            os.write(fd, b'[\"value\", [\"int\", \"0x6\"]]\\n')\n"
                                  "        except OSError:\n            pass\n    return 0\n",
    "looks for the tests' process": "import os\ndef double(x):\n    for p in os.listdir('/proc'):\n"
                                    "        if p.isdigit() and int(p) != os.getpid():\n"
                                    "            try:\n                os.kill(int(p), 9)\n            except OSError:\n"
                                    "                pass\n    return 0\n",
    "spoofs a built-in type": "class Any(int):\n    __module__ = 'builtins'\n"
                              "    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
                              "def double(x):\n    return Any(0)\n",
    "exits the tests' way": "import os\ndef double(x):\n    os._exit(0)\n",
}


@pytest.mark.parametrize("name", sorted(_FIND_THE_TESTS))
def test_a_wrong_solution_cannot_reach_the_tests_or_the_verdict(name):
    res = check_humaneval(PROBLEM, _FIND_THE_TESTS[name], timeout_s=10)
    assert res.status == "failed", (name, res.stderr[-500:])


@pytest.mark.parametrize("completion", [
    "from collections import Counter\ndef double(x):\n    return Counter({2 * x: 1}).most_common(1)[0][0]\n",
    "import fractions\ndef double(x):\n    return fractions.Fraction(4 * x, 2)\n",  # a library number: its value
    "def double(x):\n    print('working'); return 2 * x\n",
])
def test_library_values_and_printing_solutions_pass(completion):
    res = check_humaneval(PROBLEM, completion)
    assert res.status == "passed", res.stderr
    assert "working" in res.stdout or "print" not in completion  # stdout is the solution's


def test_exceptions_cross_by_name():
    problem = dict(PROBLEM, test="def check(candidate):\n    try:\n        candidate(-1)\n"
                                 "    except ValueError as e:\n        assert 'negative' in str(e)\n"
                                 "    else:\n        assert False\n")
    good = "def double(x):\n    if x < 0:\n        raise ValueError('negative')\n    return 2 * x\n"
    assert check_humaneval(problem, good).status == "passed"
    assert check_humaneval(problem, "    raise KeyError('negative')\n").status == "failed"


def test_humaneval_in_process_mode_too():
    assert check_humaneval(PROBLEM, "    return 2 * x\n", isolation="process").status == "passed"
    assert check_humaneval(PROBLEM, "    return x\n", isolation="process").status == "failed"


@pytest.mark.parametrize("completion", [
    "def double(x):\n    return 2 * x\n\nif __name__ == '__main__':\n    print(1)\n\n"
    "import unittest\nif __name__ == '__main__':\n    unittest.main()\n",
    # Written in ways no pattern over the source would catch: none of them runs (an input() there would fail).
    "def double(x):\n    return 2 * x\n\ndef demo():\n    if __name__ == '__main__':\n        input()\n\ndemo()\n",
    "def double(x):\n    return 2 * x\n\ntry:\n    if __name__ == '__main__':\n        input()\nexcept ImportError:\n    pass\n",
    "def double(x):\n    return 2 * x\n\nif __name__ in ('__main__',):\n    print(double(int(input())))\n",
])
def test_main_blocks_never_run_as_in_the_official_harness(completion):
    assert check_humaneval(PROBLEM, completion).status == "passed"


# Isolation past the namespaces: the seccomp filter. Each probe prints the errno it got.
_ERRNO_PROBES = {
    "vsock": "import socket\nsocket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)",
    "vsock_dgram": "import socket\nsocket.socket(socket.AF_VSOCK, socket.SOCK_DGRAM)",
    "netlink": "import socket\nsocket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM)",
    "inet": "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM)",
    "packet": "import socket\nsocket.socket(socket.AF_PACKET, socket.SOCK_RAW)",
    "socketpair_inet": "import socket\nsocket.socketpair(socket.AF_INET)",
    "flock_python": "import fcntl, os\nfcntl.flock(open(os.__file__), fcntl.LOCK_SH)",
    "lockf_python": "import fcntl, os\nfcntl.lockf(open(os.__file__), fcntl.LOCK_SH)",
    "flock_own": "import fcntl\nfcntl.flock(open('main.py'), fcntl.LOCK_EX)",
}
_SYSCALL_PROBES = {  # name: (x86_64 number, arguments)
    "keyctl_read_session": (250, (11, -3, 0, 0)),  # KEYCTL_READ of KEY_SPEC_SESSION_KEYRING
    "add_key": (248, (b"user", b"k", b"v", 1, -3)),
    "request_key": (249, (b"user", b"k", None, 0)),
    "io_uring_setup": (425, (1, None)),
    "userfaultfd": (323, (0,)),
    "bpf": (321, (0, None, 0)),
    "perf_event_open": (298, (None, 0, -1, -1, 0)),
    "ptrace": (101, (16, 1, 0, 0)),  # PTRACE_ATTACH to PID 1
    "mount": (165, (b"none", b"/tmp", b"tmpfs", 0, None)),
    "unshare": (272, (0x10000000,)),
    "inotify_init1": (294, (0,)),
}


@pytest.mark.parametrize("name", sorted(_ERRNO_PROBES))
def test_seccomp_denies_sockets_and_locks(name):
    code = "import errno\ntry:\n" + "".join("    " + l + "\n" for l in _ERRNO_PROBES[name].splitlines())
    code += "    print('allowed')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n"
    res = run_code(code, timeout_s=5)
    assert (res.status, res.stdout.strip()) == ("passed", "EPERM"), res.stderr


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="syscall numbers of x86_64")
@pytest.mark.parametrize("name", sorted(_SYSCALL_PROBES))
def test_seccomp_denies_kernel_surfaces(name):
    nr, args = _SYSCALL_PROBES[name]
    code = ("import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            f"r = libc.syscall({nr}, *{args!r})\nprint(r, errno.errorcode.get(ctypes.get_errno()))\n")
    res = run_code(code, timeout_s=5)
    assert (res.status, res.stdout.strip()) == ("passed", "-1 EPERM"), res.stderr


def test_unix_sockets_still_work():
    code = "import socket\na, b = socket.socketpair()\na.send(b'x')\nprint(b.recv(1))\n"
    assert run_code(code, timeout_s=5).stdout.strip() == "b'x'"


def test_seccomp_program_jumps_stay_inside():
    from byzantium.tasks.jail import SECCOMP, seccomp_program
    for machine in SECCOMP:
        prog = seccomp_program(machine)
        for i, (code, jt, jf, _k) in enumerate(prog):
            if code & 0x07 == 0x05:  # a jump
                assert 0 <= jt and 0 <= jf and i + 1 + max(jt, jf) < len(prog)
        assert prog[-1] == (0x06, 0, 0, 0x00050001)  # the deny return is last


def test_sandbox_and_tmp_are_size_limited_tmpfs(monkeypatch):
    monkeypatch.setattr(sandbox, "FILE_MB", 1)
    # Many files each under the file-size cap: the whole of /sandbox is bounded (4 x FILE_MB), and /tmp.
    for where in ("/sandbox", "/tmp"):
        code = f"for i in range(8):\n    open('{where}/f%d' % i, 'wb').write(b'x' * (2 ** 20 - 4096))\n"
        res = run_code(code, timeout_s=5)
        assert res.status == "crashed" and "No space left on device" in res.stderr, (where, res.stderr)


def test_deep_directory_tree_is_cleaned_up(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox.tempfile, "tempdir", str(tmp_path))
    code = "import os\nfor i in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\nprint('deep')\n"
    for isolation in sandbox.ISOLATIONS:
        res = run_code(code, timeout_s=20, isolation=isolation)
        assert res.stdout.strip() == "deep", res.stderr
        assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ one memory bound, keyring, mounts

def _cgroup_or_skip():
    from byzantium.tasks.cgroup import CgroupUnavailable, MemoryCgroup
    try:
        MemoryCgroup.create(2**26).remove()
    except CgroupUnavailable as e:
        pytest.skip(f"no memory cgroup here: {e}")


_MEMORY_PROBES = {  # each holds far more than memory_mb=128 in all, under the per-process limit each
    "memfds": "import os\nfds = []\nfor i in range(12):\n    fd = os.memfd_create('m')\n"
              "    os.write(fd, b'x' * (100 * 2 ** 20))\n    fds.append(fd)\nprint('held')\n",
    "children": "import os, time\nkids = []\nfor i in range(12):\n    pid = os.fork()\n    if pid == 0:\n"
                "        b = bytearray(100 * 2 ** 20)\n        time.sleep(5)\n        os._exit(0)\n"
                "    kids.append(pid)\nok = all(os.waitpid(p, 0)[1] == 0 for p in kids)\nprint('held' if ok else 'lost')\n",
    "tmpfs files": "for i in range(3):\n    open('/sandbox/f%d' % i, 'wb').write(b'x' * (60 * 2 ** 20))\n"
                   "for i in range(1):\n    open('/tmp/f%d' % i, 'wb').write(b'x' * (60 * 2 ** 20))\nprint('held')\n",
}


@pytest.mark.parametrize("name", sorted(_MEMORY_PROBES))
def test_one_memory_bound_for_the_whole_sandbox(name):
    _cgroup_or_skip()
    res = run_code(_MEMORY_PROBES[name], memory_mb=128, timeout_s=20)
    assert res.status == "crashed" and res.oom_kills >= 1 and "held" not in res.stdout, (res, res.stderr[-300:])
    assert res.missing == ()


def _cpu_bound_or_skip():
    _cgroup_or_skip()
    from byzantium.tasks.cgroup import MemoryCgroup
    group = MemoryCgroup.create(2**26)
    try:
        if not group.bound_cpu(sandbox.CPUS):
            pytest.skip("the cgroup cpu controller is not this user's to use here")
    finally:
        group.remove()


_SPINNERS = """
import os, time
for _ in range({n}):
    if os.fork() == 0:
        os.setsid()
        end = time.monotonic() + {seconds}
        while time.monotonic() < end:
            pass
        os._exit(0)
"""


def test_spinning_children_share_one_cpu_bound():
    _cpu_bound_or_skip()
    # Four children in new sessions spin for 1.5 s; with the sandbox's CPU bound they get its CPUS in all.
    code = _SPINNERS.format(n=4, seconds=1.5) + (
        "start, used = time.monotonic(), 0.0\nfor _ in range(4):\n    _, _, ru = os.wait4(-1, 0)\n"
        "    used += ru.ru_utime + ru.ru_stime\nprint(used / (time.monotonic() - start))\n")
    res = run_code(code, timeout_s=20)
    assert res.passed, res.stderr
    assert float(res.stdout) <= sandbox.CPUS * 1.15  # 15%: the quota is enforced per 100 ms period, roughly


def test_a_forking_solution_does_not_starve_an_honest_check_beside_it():
    _cpu_bound_or_skip()
    problem = dict(PROBLEM, test="def check(candidate):\n    assert candidate(3) == 6\n")
    # (posix.fork: the official harness's guard, applied in the solution's process, sets os.fork to None)
    spinner = (_SPINNERS.format(n=48, seconds=20).replace("os.fork", "posix.fork").replace("import os", "import os, posix")
               + "def double(x):\n    import time\n    time.sleep(20)\n")
    honest = "def double(x):\n    sum(range(10**7))\n    return 2 * x\n"  # about half a CPU-second
    hostile = threading.Thread(target=check_humaneval, args=(problem, spinner), kwargs={"timeout_s": 6})
    hostile.start()
    try:
        time.sleep(1.0)  # the spinners are running
        res = check_humaneval(problem, honest, timeout_s=4)
    finally:
        hostile.join()
    assert res.status == "passed", res.stderr[-500:]


def test_memory_cgroups_are_removed(monkeypatch):
    _cgroup_or_skip()
    from byzantium.tasks import cgroup
    made = []
    real = cgroup.MemoryCgroup.create.__func__
    monkeypatch.setattr(cgroup.MemoryCgroup, "create", classmethod(lambda cls, n: made.append(real(cls, n)) or made[-1]))
    assert run_code("x = bytearray(10 ** 7)\nprint('ok')", memory_mb=128).stdout == "ok\n"
    assert len(made) == 1 and not os.path.exists(made[0].path)


def test_a_missing_protection_is_named_and_refused_unless_accepted(monkeypatch):
    from byzantium.tasks.cgroup import CgroupUnavailable

    def unavailable(cls, limit):
        raise CgroupUnavailable("the memory controller is not delegated to /test")
    monkeypatch.setattr(sandbox.MemoryCgroup, "create", classmethod(unavailable))
    with pytest.raises(SandboxUnavailable, match="memory_cgroup"):
        run_code("print('ran')")
    with pytest.raises(SandboxUnavailable, match="memory_cgroup"):
        check_humaneval(PROBLEM, "    return 2 * x\n")
    res = run_code("print('ran')", allow_missing=("memory_cgroup",))
    assert res.stdout == "ran\n" and res.missing == ("memory_cgroup",)
    assert check_humaneval(PROBLEM, "    return 2 * x\n", allow_missing=["memory_cgroup"]).missing == ("memory_cgroup",)
    with pytest.raises(ValueError, match="unknown protections"):
        run_code("pass", allow_missing=("network",))


def test_resilience_refuses_code_tasks_before_any_model_loads(monkeypatch):
    from byzantium.cli import parser
    from byzantium.experiments.resilience_command import prepare_resilience
    from byzantium.tasks.cgroup import CgroupUnavailable

    def unavailable(cls, limit):
        raise CgroupUnavailable("not delegated")
    monkeypatch.setattr(sandbox.MemoryCgroup, "create", classmethod(unavailable))
    monkeypatch.setattr("byzantium.experiments.resilience_command.check_models",
                        lambda *a: pytest.fail("the models were checked before the sandbox"))
    with pytest.raises(ValueError, match="--sandbox-allow-missing"):
        prepare_resilience(parser().parse_args(["run", "resilience", "--task", "gen-code", "--limit", "2"]))
    monkeypatch.setattr("byzantium.experiments.resilience_command.check_models", lambda *a: None)
    args = parser().parse_args(["run", "resilience", "--task", "gen-code", "--limit", "2", "--sandbox-allow-missing",
                                "memory_cgroup"])
    assert len(prepare_resilience(args)[1]) == 2


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="syscall numbers of x86_64")
def test_a_fresh_session_keyring_beneath_the_filter(monkeypatch):
    monkeypatch.setattr(sandbox, "SECCOMP_FILTER", False)  # the layer beneath: keyctl reaches the kernel
    get_id = "import ctypes\nprint(ctypes.CDLL(None, use_errno=True).syscall(250, 0, -3, 1))\n"  # GET_KEYRING_ID
    ours = subprocess.run([sys.executable, "-c", get_id], capture_output=True, text=True).stdout.strip()
    theirs = [run_code(get_id).stdout.strip() for _ in range(2)]
    if int(ours) < 0:
        pytest.skip("no session keyring here")
    assert all(int(t) > 0 for t in theirs) and len({ours, *theirs}) == 3


def test_mounts_show_no_host_path_but_their_own():
    res = run_code("print(open('/proc/self/mountinfo').read())")
    assert res.status == "passed" and "byz-sandbox" not in res.stdout
    for line in res.stdout.strip().splitlines():
        root, point = line.split()[3:5]
        assert root == "/" or point.endswith(root), line  # a bind shows the path it is mounted at
