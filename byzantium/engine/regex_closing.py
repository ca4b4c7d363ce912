"""Regex-constrained output ends within max_tokens, matching its regex and never cut inside a character:
for `regex` constraints, the closing that json_closing.py gives JSON (grammar.py).

The regex, read by regex_reader.py, is built here into a small automaton (Thompson's construction, its
edges sets of code points).
The output so far runs through it as it grows; the shortest text that takes it to a match is a shortest
path over the automaton (a character costs its UTF-8 bytes, so ASCII is preferred). When the tokens left
are about to be just enough, the request is made to write that text; a character split between tokens
is finished first. Where the whole closing no longer fits, the split character alone still is, so the
output never ends inside one. A regex the reader does not take, or an output this automaton reads
differently from the grammar engine, gets no closing and runs as before.
"""
from __future__ import annotations

import codecs
import heapq

from .regex_reader import MAX_CODE, Reader, Unsupported, contains, representative, smallest_in

MAX_STATES = 20_000  # a larger automaton (long counted repeats) is not worth building on the engine's thread
RESERVE = 6  # tokens one sampled token may add to the closing, as JsonCloser.RESERVE


# -- the automaton --------------------------------------------------------------------------------------------
class Automaton:
    """A regex's automaton: per state its empty moves and its (code-point set, target) moves; `final` is
    the accepting state. `distance` and `hop` give each state's shortest way to `final`."""

    def __init__(self, regex):
        self.empty, self.moves = [], []
        start, self.final = self.build(Reader(regex).parse())
        self.start = self.closure({start})
        self.distance, self.hop = self.shortest_paths()

    def state(self):
        if len(self.empty) >= MAX_STATES:
            raise Unsupported(f"more than {MAX_STATES} states")
        self.empty.append([])
        self.moves.append([])
        return len(self.empty) - 1

    def build(self, node):
        """(entry, exit) states of a fragment matching `node`."""
        kind = node[0]
        entry, exit_ = self.state(), self.state()
        if kind == "set":
            if node[1]:
                self.moves[entry].append((node[1], exit_))
        elif kind == "cat":
            at = entry
            for item in node[1]:
                first, last = self.build(item)
                self.empty[at].append(first)
                at = last
            self.empty[at].append(exit_)
        elif kind == "alt":
            for option in node[1]:
                first, last = self.build(option)
                self.empty[entry].append(first)
                self.empty[last].append(exit_)
        else:  # rep
            _, body, least, most = node
            at = entry
            for _ in range(least):
                first, last = self.build(body)
                self.empty[at].append(first)
                at = last
            if most is None:  # a loop: any number more
                first, last = self.build(body)
                self.empty[at].append(first)
                self.empty[last].append(at)
            else:
                for _ in range(most - least):  # each optional copy may end the repeat
                    self.empty[at].append(exit_)
                    first, last = self.build(body)
                    self.empty[at].append(first)
                    at = last
            self.empty[at].append(exit_)
        return entry, exit_

    def closure(self, states):
        todo, seen = list(states), set(states)
        while todo:
            for target in self.empty[todo.pop()]:
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        return frozenset(seen)

    def step(self, states, char):
        code = ord(char)
        return self.closure({t for s in states for ranges, t in self.moves[s] if contains(ranges, code)})

    def shortest_paths(self):
        """Per state: the UTF-8 bytes of the shortest text to `final`, and the first move of it
        (target, character written or None for an empty move); Dijkstra's over the reversed moves."""
        backward = [[] for _ in self.empty]
        for source, targets in enumerate(self.empty):
            for target in targets:
                backward[target].append((source, 0, None))
        for source, moves in enumerate(self.moves):
            for ranges, target in moves:
                char = representative(ranges)
                if char is not None:
                    backward[target].append((source, len(char.encode()), char))
        distance, hop = [None] * len(self.empty), [None] * len(self.empty)
        distance[self.final] = 0
        queue = [(0, self.final)]
        while queue:
            cost, state = heapq.heappop(queue)
            if cost > distance[state]:
                continue
            for source, weight, char in backward[state]:
                if distance[source] is None or cost + weight < distance[source]:
                    distance[source], hop[source] = cost + weight, (state, char)
                    heapq.heappush(queue, (cost + weight, source))
        return distance, hop

    def path(self, state):
        """The shortest text from `state` to a match."""
        chars = []
        while state != self.final:
            state, char = self.hop[state]
            if char is not None:
                chars.append(char)
        return "".join(chars)

    def closing(self, states, pending=b""):
        """The bytes that take `states` (after the output's whole characters) to a match, the first
        finishing the split character whose first bytes are `pending`; None when there are none."""
        if not pending:
            reachable = [s for s in states if self.distance[s] is not None]
            if not reachable:
                return None
            return self.path(min(reachable, key=lambda s: self.distance[s])).encode()
        low, high = code_range(pending)
        best = None
        for state in states:
            for ranges, target in self.moves[state]:
                code = smallest_in(ranges, low, high)
                if code is None or self.distance[target] is None:
                    continue
                rest = chr(code).encode()[len(pending):]
                cost = len(rest) + self.distance[target]
                if best is None or cost < best[0]:
                    best = (cost, rest + self.path(target).encode())
        return None if best is None else best[1]

    def growth(self, states):
        """The most bytes a closing may need after one more character from `states`."""
        return max([self.distance[t] for s in states for _, t in self.moves[s] if self.distance[t] is not None],
                   default=0)


