"""Built-in problem generators: verifiable answers, nothing downloaded, same seed -> same problems.

Problem i of a seed is drawn from its own `random.Random(f"{name}:{seed}:{i}")` (string seeds go
through SHA-512, stable across processes, unlike `hash()`), so the first k problems do not depend
on how many are asked for.
"""

import itertools
import random

from .answers.choice import LETTERS
from .record import Task

PEOPLE = ["Alice", "Bob", "Claire", "Dave", "Eve", "Fred", "Gertrude"]
ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh"]


def _rng(name, seed, i):
    return random.Random(f"{name}:{seed}:{i}")


# ------------------------------------------------------------------------------------- arithmetic

def gen_arith(n, seed=0):
    """Multi-step integer arithmetic: bare expressions and short word problems; numeric answer."""
    tasks = []
    for i in range(n):
        rng = _rng("gen-arith", seed, i)
        question, answer = (_expression if rng.random() < 0.5 else _word_problem)(rng)
        tasks.append(Task(f"gen-arith-{seed}-{i}", question, None, str(answer), "number",
                          {"format": "gen-arith", "seed": seed, "index": i}))
    return tasks


def _expression(rng):
    """(a op b) op c ... with 3-5 operands; '*' keeps its operands small so answers stay readable."""
    expr = str(rng.randint(2, 30))
    for _ in range(rng.randint(2, 4)):
        op = rng.choice("+-*")
        b = rng.randint(2, 9) if op == "*" else rng.randint(2, 40)
        expr = f"({expr} {op} {b})" if rng.random() < 0.5 else f"{expr} {op} {b}"
    value = eval(expr, {"__builtins__": {}})  # our own digits and operators only
    if expr.startswith("(") and expr.endswith(")") and expr.count("(") == 1:
        expr = expr[1:-1]
    return f"Compute {expr}.", value


def _word_problem(rng):
    name = rng.choice(["Ana", "Ben", "Chen", "Dara", "Eli", "Farah", "Gus", "Hana"])
    kind = rng.randrange(3)
    if kind == 0:
        item = rng.choice(["apple", "marble", "sticker", "pencil"])
        a, b, c = rng.randint(5, 40), rng.randint(2, 6), rng.randint(3, 12)
        d = rng.randint(1, a + b * c - 1)
        q = (f"{name} has {a} {item}s, buys {b} packs of {c} {item}s each, and then gives away {d} "
             f"{item}s. How many {item}s does {name} have now?")
        return q, a + b * c - d
    if kind == 1:
        price, count = rng.randint(2, 15), rng.randint(2, 9)
        bill = next(v for v in (20, 50, 100, 200) if v > price * count)
        q = (f"A notebook costs {price} dollars. {name} buys {count} notebooks and pays with a "
             f"{bill}-dollar bill. How much change, in dollars, does {name} get?")
        return q, bill - price * count
    a, b, c, d = rng.randint(5, 30), rng.randint(2, 7), rng.randint(5, 30), rng.randint(2, 7)
    q = (f"{name} reads {a} pages a day for {b} days, then {c} pages a day for {d} more days. "
         f"How many pages does {name} read in total?")
    return q, a * b + c * d


# ---------------------------------------------------------------------------------------- tracking

_TRACK = [
    ("are playing a game. At the start of the game, they are each holding a ball:", "has a {} ball",
     "trade balls", "At the end of the game, {} has the", "{} ball",
     ["red", "blue", "green", "yellow", "orange", "purple", "pink", "white", "black", "brown"]),
    ("are dancers at a square dance. At the start of a song, they each have a partner:",
     "is dancing with {}", "switch partners", "At the end of the dance, {} is dancing with", "{}",
     ["Lola", "Rodrigo", "Jamie", "Sam", "Izzi", "Melissa", "Patrick", "Ophelia", "Karl", "Helga"]),
    ("are friends and avid readers who occasionally trade books. At the start of the semester, "
     "they each buy one new book:", "gets {}", "swap books",
     "At the end of the semester, {} has", "{}",
     ["Frankenstein", "Ulysses", "Catch-22", "The Odyssey", "Hound of the Baskervilles",
      "Moby Dick", "Lolita", "The Pearl", "The Great Gatsby", "Dracula"]),
]


def gen_track(n, seed=0, k=5, swaps=None):
    """Objects tracked through pairwise swaps among k people (BBH tracking_shuffled_objects)."""
    if not 3 <= k <= len(PEOPLE):
        raise ValueError(f"gen-track needs 3 <= k <= {len(PEOPLE)}, got {k}")
    tasks = []
    for i in range(n):
        rng = _rng(f"gen-track-{k}", seed, i)
        intro, has, verb, ask, show, pool = rng.choice(_TRACK)
        people, items = PEOPLE[:k], rng.sample(pool, k)
        holding = dict(zip(people, items))
        steps = []
        for _ in range(swaps or k):
            a, b = rng.sample(people, 2)
            holding[a], holding[b] = holding[b], holding[a]
            steps.append(f"{a} and {b} {verb}")
        who = rng.choice(people)
        words = ["First"] + ["Then"] * (len(steps) - 2) + ["Finally"]
        story = " ".join(f"{w}, {s}." for w, s in zip(words, steps))
        start = ", ".join(f"{p} {has.format(x)}" for p, x in zip(people, items))
        start = start.replace(" a a", " an a").replace(" a o", " an o")
        question = (f"{', '.join(people[:-1])}, and {people[-1]} {intro} {start}.\n"
                    f"As the story goes on, pairs of them {verb}. {story} {ask.format(who)}")
        choices = [show.format(x) for x in items]
        tasks.append(Task(f"gen-track{k}-{seed}-{i}", question, choices, LETTERS[items.index(holding[who])],
                          "choice", {"format": "gen-track", "seed": seed, "index": i, "k": k}))
    return tasks


