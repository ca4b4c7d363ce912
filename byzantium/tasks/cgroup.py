"""One memory bound for a whole sandbox, and a CPU bound where the kernel allows: cgroups of its own,
below the caller's.

    group = MemoryCgroup.create(limit_bytes)   # raises CgroupUnavailable, saying why
    group.bound_cpu(cpus)                      # True when its processes together get at most `cpus` CPUs
    group.procs_files                          # the files a process writes its pid to, to join
    group.oom_kills()                          # processes the kernel killed for the bound
    group.remove()

Every process of the sandbox counts against the one limit: its memory, what it wrote to tmpfs
(/sandbox, /tmp, memfds) and the kernel memory charged to it; swap is bounded to the same total. The
group is made where the kernel lets this user make one: under the caller's own memory cgroup, in the
v1 memory hierarchy or in cgroup v2 when the memory controller is delegated there (root can; a
user with a systemd-delegated slice can). Names carry the creating pid, so a group left by a killed
process is removed by the next one that finds it.

The CPU bound is the cpu controller's quota (cpu.max in v2, in the same group; cpu.cfs_quota_us in a
group of the v1 cpu hierarchy): however many processes a program starts, together they run on at
most `cpus` CPUs, so a program that forks spinning children cannot starve a sandbox beside it.
"""
import os
import secrets
import time

PREFIX = "byz-sandbox-"


class CgroupUnavailable(RuntimeError):
    """No memory cgroup can be made here; the message says why."""


def _mounts():
    """(fstype, mount point, root in its hierarchy, super options) of the cgroup mounts."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            fields, (fstype, _src, options) = left.split(), right.split()[:3]
            if fstype in ("cgroup", "cgroup2"):
                found.append((fstype, fields[4], fields[3], set(options.split(","))))
    return found


def _own(controller):
    """This process's cgroup path in the v1 hierarchy of `controller` ("" for v2)."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _id, controllers, path = line.rstrip("\n").split(":", 2)
            if controller in controllers.split(",") or (controller == "" and controllers == ""):
                return path
    return None


def _join(mount_point, root, path):
    rel = path[len(root):] if root != "/" and path.startswith(root) else path
    return os.path.join(mount_point, rel.lstrip("/"))


def _parent(controller="memory"):
    """(version, directory) under which a child group with a limit of `controller` can be made."""
    mounts = _mounts()
    v1 = [(m, r) for fs, m, r, opts in mounts if fs == "cgroup" and controller in opts]
    own = _own(controller)
    if v1 and own is not None:
        return 1, _join(*v1[0], own)
    v2 = [(m, r) for fs, m, r, _ in mounts if fs == "cgroup2"]
    own = _own("")
    if not v2 or own is None:
        raise CgroupUnavailable(f"no cgroup {controller} controller is mounted")
    base = _join(*v2[0], own)
    try:
        with open(os.path.join(base, "cgroup.subtree_control")) as f:
            delegated = controller in f.read().split()
        if not delegated:  # root may turn it on where the group has no processes of its own
            with open(os.path.join(base, "cgroup.subtree_control"), "w") as f:
                f.write(f"+{controller}")
    except OSError as e:
        raise CgroupUnavailable(f"the {controller} controller is not delegated to {base} ({e.strerror})") from None
    return 2, base


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class MemoryCgroup:
    def __init__(self, version, path):
        self.version, self.path = version, path
        self.procs = os.path.join(path, "cgroup.procs")
        self.cpu_path = None  # v1: the group in the cpu hierarchy

    @property
    def procs_files(self):
        return [self.procs] + ([os.path.join(self.cpu_path, "cgroup.procs")] if self.cpu_path else [])

    def bound_cpu(self, cpus, period_us=100_000):
        """Give the whole group at most `cpus` CPUs; False where the cpu controller is not ours to use."""
        quota = max(1000, int(cpus * period_us))
        try:
            if self.version == 2:
                _parent("cpu")  # turns the controller on for the children where it may
                self._write("cpu.max", f"{quota} {period_us}")
                return True
            version, parent = _parent("cpu")
            if version != 1:
                return False  # the memory hierarchy is v1, the cpu controller is not: a process is in one v2 group
            _remove_stale(parent)
            path = os.path.join(parent, os.path.basename(self.path))
            os.mkdir(path)
            self.cpu_path = path
            for name, value in (("cpu.cfs_period_us", period_us), ("cpu.cfs_quota_us", quota)):
                with open(os.path.join(path, name), "w") as f:
                    f.write(str(value))
            return True
        except (CgroupUnavailable, OSError):
            if self.cpu_path:
                _rmdir_within(self.cpu_path, 0.0)
                self.cpu_path = None
            return False

    @classmethod
    def create(cls, limit_bytes):
        version, parent = _parent()
        _remove_stale(parent)
        path = os.path.join(parent, f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.mkdir(path)
        except OSError as e:
            raise CgroupUnavailable(f"cannot make a cgroup in {parent} ({e.strerror})") from None
        group = cls(version, path)
        try:
            if version == 1:
                group._write("memory.limit_in_bytes", limit_bytes)
                group._write("memory.memsw.limit_in_bytes", limit_bytes, optional=True)  # no swapping past it
            else:
                group._write("memory.max", limit_bytes)
                group._write("memory.swap.max", 0, optional=True)
        except OSError as e:
            group.remove()
            raise CgroupUnavailable(f"cannot set a memory limit in {path} ({e.strerror})") from None
        return group

    def _write(self, name, value, optional=False):
        try:
            with open(os.path.join(self.path, name), "w") as f:
                f.write(str(value))
        except OSError:
            if not optional:
                raise

    def oom_kills(self):
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            with open(os.path.join(self.path, name)) as f:
                fields = dict(line.split() for line in f if len(line.split()) == 2)
            return int(fields.get("oom_kill", 0))
        except (OSError, ValueError):
            return 0

    def remove(self, within_s=2.0):
        """Remove the group once its processes are gone (they leave it a moment after they die)."""
        removed = _rmdir_within(self.path, within_s)
        if self.cpu_path:
            removed = _rmdir_within(self.cpu_path, within_s) and removed
        return removed


def _rmdir_within(path, within_s):
    end = time.monotonic() + within_s
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > end:
                return False  # the next create() in a live process removes it
            time.sleep(0.01)


def _remove_stale(parent):
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        if name.startswith(PREFIX):
            pid = name[len(PREFIX):].split("-")[0]
            if pid.isdigit() and not _alive(int(pid)):
                try:
                    os.rmdir(os.path.join(parent, name))
                except OSError:
                    pass
