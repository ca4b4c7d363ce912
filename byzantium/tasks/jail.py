"""Launcher that runs one program in fresh Linux namespaces; sandbox.run_code starts it as
`python -I -S -B jail.py REPORT_FD MEM CPU FSIZE PROCS UID GID TIMEOUT SECCOMP CGROUP ROOT WORK PREFIX...`
(stdlib only, never imported by the package; no json or signal: their imports would double the
launcher's start-up time, and run_code pays it on every call).

SECCOMP: "require" (no filter: nothing runs), "try" (the caller accepts running without one) or
"off"; CGROUP: the cgroup.procs files of the sandbox's cgroups (memory, and cpu where it is a
hierarchy of its own), one a line, which L joins first so that every process below counts against
their one limit, or "-".

Process tree: run_code -> L (this script, host namespaces) -> C (new user, mount, network, IPC,
UTS and cgroup namespaces; it supervises the timeout) -> I (PID 1 of a new PID namespace; it
builds the root) -> P (the program).

* User namespace: its root maps to the unprivileged outside ids run_code chose, nobody when the
  caller is root (L writes the map from outside, which only root may do), else the caller's own. P drops
  every capability before exec, so inside it is a root without powers, and outside it is nobody.
* Mount namespace: a tmpfs root (read-only once built) holding read-only binds of the Python
  installation and the shared libraries, a few devices, a /proc of the new PID namespace, and the
  work directory (read-write) at /sandbox; /tmp is a private tmpfs. Nothing else of the host is there.
  Bind sources are opened (O_PATH) before the ids change, as the outside root may own their
  parent directories (a Python under /root), and mounted through /proc/self/fd.
* Network namespace: only a loopback that is down, so every connect fails at once.
* PID namespace: P sees no other process and can signal none; when I exits (P ended, or C killed I
  at the timeout) the kernel kills everything left in the namespace, setsid() or not.

Report (one line each on the report fd, read by run_code): "error <why>" when the namespaces
could not be set up (nothing ran), "status <wait status>" from I, "timeout" from C, "missing
seccomp" from P when the filter could not be set and SECCOMP was "try".
"""

import ctypes
import os
import resource
import select
import sys

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x2000000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_PRIVATE, MS_REC = 1, 2, 4, 8, 32, 4096, 1 << 18, 1 << 14
MS_KEEP = 1 | 2 | 4 | 8 | 1024 | 2048 | 4096  # flags a remount must repeat (statvfs reports them in the same bits)
MNT_DETACH = 2
SIGKILL = 9
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 22, 24, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41}
DEVICES = ("null", "zero", "full", "random", "urandom")

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def layout():
    """What the sandbox sees of the host, read-only: the Python installation (the caller's prefixes:
    a venv and the interpreter it points to; without `site` this process does not know the venv)
    and the shared libraries; the /lib* symlinks of a merged /usr."""
    ro, links = [], []
    for path in (*prefixes, "/lib", "/lib64", "/lib32", "/libx32", "/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/libx32"):
        if os.path.islink(path):
            links.append((path, os.readlink(path)))
        elif os.path.isdir(path) and path != "/" and path not in ro:
            ro.append(path)
    def inside(p, q):
        return p != q and p.startswith(q.rstrip("/") + "/")
    return [p for p in ro if not any(inside(p, q) for q in ro)], links


def say(line):
    os.write(report, (line + "\n").encode())