# ---------------------------------------------------------------------------------------- ordering

_ORDER = [  # setting, objects, how to name one, "a before b", positions (index 0 is first)
    dict(setting="On a shelf, there are {k} books: {objs}.", pool=["red", "blue", "green", "gray", "white",
         "orange", "purple"], name="the {} book", before="is to the left of", place="is the {}",
         first="leftmost", last="rightmost", nth="{} from the left", nth_back="{} from the right",
         objs="a {} book"),
    dict(setting="In a golf tournament, there were {k} golfers: {objs}.", pool=["Ana", "Eli", "Joe", "Mya",
         "Rob", "Eve", "Amy"], name="{}", before="finished above", place="finished {}",
         first="first", last="last", nth="{}", nth_back="{}-to-last", objs="{}"),
]


def gen_order(n, seed=0, k=5):
    """Logical deduction: a hidden order of k objects, clues that fix it, one lettered question
    (BBH logical_deduction). Clues are added until exactly one order satisfies them."""
    if not 3 <= k <= 7:
        raise ValueError(f"gen-order needs 3 <= k <= 7, got {k}")
    tasks = []
    for i in range(n):
        rng = _rng(f"gen-order-{k}", seed, i)
        d = rng.choice(_ORDER)
        objs = rng.sample(d["pool"], k)
        order = rng.sample(objs, k)  # order[p] sits at position p
        pos = {o: p for p, o in enumerate(order)}
        target = rng.randrange(k)
        clues, alive = [], list(itertools.permutations(objs))
        while len(alive) > 1:
            # Of a few random true clues, keep the one that rules out the most orders: short puzzles.
            cands = [_clue(rng, objs, pos, target) for _ in range(6)]
            best = min(cands, key=lambda c: sum(c[1](p) for p in alive))
            clues.append(best[0])
            alive = [p for p in alive if best[1](p)]
        listing = ", ".join(d["objs"].format(o) for o in objs)
        question = (f"The following paragraph describes a set of {k} objects arranged in a fixed order. "
                    f"The statements are logically consistent. {d['setting'].format(k=k, objs=listing)} "
                    + " ".join(_say(c, d, k) + "." for c in clues))
        choices = [_say(("at", o, target), d, k) for o in objs]
        tasks.append(Task(f"gen-order{k}-{seed}-{i}", question, choices, LETTERS[objs.index(order[target])],
                          "choice", {"format": "gen-order", "seed": seed, "index": i, "k": k}))
    return tasks


def _clue(rng, objs, pos, target):
    """A true clue and its test on a candidate order (a tuple, position -> object)."""
    while True:
        if rng.random() < 0.35:
            o = rng.choice(objs)
            if pos[o] == target:  # never state the answer outright
                continue
            p = pos[o]
            return ("at", o, p), lambda perm, o=o, p=p: perm[p] == o
        a, b = rng.sample(objs, 2)
        if pos[a] > pos[b]:
            a, b = b, a
        return ("before", a, b), lambda perm, a=a, b=b: perm.index(a) < perm.index(b)


def _say(clue, d, k):
    subject = d["name"].format(clue[1])
    subject = subject[0].upper() + subject[1:]
    if clue[0] == "before":
        return f"{subject} {d['before']} {d['name'].format(clue[2])}"
    p = clue[2]
    if p == 0:
        where = d["first"]
    elif p == k - 1:
        where = d["last"]
    elif p > (k - 1) / 2:
        where = d["nth_back"].format(ORDINALS[k - 1 - p])
    else:
        where = d["nth"].format(ORDINALS[p])
    return f"{subject} {d['place'].format(where)}"


# ------------------------------------------------------------------------------------------- sums

def gen_sum(n, seed=0, hi=5):
    """One-step sums "What is a + b?" with 2 <= a, b <= hi; numeric answer. Easy enough for the
    embedded 135M model to be clearly above chance (the demo's problems)."""
    if hi < 2:
        raise ValueError(f"gen-sum needs hi >= 2, got {hi}")
    tasks = []
    for i in range(n):
        rng = _rng(f"gen-sum-{hi}", seed, i)
        a, b = rng.randint(2, hi), rng.randint(2, hi)
        tasks.append(Task(f"gen-sum-{seed}-{i}", f"What is {a} + {b}?", None, str(a + b), "number",
                          {"format": "gen-sum", "seed": seed, "index": i, "hi": hi}))
    return tasks
