"""Run generated Python code outside the caller's process, isolated from the machine.

    run_code(code, timeout_s=10.0, memory_mb=1024, isolation="namespace") -> SandboxResult
    check_humaneval(task, completion, timeout_s=10.0) -> SandboxResult  prompt + completion + tests
    extract_code(text, entry_point=None) / humaneval_program(...)      how that program is built

The program runs as `python -I -B main.py` in a fresh temporary directory (its cwd; HOME and
TMPDIR point into it; removed afterwards) with an environment built from scratch (PATH, LANG,
HOME, TMPDIR: nothing of the caller's, so no secrets) and stdin from /dev/null. Limits: address
space (memory_mb), CPU seconds (a little over the timeout), file size, core dumps off, and a cap
on new processes. A launcher sets them and then execs the program: `preexec_fn` is not safe in a
process with threads (the async engine has some).

isolation="namespace" (the default; Linux): the launcher (jail.py) runs the program in new user,
mount, network, PID, IPC, UTS and cgroup namespaces. It sees a read-only Python installation and
shared libraries, a few devices, its own /proc, its work directory at /sandbox and a private /tmp,
and nothing else of the files; it has no network; it sees and can signal no other process;
outside it is nobody (the caller's own uid for a non-root caller), inside a root without
capabilities. A seccomp filter (jail.py, SECCOMP) set just before the exec denies what the
namespaces do not confine: the kernel keyring, sockets other than AF_UNIX (vsock, netlink, ...),
io_uring, userfaultfd, bpf, perf_event_open, ptrace, mounts and new namespaces, inotify/fanotify,
file locks. At the timeout, and when it ends, every process it started dies with its PID
namespace, setsid() or not. Where these namespaces cannot be made (user namespaces disabled, a
seccomp filter, not Linux) run_code raises SandboxUnavailable, saying why: it never falls back.

isolation="process": only the limits above, in a new session whose process group is killed at the
end. This is containment, not a jail: the program can read and write anything its user may, use
the network, see and signal other processes; use it only where the code is trusted.

Status rule (check_humaneval adds: "passed" only when the harness's random end-of-tests marker,
printed after check(), is the last line of stdout; an early exit 0 is "failed"):
    "passed"   exit status 0
    "timeout"  wall-clock timeout, or killed by SIGXCPU (the CPU limit is a timeout too)
    "crashed"  killed by any other signal (SIGKILL, SIGSEGV, ...), or it exited non-zero with a
               final exception line that is a resource limit: MemoryError, "[Errno 12] Cannot
               allocate memory", "[Errno 27] File too large", "[Errno 28] No space left on device", or a fatal interpreter error
    "failed"   any other non-zero exit (an exception, a failed assert, sys.exit(1))
"""

import ast
import os
import re
import secrets
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
EXTRA_PROCS = 64  # new processes the program may start (process mode: beyond what its user runs)
ISOLATIONS = ("namespace", "process")
NOBODY = 65534  # the outside uid and gid of a program a root caller runs in namespaces
SETUP_S = 10.0  # a jail that has not ended this long after the timeout is killed from outside
_JAIL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jail.py")


class SandboxUnavailable(RuntimeError):
    """The namespaces could not be set up, so the program did not run."""


# Process mode: runs in the child before the program: limits, then exec (the pid, thus the group, is kept).
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

_RESOURCE_ERRORS = re.compile(r"^(MemoryError\b|Fatal Python error)|\[Errno (12|27|28)\]")


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


def run_code(code, timeout_s=10.0, memory_mb=1024, isolation="namespace"):
    """Run `code` as a whole Python program in a separate, limited process; see the module doc."""
    if timeout_s <= 0 or memory_mb <= 0:
        raise ValueError(f"timeout_s and memory_mb must be positive, got {timeout_s}, {memory_mb}")
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
    if isolation == "namespace" and sys.platform != "linux":
        raise SandboxUnavailable(_unavailable(f"namespaces are Linux only, this is {sys.platform}"))
    top = tempfile.mkdtemp(prefix="byz-sandbox-")
    try:
        # Namespace mode: the program's directory is top/work (/sandbox inside); top/root is
        # where the jail mounts its root.
        workdir = os.path.join(top, "work") if isolation == "namespace" else top
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        home = "/sandbox" if isolation == "namespace" else workdir
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home}
        limits = [memory_mb * 2**20, int(timeout_s) + 2, FILE_MB * 2**20, EXTRA_PROCS]
        # Output goes to anonymous files, not pipes: a forked child holding a pipe open would
        # keep a reader waiting past the program's end.
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            start = time.monotonic()
            run = _run_jailed if isolation == "namespace" else _run_process
            rc, timed_out = run(top, workdir, env, limits, timeout_s, out, err)
            seconds = time.monotonic() - start
            stdout, stderr = _tail(out), _tail(err)
    finally:
        _remove(top)
    return SandboxResult(_status(rc, timed_out, stderr), rc, stdout, stderr, seconds)


