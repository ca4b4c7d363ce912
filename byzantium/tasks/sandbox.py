"""Run generated Python code outside the caller's process, isolated from the machine.

    run_code(code, timeout_s=10.0, memory_mb=1024, isolation="namespace", allow_missing=()) -> SandboxResult
    check_humaneval(task, completion, ...) -> SandboxResult   the solution and its tests, in two sandboxes
    check_sandbox(allow_missing=())                           raises SandboxUnavailable when it cannot run here
    extract_code(text, entry_point=None) / solution_program(...)   how the solution's program is built

The program runs as `python -I -B main.py` in a fresh temporary directory (its cwd; HOME and
TMPDIR point into it; removed afterwards) with an environment built from scratch (PATH, LANG,
HOME, TMPDIR: nothing of the caller's, so no secrets) and stdin from /dev/null. Limits: address
space (memory_mb) per process, CPU seconds (a little over the timeout), file size, core dumps off,
and a cap on new processes. A launcher sets them and then execs the program: `preexec_fn` is not
safe in a process with threads (the async engine has some).

isolation="namespace" (the default; Linux): the launcher (jail.py) runs the program in new user,
mount, network, PID, IPC, UTS and cgroup namespaces. It sees a read-only Python installation and
shared libraries, a few devices, its own /proc, its work directory at /sandbox (a size-limited
tmpfs) and a private /tmp, and nothing else of the files; it has no network; it sees and can signal
no other process; outside it is nobody (the caller's own uid for a non-root caller), inside a root
without capabilities, with a fresh session keyring. A seccomp filter (jail.py, SECCOMP) set just
before the exec denies what the namespaces do not confine: the kernel keyring, sockets other than
AF_UNIX (vsock, netlink, ...), io_uring, userfaultfd, bpf, perf_event_open, ptrace, mounts and new
namespaces, inotify/fanotify, file locks. A memory cgroup of its own (cgroup.py) bounds everything
it holds, all processes, tmpfs files and memfds together, to memory_mb. At the timeout, and when
it ends, every process it started dies with its PID namespace, setsid() or not.
Where a protection cannot be set up, run_code raises SandboxUnavailable naming it, and never falls
back on its own: namespaces (user namespaces disabled, not Linux: isolation="process" is the
caller's explicit choice), "seccomp" (no filter for this architecture or kernel) and
"memory_cgroup" (no cgroup this user may make: each process is then bounded by memory_mb, with at
most EXTRA_PROCS of them) may be accepted by name with allow_missing; the result's `missing` says
which were.

isolation="process": only the limits above, in a new session whose process group is killed at the
end. This is containment, not a jail: the program can read and write anything its user may, use
the network, see and signal other processes; use it only where the code is trusted.

Status rule (check_humaneval's verdict is its tests' process's, see there):
    "passed"   exit status 0
    "timeout"  wall-clock timeout, or killed by SIGXCPU (the CPU limit is a timeout too)
    "crashed"  killed by any other signal (SIGKILL, SIGSEGV, ...), a process killed at the memory
               bound, or it exited non-zero with a final exception line that is a resource limit:
               MemoryError, "[Errno 12] Cannot allocate memory", "[Errno 27] File too large",
               "[Errno 28] No space left on device", or a fatal interpreter error
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

from .cgroup import CgroupUnavailable, MemoryCgroup

TAIL_CHARS = 4000
FILE_MB = 64  # largest file the program may write (stdout and stderr included)
EXTRA_PROCS = 64  # new processes the program may start (process mode: beyond what its user runs)
ISOLATIONS = ("namespace", "process")
PROTECTIONS = ("seccomp", "memory_cgroup")  # what a caller may let a namespace sandbox run without
SECCOMP_FILTER = True  # tests turn it off to probe the layer beneath it
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
    missing: tuple = ()  # protections the caller let it run without (see PROTECTIONS)
    oom_kills: int = 0  # processes the kernel killed at the sandbox's memory bound

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def run_code(code, timeout_s=10.0, memory_mb=1024, isolation="namespace", allow_missing=()):
    """Run `code` as a whole Python program in a separate, limited process; see the module doc."""
    return _Job(code, timeout_s, memory_mb, isolation, allow_missing).wait()


def check_sandbox(allow_missing=()):
    """Raise SandboxUnavailable, saying what is missing, when generated code cannot run here with
    every protection but those in `allow_missing`; otherwise the protections it would run without."""
    result = run_code("pass", timeout_s=10.0, memory_mb=256, allow_missing=allow_missing)
    if not result.passed:
        raise SandboxUnavailable(f"the sandbox did not run a program that does nothing: {result.stderr[-500:]}")
    return result.missing


class _Job:
    """One program started in the sandbox; wait() collects its result and cleans up. `pass_fds`
    are descriptors the program inherits (check_humaneval's pipes)."""

    def __init__(self, code, timeout_s, memory_mb, isolation, allow_missing, pass_fds=()):
        if timeout_s <= 0 or memory_mb <= 0:
            raise ValueError(f"timeout_s and memory_mb must be positive, got {timeout_s}, {memory_mb}")
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
        unknown = set(allow_missing) - set(PROTECTIONS)
        if unknown:
            raise ValueError(f"allow_missing names unknown protections {sorted(unknown)}; known: {PROTECTIONS}")
        if isolation == "namespace" and sys.platform != "linux":
            raise SandboxUnavailable(_unavailable(f"namespaces are Linux only, this is {sys.platform}"))
        self.timeout_s, self.isolation, self.missing, self.cgroup = timeout_s, isolation, [], None
        self.top = tempfile.mkdtemp(prefix="byz-sandbox-")
        self.out, self.err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        try:
            if isolation == "namespace":
                self.cgroup = self._memory_cgroup(memory_mb, allow_missing)
            self._start(code, memory_mb, allow_missing, pass_fds)
        except BaseException:
            self._clean()
            raise

    def _memory_cgroup(self, memory_mb, allow_missing):
        try:
            return MemoryCgroup.create(memory_mb * 2**20)
        except CgroupUnavailable as e:
            if "memory_cgroup" not in allow_missing:
                raise SandboxUnavailable(
                    f"no memory bound for the whole sandbox: {e}. Run as root, or where the cgroup memory "
                    "controller is delegated to you; or pass allow_missing=('memory_cgroup',) to run with "
                    f"memory_mb bounding each process only (at most {EXTRA_PROCS} processes)") from None
            self.missing.append("memory_cgroup")
            return None

    def _start(self, code, memory_mb, allow_missing, pass_fds):
        # Namespace mode: the program's file is in top/work (copied into /sandbox inside); top/root
        # is where the jail mounts its root.
        workdir = os.path.join(self.top, "work") if self.isolation == "namespace" else self.top
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        home = "/sandbox" if self.isolation == "namespace" else workdir
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home}
        limits = [memory_mb * 2**20, int(self.timeout_s) + 2, FILE_MB * 2**20, EXTRA_PROCS]
        self.report = None
        self.start = time.monotonic()
        # Output goes to anonymous files, not pipes: a forked child holding a pipe open would keep a
        # reader waiting past the program's end.
        if self.isolation == "process":
            argv = [sys.executable, "-I", "-B", "-c", _LAUNCHER, *map(str, limits), "main.py"]
            self.proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=self.out,
                                         stderr=self.err, start_new_session=True, pass_fds=pass_fds)
            return
        if os.geteuid() == 0:  # the program is nobody outside: give it its directory
            ids = (NOBODY, NOBODY)
            for path in (workdir, os.path.join(workdir, "main.py")):
                os.chown(path, *ids)
        else:
            ids = (os.geteuid(), os.getegid())
        os.mkdir(os.path.join(self.top, "root"))
        self.report, report_w = os.pipe()
        prefixes = sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})
        seccomp = "try" if "seccomp" in allow_missing else ("require" if SECCOMP_FILTER else "off")
        cgroup = self.cgroup.procs if self.cgroup else "-"
        args = [report_w, *limits, *ids, self.timeout_s, seccomp, cgroup, os.path.join(self.top, "root"), workdir,
                *prefixes]
        try:
            # -S: the launcher needs no site-packages, and starts faster without them.
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", _JAIL, *map(str, args)], cwd="/", env=env,
                                         stdin=subprocess.DEVNULL, stdout=self.out, stderr=self.err,
                                         start_new_session=True, pass_fds=(report_w, *pass_fds))
        finally:
            os.close(report_w)

    def stop(self):
        """End the program now (check_humaneval: the solution, once the tests are done)."""
        _kill_group(self.proc.pid)

    def wait(self):
        try:
            rc, timed_out, stopped = self._wait()
            seconds = time.monotonic() - self.start
            oom = self.cgroup.oom_kills() if self.cgroup else 0
            stdout, stderr = _tail(self.out), _tail(self.err)
        finally:
            self._clean()
        status = "stopped" if stopped else _status(rc, timed_out, stderr, oom)
        return SandboxResult(status, rc, stdout, stderr, seconds, tuple(self.missing), oom)

    def _wait(self):
        """(exit code, timed out, stopped from outside before it ended)."""
        if self.isolation == "process":
            try:
                self.proc.wait(timeout=max(0.0, self.start + self.timeout_s - time.monotonic()))
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_group(self.proc.pid)  # also after a normal exit: no leftover children
            self.proc.wait()
            return (None if timed_out else self.proc.returncode), timed_out, False
        backstop = True
        try:
            # The jail enforces the timeout itself; this one catches a jail that does not end.
            self.proc.wait(timeout=max(0.0, self.start + self.timeout_s + SETUP_S - time.monotonic()))
            backstop = False
        except subprocess.TimeoutExpired:
            pass
        finally:  # (an interrupt too) the launchers; the program's PID namespace dies with them
            _kill_group(self.proc.pid)
            self.proc.wait()
        lines = _read_all(self.report).splitlines()
        errors = [line[len("error "):] for line in lines if line.startswith("error ")]
        if errors:
            raise SandboxUnavailable(_unavailable("; ".join(errors)))
        if "missing seccomp" in lines:
            self.missing.append("seccomp")
        statuses = [int(line.split()[1]) for line in lines if line.startswith("status ")]
        if "timeout" in lines or backstop:
            return None, True, False
        if not statuses:  # killed by stop(), or its PID 1 died first (the program can interrupt it)
            return -signal.SIGKILL, False, self.proc.returncode == -signal.SIGKILL
        return os.waitstatus_to_exitcode(statuses[-1]), False, False

    def _clean(self):
        for f in (self.out, self.err):
            f.close()
        if getattr(self, "report", None) is not None:
            os.close(self.report)
            self.report = None
        if self.cgroup is not None:
            self.cgroup.remove()
        _remove(self.top)


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