def code_range(pending):
    """The code points whose UTF-8 encoding begins with the bytes `pending` (a character's first bytes)."""
    lead = pending[0]
    length = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    least = {2: 0x80, 3: 0x800, 4: 0x10000}[length]

    def code(tail):
        value = lead & (0x7F >> length)
        for byte in pending[1:] + bytes([tail] * (length - len(pending))):
            value = (value << 6) | (byte & 0x3F)
        return value
    return max(code(0x80), least), min(code(0xBF), MAX_CODE)


def automaton(regex):
    """The regex's Automaton, or None when its syntax is not one this reader takes."""
    try:
        return Automaton(regex)
    except (Unsupported, RecursionError):
        return None


class RegexCloser:
    """JsonCloser's interface (grammar.py) for regexes: the tokens of the closing when it must start now,
    else None; where the output already matches, the EOS token once a character more could leave it a
    closing that no longer fits. A token is at least one byte, so a closing of B bytes fits in B tokens."""

    def __init__(self, tokenizer, machine, eos_token_id, reserve=RESERVE):
        self.tokenizer, self.machine, self.eos, self.reserve = tokenizer, machine, eos_token_id, reserve
        self.states, self.read, self.wait = machine.start, 0, 0
        self.decoder = codecs.getincrementaldecoder("utf-8")()

    def feed(self, output_ids):
        if len(output_ids) <= self.read:
            return
        text = self.decoder.decode(self.tokenizer.decode_bytes(list(output_ids[self.read:])))
        self.read = len(output_ids)
        for char in text:
            if not self.states:
                return
            self.states = self.machine.step(self.states, char)

    def closing_tokens(self, output_ids, tokens_left):
        try:
            self.feed(output_ids)
        except UnicodeDecodeError:  # not UTF-8: not text this reads
            self.states = frozenset()
        if not self.states:  # read differently from the grammar engine: no closing
            return None
        if self.wait > 0:
            self.wait -= 1
            return None
        pending = self.decoder.getstate()[0]
        closing = self.machine.closing(self.states, pending)
        if closing is None:
            return None
        if not closing:  # it matches: end once a character more could need more than is left
            growth = self.machine.growth(self.states)
            return [self.eos] if growth and tokens_left <= growth + self.reserve else None
        if tokens_left > len(closing) + self.reserve:
            self.wait = (tokens_left - len(closing) - self.reserve) // (self.reserve + 1)
            return None
        ids = self.tokenizer.tokenize_bytes(closing)
        if len(ids) > tokens_left:  # the whole closing no longer fits: at least the split character does
            if not pending:
                return None
            ids = self.tokenizer.tokenize_bytes(closing[:len(code_rest(pending, closing))])
            return ids if len(ids) >= tokens_left else None
        return ids if tokens_left <= len(ids) + self.reserve else None


def code_rest(pending, closing):
    """The bytes of `closing` that finish the split character begun by `pending`."""
    length = 2 if pending[0] < 0xE0 else 3 if pending[0] < 0xF0 else 4
    return closing[:length - len(pending)]
