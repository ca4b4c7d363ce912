"""Run generated Python code outside the caller's process.

    run_code(code, timeout_s=10.0, memory_mb=1024) -> SandboxResult   a whole program
    check_humaneval(task, completion, timeout_s=10.0) -> SandboxResult  prompt + completion + tests
    extract_code(text, entry_point=None) / humaneval_program(...)      how that program is built

The program runs as `python -I -B main.py` in a fresh temporary directory (its cwd; HOME and
TMPDIR point into it; removed afterwards) with an environment built from scratch (PATH, LANG,
HOME, TMPDIR: nothing of the caller's, so no secrets), stdin from /dev/null, in its own
session. A small launcher sets the resource limits and then execs the program: `preexec_fn` is
not safe in a process with threads (the async engine has some). Limits: address space (memory_mb), CPU
seconds (a little over the timeout), file size, core dumps off, and a cap on new processes.
On the wall-clock timeout, and after every run, the whole process group is killed, so children
the program forked die with it.

This is containment, not a jail: the program can still read and write anything its user may
(outside the temporary directory too) and use the network.

Status rule:
    "passed"   exit status 0
    "timeout"  wall-clock timeout, or killed by SIGXCPU (the CPU limit is a timeout too)
    "crashed"  killed by any other signal (SIGKILL, SIGSEGV, ...), or it exited non-zero with a
               final exception line that is a resource limit: MemoryError, "[Errno 12] Cannot
               allocate memory", "[Errno 27] File too large", or a fatal interpreter error
    "failed"   any other non-zero exit (an exception, a failed assert, sys.exit(1))
"""

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

TAIL_CHARS = 4000
FILE_MB = 64  # largest file the program may write (stdout and stderr included)
EXTRA_PROCS = 64  # new processes the program may start beyond what its user already runs

# Runs in the child before the program: limits, then exec (the pid, thus the group, is kept).
_LAUNCHER = r"""
import os, resource, sys
mem, cpu, fsize, procs = (int(x) for x in sys.argv[1:5])
def lim(what, soft, hard=None):
    old_soft, old_hard = resource.getrlimit(what)
    hard = soft if hard is None else hard
    if old_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, old_hard), min(hard, old_hard)
    resource.setrlimit(what, (soft, hard))
lim(resource.RLIMIT_AS, mem)
lim(resource.RLIMIT_CPU, cpu, cpu + 1)
lim(resource.RLIMIT_FSIZE, fsize)
lim(resource.RLIMIT_CORE, 0)
if procs > 0 and hasattr(resource, "RLIMIT_NPROC"):
    # Counted per user and per thread, not per program: allow what the user runs now plus a few.
    uid = str(os.getuid())
    def threads(pid):
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(l.split(":", 1) for l in f if ":" in l)
            return int(fields["Threads"]) if fields["Uid"].split()[0] == uid else 0
        except (OSError, KeyError, ValueError):
            return 0
    if os.path.isdir("/proc"):
        lim(resource.RLIMIT_NPROC, sum(threads(p) for p in os.listdir("/proc") if p.isdigit()) + procs)
os.execv(sys.executable, [sys.executable, "-I", "-B", sys.argv[5]])
"""

_RESOURCE_ERRORS = re.compile(r"^(MemoryError\b|Fatal Python error)|\[Errno (12|27)\]")


@dataclass
class SandboxResult:
    status: str  # "passed" | "failed" | "timeout" | "crashed"
    returncode: int | None  # negative: killed by that signal; None: killed at the timeout
    stdout: str  # the last TAIL_CHARS characters
    stderr: str
    seconds: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def run_code(code, timeout_s=10.0, memory_mb=1024):
    """Run `code` as a whole Python program in a separate, limited process; see the module doc."""
    if timeout_s <= 0 or memory_mb <= 0:
        raise ValueError(f"timeout_s and memory_mb must be positive, got {timeout_s}, {memory_mb}")
    workdir = tempfile.mkdtemp(prefix="byz-sandbox-")
    try:
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        limits = [memory_mb * 2**20, int(timeout_s) + 2, FILE_MB * 2**20, EXTRA_PROCS]
        argv = [sys.executable, "-I", "-B", "-c", _LAUNCHER, *map(str, limits), "main.py"]
        # Output goes to anonymous files, not pipes: a forked child holding a pipe open would
        # keep a reader waiting past the program's end.
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            start = time.monotonic()
            proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=err, start_new_session=True)
            try:
                proc.wait(timeout=timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_group(proc.pid)  # also after a normal exit: no leftover children
            proc.wait()
            seconds = time.monotonic() - start
            stdout, stderr = _tail(out), _tail(err)
    finally:
        _remove(workdir)
    rc = None if timed_out else proc.returncode
    return SandboxResult(_status(rc, timed_out, stderr), rc, stdout, stderr, seconds)


def _status(rc, timed_out, stderr):
    if timed_out or rc == -signal.SIGXCPU:
        return "timeout"
    if rc == 0:
        return "passed"
    if rc < 0:
        return "crashed"
    lines = [line for line in stderr.splitlines() if line.strip()]
    if lines and _RESOURCE_ERRORS.search(lines[-1]):
        return "crashed"
    return "failed"


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


def _tail(f):
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - 4 * TAIL_CHARS))
    return f.read().decode("utf-8", "replace")[-TAIL_CHARS:]


