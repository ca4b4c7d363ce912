"""HumanEval-format problems checked in the sandbox: the solution and its tests run in two
sandboxes joined by two pipes, and only plain data crosses between them.

    check_humaneval(task, completion, ...) -> SandboxResult        the verdict is the tests' process's
    extract_code(text, entry_point=None) / solution_program(...)   how the solution's program is built
"""

import ast
import os
import re
import secrets

from .sandbox import TAIL_CHARS, SandboxJob


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
    if result.status == "failed" and served.status == "crashed":
        result.status = "crashed"
    result.stdout = served.stdout
    if served.stderr:
        result.stderr = f"{result.stderr}\n--- the solution's stderr ---\n{served.stderr}"[-TAIL_CHARS:]
    result.missing = tuple(dict.fromkeys(result.missing + served.missing))
    result.oom_kills += served.oom_kills
    return result