def _status(rc, timed_out, stderr, oom_kills=0):
    if timed_out or rc == -signal.SIGXCPU:
        return "timeout"
    if oom_kills or rc < 0:
        return "crashed"
    if rc == 0:
        return "passed"
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


def solution_program(prompt, completion, entry_point):
    """The solution's half of a check, as the HumanEval harness builds it: prompt + completion. A
    completion that (re)defines the function follows the prompt whole (the prompt's imports and
    helpers stay; its docstring-only function is replaced); a bare body continues the prompt,
    indented when the model wrote it flush left. Every `__main__` block is removed."""
    code = _drop_main_block(extract_code(completion, entry_point))
    if _defines(code, entry_point):
        body = "\n" + code
    else:
        lines = code.strip("\n").splitlines()
        if lines and not any(line[:1].isspace() for line in lines if line.strip()):
            lines = ["    " + line if line.strip() else line for line in lines]
        body = "\n".join(lines)
    return f"{prompt}{body}\n"


_CODEC = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "plain_data.py"), encoding="utf-8").read()

# The solution's process, after its code: answer each call of the tests with the returned value as
# plain data, or the name and message of what it raised. Its own names stay out of the solution's.
_SERVE = """
_byz_codec = {{}}
exec({codec!r}, _byz_codec)


def _byz_serve(name, calls, replies):
    import json, os
    f = globals()[name]
    recv, send = os.fdopen(calls, "rb"), os.fdopen(replies, "wb")
    for line in recv:
        args, kwargs = _byz_codec["unpack"](json.loads(line))
        try:
            reply = ["value", _byz_codec["pack"](f(*args, **kwargs))]
        except Exception as e:
            reply = ["raise", type(e).__name__, str(e)[:2000]]
        send.write(json.dumps(reply).encode() + b"\\n")
        send.flush()


_byz_serve({name!r}, {calls}, {replies})
"""

