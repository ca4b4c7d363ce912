"""Run generated Python code outside the caller's process, isolated from the machine.

    run_code(code, timeout_s=10.0, memory_mb=1024, isolation="namespace", allow_missing=()) -> SandboxResult
    check_sandbox(allow_missing=())                           raises SandboxUnavailable when it cannot run here
    SandboxJob(code, ..., pass_fds=())                        one program started; .wait() -> SandboxResult

humaneval.py checks a HumanEval-format solution with its tests in two of these sandboxes.

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
it holds, all processes, tmpfs files and memfds together, to memory_mb; where the kernel lets
this user use the cpu controller, the same cgroup gives them all together at most CPUS CPUs (a
program that forks spinning children slows only itself; elsewhere each process has its CPU-seconds
limit only). At the timeout, and when it ends, every process it started dies with its PID
namespace, setsid() or not.
Where a protection cannot be set up, run_code raises SandboxUnavailable naming it, and never falls
back on its own: namespaces (user namespaces disabled, not Linux: isolation="process" is the
caller's explicit choice), "seccomp" (no filter for this architecture or kernel) and
"memory_cgroup" (no cgroup this user may make: each process is then bounded by memory_mb, with at
most EXTRA_PROCS of them) may be accepted by name with allow_missing; the result's `missing` says
which were.

isolation="process": only the limits above, in a new session whose process group is killed at the
end. This is containment, not a jail: the program can read and write anything its user may, use
the network, see and signal other processes; use it only where the code is trusted.

Status rule (humaneval.check_humaneval's verdict is its tests' process's, see there):
    "passed"   exit status 0
    "timeout"  wall-clock timeout, or killed by SIGXCPU (the CPU limit is a timeout too)
    "crashed"  killed by any other signal (SIGKILL, SIGSEGV, ...), a process killed at the memory
               bound, or it exited non-zero with a final exception line that is a resource limit:
               MemoryError, "[Errno 12] Cannot allocate memory", "[Errno 27] File too large",
               "[Errno 28] No space left on device", or a fatal interpreter error
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

from .cgroup import CgroupUnavailable, MemoryCgroup

TAIL_CHARS = 4000
FILE_MB = 64  # largest file the program may write (stdout and stderr included)
EXTRA_PROCS = 64  # new processes the program may start (process mode: beyond what its user runs)
ISOLATIONS = ("namespace", "process")
PROTECTIONS = ("seccomp", "memory_cgroup")  # what a caller may let a namespace sandbox run without
SECCOMP_FILTER = True  # tests turn it off to probe the layer beneath it
NOBODY = 65534  # the outside uid and gid of a program a root caller runs in namespaces
CPUS = 1.0  # CPUs all the processes of one namespace sandbox share, where the cpu controller is ours to use
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
    return SandboxJob(code, timeout_s, memory_mb, isolation, allow_missing).wait()


def check_sandbox(allow_missing=()):
    """Raise SandboxUnavailable, saying what is missing, when generated code cannot run here with
    every protection but those in `allow_missing`; otherwise the protections it would run without."""
    result = run_code("pass", timeout_s=10.0, memory_mb=256, allow_missing=allow_missing)
    if not result.passed:
        raise SandboxUnavailable(f"the sandbox did not run a program that does nothing: {result.stderr[-500:]}")
    return result.missing


class SandboxJob:
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
        self.cpu_bound = False
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
            group = MemoryCgroup.create(memory_mb * 2**20)
            self.cpu_bound = group.bound_cpu(CPUS)
            return group
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
        cgroup = "\n".join(self.cgroup.procs_files) if self.cgroup else "-"
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