def check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(src, target, fstype, flags, data=None):
    def enc(s):
        return None if s is None else str(s).encode()
    check(libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def prctl(option, arg):
    check(libc.prctl(option, arg, 0, 0, 0), f"prctl {option}")


def die_with_parent(parent=None):
    prctl(PR_SET_PDEATHSIG, SIGKILL)
    if parent is not None and os.getppid() != parent:  # it died before the line above
        os._exit(1)


def guarded(stage, fn, *args):
    """Run a setup stage; a failure is reported as the reason the sandbox is unavailable."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - any failure here means: no sandbox
        say(f"error {stage}: {e}")
        os._exit(1)


# ------------------------------------------------------------------------------------------- L

def launcher():
    if cgroup != "-":
        guarded("cgroup", join_cgroup)
    if os.uname().machine not in SYS_PIVOT_ROOT:
        raise OSError(f"no pivot_root syscall number known for {os.uname().machine}")
    l_read, c_write = os.pipe()
    c_read, l_write = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(l_read), os.close(l_write)
        guarded("namespaces", supervisor, parent, c_write, c_read)
    os.close(c_write), os.close(c_read)
    if os.read(l_read, 1) == b"1":  # C is in its new user namespace: give it its ids
        guarded("id map", write_maps, pid)
        os.write(l_write, b"1")
    os.waitpid(pid, 0)


def join_cgroup():
    for procs in cgroup.split("\n"):
        with open(procs, "w") as f:
            f.write(str(os.getpid()))


def write_maps(pid):
    if os.geteuid() != 0:  # one's own ids are all an unprivileged user may map, with setgroups off
        with open(f"/proc/{pid}/setgroups", "w") as f:
            f.write("deny")
    for name, outside in (("uid_map", uid), ("gid_map", gid)):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(f"0 {outside} 1")


# ------------------------------------------------------------------------------------------- C

def supervisor(parent, to_l, from_l):  # pipe ends: to L, from L
    die_with_parent(parent)
    if os.geteuid() == 0:
        os.setgroups([])  # root's supplementary groups would follow it into the sandbox
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP | CLONE_NEWPID
    check(libc.unshare(flags), "unshare")
    os.write(to_l, b"1")
    if os.read(from_l, 1) != b"1":
        os._exit(1)  # L reported why
    pid = os.fork()
    if pid == 0:
        guarded("root", init)
    # Wait for I, killing it (and with it the whole PID namespace) at the timeout.
    fd = os.pidfd_open(pid)
    if not select.select([fd], [], [], timeout)[0]:
        os.kill(pid, SIGKILL)
        say("timeout")
    os.waitpid(pid, 0)  # returns once every process of the namespace is gone
    os._exit(0)


# ------------------------------------------------------------------------------------------- I

def init():
    die_with_parent()  # (its parent is outside this PID namespace: getppid() says 0)
    # Sources first, while this process still has the outside ids of the caller.
    ro, links = layout()
    devices = [f"/dev/{name}" for name in DEVICES]
    sources = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path in ro + devices}
    code = os.open(os.path.join(work, "main.py"), os.O_RDONLY | os.O_CLOEXEC)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,uid=0,gid=0,size=1m")
    os.chdir(root)
    os.setresgid(0, 0, 0)  # the mapped ids: files can be made in the tmpfs now
    os.setresuid(0, 0, 0)
    prctl(PR_SET_DUMPABLE, 0)  # it keeps its capabilities: the program must not ptrace it

    def bind(path, target, flags):
        mount(f"/proc/self/fd/{sources[path]}", target, None, MS_BIND)
        if flags is not None:
            keep = os.statvfs(target).f_flag & MS_KEEP  # locked flags (atime, ...) must be repeated
            mount(None, target, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | keep | flags)

    # /tmp: a private scratch, gone with the jail (first: a Python installed under /tmp is mounted in it).
    os.mkdir("tmp")
    mount("tmpfs", "tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={fsize}")
    for path in ro:
        os.makedirs("." + path, exist_ok=True)
        bind(path, "." + path, MS_RDONLY)
    for path, target in links:
        os.makedirs(os.path.dirname("." + path), exist_ok=True)
        os.symlink(target, "." + path)
    os.makedirs("dev/shm")
    for path in devices:
        open("." + path, "w").close()
        bind(path, "." + path, None)  # devices stay usable: a read-only mount would not stop writes anyway
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{fd}", f"dev/{name}")
    os.symlink("/proc/self/fd", "dev/fd")
    mount("tmpfs", "dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={fsize}")
    # /sandbox: a size-limited tmpfs holding a copy of main.py, not the host's directory: what the
    # program writes there counts against its size (4 files of the largest size), and vanishes with the jail (nothing to clean).
    os.mkdir("sandbox")
    mount("tmpfs", "sandbox", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=0755,uid=0,gid=0,size={4 * fsize}")
    with os.fdopen(code, "rb") as src, open("sandbox/main.py", "wb") as dst:
        dst.write(src.read())
    os.mkdir("proc")
    # A /proc of this PID namespace: its processes only, and where the kernel can (5.8+) not even
    # PID 1's command line (host paths) nor the system-wide files.
    for options in ("subset=pid,hidepid=invisible", None):
        try:
            mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, options)
            break
        except OSError:
            pass  # none at all is stricter still
    for fd in sources.values():
        os.close(fd)
    try:  # no user namespaces of its own, the one thing it could still make without capabilities
        with open("/proc/sys/user/max_user_namespaces", "w") as f:
            f.write("0")
    except OSError:
        pass  # a read-only /proc/sys: one layer less
    check(libc.sethostname(b"sandbox", 7), "sethostname")
    check(libc.syscall(ctypes.c_long(SYS_PIVOT_ROOT[os.uname().machine]), b".", b"."), "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "umount old root")  # the host's tree is gone from here
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir("/sandbox")

    pid = os.fork()
    if pid == 0:
        guarded("program", program)
    while True:  # PID 1 reaps orphans until the program ends; its exit then kills the rest
        done, status = os.waitpid(-1, 0)
        if done == pid:
            say(f"status {status}")
            os._exit(0)


# ------------------------------------------------------------------------------------- seccomp

# A deny-list filter, installed by P just before exec (no_new_privs is set): the calls a HumanEval
# program never needs and that reach the kernel past the namespaces. Denied calls fail with EPERM.
#   keyring: keyctl add_key request_key (the keyring is not namespaced; sandboxes would share keys)
#   io_uring_*, userfaultfd, bpf, perf_event_open, ptrace, process_vm_*: large kernel surfaces
#   mount, umount2, pivot_root, the new mount API, unshare, setns: no new mounts or namespaces
#   inotify, fanotify, flock, fcntl record locks: no watching or blocking the host's files
#   socket/socketpair: AF_UNIX only (no vsock, netlink, packet, ... which no netns confines)
#   kexec_load, init_module, finit_module
# Another architecture's calls (x32 on x86_64 included) kill the process: their numbers differ.
SECCOMP = {
    "x86_64": dict(arch=0xC000003E, socket=41, socketpair=53, fcntl=72, keyctl=250, deny=(
        250, 248, 249, 425, 426, 427, 323, 321, 298, 101, 310, 311, 165, 166, 155, 428, 429, 430,
        431, 432, 433, 442, 272, 308, 253, 294, 254, 300, 73, 246, 175, 313)),
    "aarch64": dict(arch=0xC00000B7, socket=198, socketpair=199, fcntl=25, keyctl=219, deny=(
        219, 217, 218, 425, 426, 427, 282, 280, 241, 117, 270, 271, 40, 39, 41, 428, 429, 430,
        431, 432, 433, 442, 97, 268, 26, 27, 262, 32, 104, 105, 273)),
}
AF_UNIX = 1
LOCKS = (6, 7, 37, 38)  # F_SETLK F_SETLKW F_OFD_SETLK F_OFD_SETLKW
RET_ALLOW, RET_EPERM, RET_KILL = 0x7FFF0000, 0x00050001, 0x80000000
LD, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
NR, ARCH, ARG0, ARG1 = 0, 4, 16, 24  # offsets in struct seccomp_data (low word of each argument)


def seccomp_program(machine):
    """The filter as (code, jt, jf, k) tuples, jumps resolved; see SECCOMP."""
    t = SECCOMP[machine]
    prog = [(LD, 0, 0, ARCH), (JEQ, 1, 0, t["arch"]), (RET, 0, 0, RET_KILL), (LD, 0, 0, NR)]
    if machine == "x86_64":
        prog.append((JGE, "deny", 0, 0x40000000))  # x32 numbers
    prog += [(JEQ, "deny", 0, nr) for nr in t["deny"]]
    prog += [(JEQ, "socket", 0, t["socket"]), (JEQ, "socket", 0, t["socketpair"]),
             (JEQ, "fcntl", 0, t["fcntl"]), (RET, 0, 0, RET_ALLOW),
             ("socket",), (LD, 0, 0, ARG0), (JEQ, "allow", "deny", AF_UNIX),
             ("fcntl",), (LD, 0, 0, ARG1), *[(JEQ, "deny", 0, cmd) for cmd in LOCKS],
             ("allow",), (RET, 0, 0, RET_ALLOW), ("deny",), (RET, 0, 0, RET_EPERM)]
    labels, out = {}, []
    for insn in prog:
        if len(insn) == 1:
            labels[insn[0]] = len(out)
        else:
            out.append(insn)
    def jump(i, j):
        return labels[j] - i - 1 if isinstance(j, str) else j
    return [(c, jump(i, jt), jump(i, jf), k) for i, (c, jt, jf, k) in enumerate(out)]


def seccomp():
    machine = os.uname().machine
    if machine not in SECCOMP:
        raise OSError(f"no seccomp filter for {machine}")

    class Insn(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]

    insns = seccomp_program(machine)
    arr = (Insn * len(insns))(*[Insn(*i) for i in insns])
    prog = Prog(len(insns), arr)
    prctl_filter = ctypes.CDLL(None, use_errno=True).prctl
    prctl_filter.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    check(prctl_filter(PR_SET_SECCOMP, 2, ctypes.byref(prog), 0, 0), "seccomp filter")  # SECCOMP_MODE_FILTER


# ------------------------------------------------------------------------------------------- P

def program():
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
    # Counted per outside uid in this user namespace: I, this process and what it starts, and C
    # when it has the same uid (a caller that is not root).
    lim(resource.RLIMIT_NPROC, procs + (3 if uid == caller_uid else 2))
    # No capabilities survive the exec (root's come from the bounding set), none can be gained.
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # fails past the last cap: fine
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    # A fresh, empty session keyring: the caller's keys are not in reach even where keyctl is allowed.
    libc.syscall(ctypes.c_long(SECCOMP.get(os.uname().machine, {}).get("keyctl", -1)), 1, None)  # JOIN_SESSION_KEYRING
    if seccomp_mode != "off":
        try:
            seccomp()
        except OSError as e:
            if seccomp_mode == "require":
                say(f"error seccomp: {e} (allow_missing=('seccomp',) runs the program without the filter)")
                os._exit(1)
            say("missing seccomp")
    os.execv(sys.executable, [sys.executable, "-I", "-B", "main.py"])


if __name__ == "__main__":  # the arguments: globals of every stage above
    report, mem, cpu, fsize, procs, uid, gid = map(int, sys.argv[1:8])
    timeout, seccomp_mode, cgroup = float(sys.argv[8]), sys.argv[9], sys.argv[10]
    (root, work), prefixes = sys.argv[11:13], sys.argv[13:]
    caller_uid = os.geteuid()
    os.set_inheritable(report, False)  # the program must not hold it
    guarded("launcher", launcher)