def _remove(path):
    """rmtree that survives a program which made its files read-only."""
    def fix(func, p, _exc):
        os.chmod(os.path.dirname(p), stat.S_IRWXU)
        if os.path.isdir(p) and not os.path.islink(p):
            os.chmod(p, stat.S_IRWXU)
        func(p)
    hook = {"onexc": fix} if sys.version_info >= (3, 12) else {"onerror": fix}  # onerror is deprecated in 3.12
    try:
        shutil.rmtree(path, **hook)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------------------------- HumanEval

def extract_code(text, entry_point=None):
    """The code in a model's answer: the fenced block that defines `entry_point` (else the last
    fenced block); without fences the text itself, from its first line of code when it defines
    `entry_point` after some prose."""
    text = re.sub(r"<think>.*?</think>", "", str(text or ""), flags=re.S)
    # An unclosed fence (the output was cut off) runs to the end; a complete block is preferred to it.
    found = re.findall(r"```[ \t]*[\w+-]*[ \t]*\n(.*?)(```|\Z)", text, flags=re.S)
    if found:
        blocks = sorted(found, key=lambda b: b[1] == "```")  # stable: closed blocks last, in order
        defining = [b for b, _ in blocks if entry_point and _defines(b, entry_point)]
        return (defining or [b for b, _ in blocks])[-1]
    if entry_point and _defines(text, entry_point):
        m = re.search(r"(?m)^(?:import |from \S+ import |def |class |@)", text)
        return text[m.start():] if m else text
    return text


def _defines(code, entry_point):
    return re.search(rf"(?m)^\s*def\s+{re.escape(entry_point)}\s*\(", code) is not None


def humaneval_program(prompt, completion, test, entry_point):
    """The program that checks one completion, as the HumanEval harness builds it: prompt +
    completion + test + check(entry_point). A completion that (re)defines the function follows the
    prompt whole (the prompt's imports and helpers stay; its docstring-only function is replaced);
    a bare body continues the prompt, indented when the model wrote it flush left."""
    code = _drop_main_block(extract_code(completion, entry_point))
    if _defines(code, entry_point):
        body = "\n" + code
    else:
        lines = code.strip("\n").splitlines()
        if lines and not any(line[:1].isspace() for line in lines if line.strip()):
            lines = ["    " + line if line.strip() else line for line in lines]
        body = "\n".join(lines)
    return f"{prompt}{body}\n\n{test}\n\ncheck({entry_point})\n"


def _drop_main_block(code):
    """Remove a top-level `if __name__ == "__main__":` block: it would run demos (or wait on
    input) inside the test program."""
    lines = code.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"if\s+__name__\s*==\s*['\"]__main__['\"]\s*:", line):
            end = i + 1
            while end < len(lines) and (not lines[end].strip() or lines[end][:1].isspace()):
                end += 1
            return "\n".join(lines[:i] + lines[end:])
    return code


def check_humaneval(task, completion, timeout_s=10.0, memory_mb=1024):
    """Run a HumanEval-format problem's tests on a completion. `task` is a Task (its metadata holds
    prompt, test and entry_point) or a dict with those fields."""
    fields = task if isinstance(task, dict) else task.metadata
    try:
        prompt, test, entry_point = fields["prompt"], fields["test"], fields["entry_point"]
    except KeyError as e:
        raise ValueError(f"not a HumanEval-format problem: no {e.args[0]!r} field") from None
    program = humaneval_program(prompt, completion, test, entry_point)
    return run_code(program, timeout_s=timeout_s, memory_mb=memory_mb)