# The tests' process: the problem's prompt (its helpers) and tests, with the function they check
# standing in for the solution's: each call goes over the pipe, and only plain data comes back.
_CALL = """
_byz_codec = {{}}
exec({codec!r}, _byz_codec)


def _byz_candidate(calls, replies):
    import builtins, json, os
    send, recv = os.fdopen(calls, "wb"), os.fdopen(replies, "rb")

    def candidate(*args, **kwargs):
        send.write(json.dumps(_byz_codec["pack"]([list(args), kwargs])).encode() + b"\\n")
        send.flush()
        line = recv.readline()
        if not line:
            raise RuntimeError("the solution's process ended before it answered (its stderr follows)")
        reply = json.loads(line)
        if reply[:1] == ["value"] and len(reply) == 2:
            return _byz_codec["unpack"](reply[1])
        if reply[:1] == ["raise"] and len(reply) == 3 and all(type(x) is str for x in reply[1:]):
            cls = getattr(builtins, reply[1], None)
            if isinstance(cls, type) and issubclass(cls, Exception):
                raise cls(reply[2])
            raise RuntimeError(f"the solution raised {{reply[1]}}: {{reply[2]}}")
        raise ValueError("the solution's process sent something that is not a reply")
    return candidate


{name} = _byz_candidate({calls}, {replies})
check({name})
import sys as _byz_sys
_byz_sys.stdout.flush()
_byz_sys.stdout.write({marker!r} + "\\n")
_byz_sys.stdout.flush()
"""


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