def _run_process(top, workdir, env, limits, timeout_s, out, err):
    argv = [sys.executable, "-I", "-B", "-c", _LAUNCHER, *map(str, limits), "main.py"]
    proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out,
                            stderr=err, start_new_session=True)
    try:
        proc.wait(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    _kill_group(proc.pid)  # also after a normal exit: no leftover children
    proc.wait()
    return (None if timed_out else proc.returncode), timed_out


def _run_jailed(top, workdir, env, limits, timeout_s, out, err):
    if os.geteuid() == 0:  # the program is nobody outside: give it its directory
        ids = (NOBODY, NOBODY)
        for path in (workdir, os.path.join(workdir, "main.py")):
            os.chown(path, *ids)
    else:
        ids = (os.geteuid(), os.getegid())
    os.mkdir(os.path.join(top, "root"))
    report, report_w = os.pipe()
    prefixes = sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})
    args = [report_w, *limits, *ids, timeout_s, os.path.join(top, "root"), workdir, *prefixes]
    try:
        try:
            # -S: the launcher needs no site-packages, and starts faster without them.
            proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", _JAIL, *map(str, args)], cwd="/", env=env,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
                                    pass_fds=(report_w,))
        finally:
            os.close(report_w)
        backstop = True
        try:
            proc.wait(timeout=timeout_s + SETUP_S)  # the jail enforces the timeout itself
            backstop = False
        except subprocess.TimeoutExpired:
            pass
        finally:  # (an interrupt too) the launchers; the program's PID namespace dies with them
            _kill_group(proc.pid)
            proc.wait()
        lines = _read_all(report).splitlines()
    finally:
        os.close(report)
    errors = [line[len("error "):] for line in lines if line.startswith("error ")]
    if errors:
        raise SandboxUnavailable(_unavailable("; ".join(errors)))
    statuses = [int(line.split()[1]) for line in lines if line.startswith("status ")]
    if "timeout" in lines or backstop:
        return None, True
    if not statuses:  # its PID 1 died first (the program can interrupt it; nothing else does)
        return -signal.SIGKILL, False
    return os.waitstatus_to_exitcode(statuses[-1]), False


def _unavailable(why):
    return (f"cannot isolate the generated code ({why}). Namespace isolation needs Linux with user "
            "namespaces allowed (sysctl user.max_user_namespaces > 0; where they exist, "
            "kernel.unprivileged_userns_clone = 1 and kernel.apparmor_restrict_unprivileged_userns = 0 "
            "for a non-root user) and no seccomp filter that blocks unshare/mount. "
            "isolation='process' runs it with resource limits only: it can then read your files, "
            "use the network and signal your processes")


def _read_all(fd):
    """What is in a pipe now, without waiting for writers that may still hold it."""
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


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
    except (OSError, RecursionError):  # a tree deeper than Python's recursion (process mode)
        subprocess.run(["rm", "-rf", "--", path], stdin=subprocess.DEVNULL, capture_output=True)
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
    return f"{prompt}{body}\n\n{test}\n\n{_GUARD}\ncheck(_byz_guard({entry_point}))\n"


# Wraps the candidate: a value whose type the program itself defined (in __main__; an __eq__ that
# is always true, say) is a failure, also inside lists, tuples, sets and dicts.
_GUARD = '''def _byz_guard(f):
    def own(v, depth=0):
        t = type(v)
        if t.__module__ == "__main__":
            return True
        if depth < 20 and t in (list, tuple, set, frozenset):
            return any(own(x, depth + 1) for x in v)
        if depth < 20 and t is dict:
            return any(own(x, depth + 1) for x in v) or any(own(x, depth + 1) for x in v.values())
        return False
    def run(*args, **kwargs):
        out = f(*args, **kwargs)
        if own(out):
            raise AssertionError("the solution returned a value of a type it defined itself")
        return out
    return run
'''


def _drop_main_block(code):
    """Remove every top-level `if __name__ == "__main__":` block, found on the syntax tree: a
    second block (say one that runs unittest.main()) would otherwise exit before check() runs.
    Code that does not parse is left as it is: it fails in the sandbox anyway."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code
    lines = code.splitlines()
    drop = set()
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_test(node.test):
            drop.update(range(node.lineno - 1, node.end_lineno))
    return "\n".join(line for i, line in enumerate(lines) if i not in drop)


def _is_main_test(test):
    """`__name__ == "__main__"`, either way round."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(consts) == 1


def check_humaneval(task, completion, timeout_s=10.0, memory_mb=1024, isolation="namespace"):
    """Run a HumanEval-format problem's tests on a completion. `task` is a Task (its metadata holds
    prompt, test and entry_point) or a dict with those fields."""
    fields = task if isinstance(task, dict) else task.metadata
    try:
        prompt, test, entry_point = fields["prompt"], fields["test"], fields["entry_point"]
    except KeyError as e:
        raise ValueError(f"not a HumanEval-format problem: no {e.args[0]!r} field") from None
    # "passed" needs the tests to have run to the end: after check() the harness prints a fresh
    # random marker; an exit 0 without it (SystemExit(0), os._exit(0), atexit, unittest.main())
    # is a failure.
    marker = f"byzantium-tests-done-{secrets.token_hex(16)}"
    program = humaneval_program(prompt, completion, test, entry_point)
    program += (f"import sys as _byz_sys\n_byz_sys.stdout.flush()\n"
                f"_byz_sys.stdout.write({marker!r} + '\\n')\n_byz_sys.stdout.flush()\n")
    result = run_code(program, timeout_s=timeout_s, memory_mb=memory_mb, isolation=isolation)
    if result.status == "passed" and marker not in result.stdout.splitlines()[-1:]:
        result.status = "failed"
        result.stderr += "\nbyzantium: the program exited 0 before the tests ran to the end\n"
    return result
