"""How a string a schema constrains ends: within its minLength and maxLength, matching its `pattern`, or
as an example of its `format`.

A pattern is read into regex_closing's automaton, the written characters are run through it, and the
ending is the shortest way from there to a match (padded first to minLength). A pattern the automaton
does not read (look-around, back-references, ^/$ under (?m), \\b, \\p{..}) gives no ending, as a back-reference
always did here: nothing is forced and the request runs on as it would without a closing. Patterns come
from requests and strings from the model, both untrusted: the automaton never backtracks, and the work
of one closing is bounded (LONGEST_MATCHED, MOST_PADDING, regex_closing.MAX_STATES)."""
from functools import lru_cache

from ..regex_closing import automaton
from ..regex_reader import representative

FORMATS = {"date": "2000-01-01", "time": "00:00:00Z", "date-time": "2000-01-01T00:00:00Z", "email": "a@a.aa",
           "uuid": "00000000-0000-0000-0000-000000000000", "ipv4": "0.0.0.0", "ipv6": "::", "hostname": "a",
           "uri": "a:a", "duration": "P0D"}  # an example of each format, as short as its grammar allows
LONGEST_MATCHED = 64  # a longer string is not run through its pattern again at each closing: not ended here
MOST_PADDING = 256  # nor is a pattern string that needs more characters than this to reach its minLength


def string_ending(written, schema):
    """The shortest text that ends a string begun as `written` (its characters, unescaped) within the
    schema's minLength, maxLength and pattern, or the rest of an example of its format; None when this
    reading finds none (the grammar checks the format)."""
    low, high, pattern = int(schema.get("minLength", 0)), schema.get("maxLength"), schema.get("pattern")
    if "format" in schema:  # the example's rest: right for the fixed-width formats (dates, times, uuids)
        example = FORMATS.get(schema["format"])
        if example is None:
            return None if written else ""  # a format we have no example of: the grammar says if "" is one
        return example[len(written):] if len(written) <= len(example) else None
    need = max(0, low - len(written))
    ending = pattern_ending(written, pattern, need) if isinstance(pattern, str) else "a" * need
    if ending is None or (isinstance(high, int) and len(written) + len(ending) > high):
        return None  # the shortest ending is too long: every other is too
    return ending


def pattern_ending(written, pattern, least):
    """The shortest text of at least `least` characters that makes `written` a whole match of `pattern`
    (as fullmatch: right whether the grammar anchors the pattern or, as JSON Schema does, not)."""
    machine = pattern_automaton(pattern)
    if machine is None or len(written) > LONGEST_MATCHED or least > MOST_PADDING:
        return None
    states = machine.start
    for char in written:
        if not states:
            return None
        states = machine.step(states, char)
    return completion(machine, states, least)


@lru_cache(maxsize=256)
def pattern_automaton(pattern):
    """The pattern's Automaton (regex_closing.py), read once; None when its syntax is not read there."""
    return automaton(pattern)


def completion(machine, states, least):
    """The shortest text of at least `least` characters that takes the automaton from `states` to a match,
    or None: `least` characters along any of its moves (one way kept to each state they reach), then the
    shortest way on from the state that has it."""
    ways = with_empty_moves(machine, {state: "" for state in states})
    for _ in range(least):
        reached = {}
        for state, text in ways.items():
            for ranges, target in machine.moves[state]:
                char = representative(ranges)
                if char is not None:
                    reached.setdefault(target, text + char)
        ways = with_empty_moves(machine, reached)
    ends = [state for state in ways if machine.distance[state] is not None]
    if not ends:
        return None
    best = min(ends, key=lambda state: machine.distance[state])
    return ways[best] + machine.path(best)


def with_empty_moves(machine, ways):
    """`ways` (state -> the text that reached it) with every state its empty moves reach, by the same text."""
    todo = list(ways)
    while todo:
        state = todo.pop()
        for target in machine.empty[state]:
            if target not in ways:
                ways[target] = ways[state]
                todo.append(target)
    return ways