def check_humaneval(task, completion, timeout_s=10.0, memory_mb=1024, isolation="namespace", allow_missing=()):
    """Run a HumanEval-format problem's tests on a completion. `task` is a Task (its metadata holds
    prompt, test and entry_point) or a dict with those fields.

    Two sandboxes joined by two pipes: the solution's process runs prompt + completion and answers
    calls; the tests' process runs the prompt, the tests and check() on a function that calls the
    solution over the pipe. The tests are never in the solution's reach (not in its files, its memory
    or its process tree), only plain data comes back (plain_data.py: no object of the solution's,
    no type it defined), and the verdict is the tests' process's: "passed" only when check() ran to
    the end and the tests' process then printed a fresh random marker as its last line. Status and
    return code are the tests' process's ("crashed" also when the solution's process died of a
    resource limit or signal first); stdout is the solution's; stderr the tests', then the solution's.
    """
    fields = task if isinstance(task, dict) else task.metadata
    try:
        prompt, test, entry_point = fields["prompt"], fields["test"], fields["entry_point"]
    except KeyError as e:
        raise ValueError(f"not a HumanEval-format problem: no {e.args[0]!r} field") from None
    if not str(entry_point).isidentifier():
        raise ValueError(f"entry_point must be a Python name, got {entry_point!r}")
    marker = f"byzantium-tests-done-{secrets.token_hex(16)}"
    calls_r, calls_w = os.pipe()
    replies_r, replies_w = os.pipe()
    solution = solution_program(prompt, completion, entry_point) + _SERVE.format(
        codec=_CODEC, name=entry_point, calls=calls_r, replies=replies_w)
    tests = f"{prompt}\n\n{test}\n" + _CALL.format(codec=_CODEC, name=entry_point, calls=calls_w,
                                                    replies=replies_r, marker=marker)
    jobs = []
    try:
        jobs.append(_Job(solution, timeout_s, memory_mb, isolation, allow_missing, pass_fds=(calls_r, replies_w)))
        jobs.append(_Job(tests, timeout_s, memory_mb, isolation, allow_missing, pass_fds=(calls_w, replies_r)))
    except BaseException:
        for job in jobs:
            job.stop()
            job.wait()
        raise
    finally:
        for fd in (calls_r, calls_w, replies_r, replies_w):
            os.close(fd)
    server, checker = jobs
    try:
        result = checker.wait()
    finally:
        server.stop()
        served = server.wait()
    if result.status == "passed" and marker not in result.stdout.splitlines()[-1:]:
        result.status = "failed"
        result.stderr += "\nbyzantium: the tests' process exited 0 before the tests ran to the end\n"
    if result.status == "failed" and served.status == "crashed":
        result.status = "crashed"
    result.stdout = served.stdout
    if served.stderr:
        result.stderr = f"{result.stderr}\n--- the solution's stderr ---\n{served.stderr}"[-TAIL_CHARS:]
    result.missing = tuple(dict.fromkeys(result.missing + served.missing))
    result.oom_kills += served.oom_kills
    return result
