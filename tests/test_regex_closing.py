"""Regex-constrained output closes within max_tokens (engine/regex_closing.py): the automaton's closing
of every prefix (cut at any byte, so inside characters too) makes a whole match, as Python's `re` reads
the regex; with the grammar engine, every closing the budget forces is accepted by the grammar and
leaves it complete; on the embedded model, outputs on budgets too short for most answers match their
regex and never end inside a character."""
import re

import pytest

from byzantium import SamplingParams
from byzantium.engine import grammar
from byzantium.engine.regex_closing import automaton, code_range

# (regex, texts that match it); the texts have characters of 1 to 4 UTF-8 bytes
CASES = [(r"[0-9]{3}-[0-9]{4}", ["555-0142"]),
         (r"(?P<user>[a-z.]+)@[a-z]+\.(com|org)", ["joe.b@example.org"]),
         (r"(caf[eé]|na[iï]ve)( [a-zéï]{1,6}){0,3}!", ["café naïve olé!", "naive!"]),
         (r"[^\n]{2,12}\.", ["日本語のテキスト.", "a😀b."]),
         (r"colou?r(s|ed)?|grey", ["coloured", "grey", "colors"]),
         (r"\w+\s\w+\?", ["hi there?"]),
         (r"[\d.-]+x*", ["3.14-2xx"]),
         (r"(ab|cd){2,}\.?", ["abcdab."]),
         # inline flags: i (other-case forms: the Kelvin sign is a k, Σ and ς are σ), s, m, x, scoped, mixed
         (r"(?i)[a-z]+-(ok|no)", ["Hello-OK", "\u212aelvin-nO"]),
         (r"(?i)(straße|café) [α-ω]{2,4}!", ["STRAßE ΑΒΓ!", "Café σς!", "CAFÉ ΣΣΣΣ!"]),
         (r"(?s)<b>.{1,20}</b>", ["<b>two\nlines</b>", "<b>\n\n😀</b>"]),
         (r"(?m)(yes|no)\n(?s:.)", ["yes\n\n", "no\nx"]),  # m without ^ or $ changes nothing
         (r"(?x) [0-9]{3} - [0-9]{4}  (\ ext\ [0-9]+)?  # a phone number", ["555-0142", "555-0142 ext 7"]),
         (r"(?i:hello) world|(?s:x.)y", ["HeLLo world", "x\ny"]),
         (r"(?i)id-[a-f]{2}(?-i:[A-Z]+)", ["ID-aFXY", "id-abQ"]),
         (r"(?is)begin.+end", ["BEGIN\nx\nEnd"])]


def states_after(machine, text):
    states = machine.start
    for char in text:
        states = machine.step(states, char)
    return states


@pytest.mark.parametrize("regex,texts", CASES)
def test_every_byte_prefix_closes_into_a_match(regex, texts):
    machine = automaton(regex)
    assert machine is not None
    for text in texts:
        data = text.encode()
        for cut in range(len(data) + 1):
            head = data[:cut]
            whole = head.decode("utf-8", "ignore")
            while not data[:cut].startswith(whole.encode()):  # pragma: no cover - decode drops only a tail
                whole = whole[:-1]
            pending = head[len(whole.encode()):]
            states = states_after(machine, whole)
            assert states, (regex, whole)
            closing = machine.closing(states, pending)
            assert closing is not None, (regex, head)
            closed = (head + closing).decode()  # never a broken character
            assert re.fullmatch(regex, closed), (regex, head, closing)


def test_syntax_it_does_not_read_gets_no_closing():
    for regex in [r"\bword", r"(?=a)a", r"(?<=a)b", r"(?<!a)b", r"\p{L}+", r"[[:alpha:]]", r"(a)\1", r"a{1,100000}",
                  r"\x{41", r"a\u{1F600",  # an unclosed \x{ or \u{: refused, not read again from the start
                  r"a{1, 2}",  # Python's re reads it as text, the grammar engine refuses it
                  r"(?a)abc", r"(?-u)a", r"(?#note)a", r"(?)a", r"(?i-i)a", r"(?P=n)",  # flags not read
                  r"(?m)^a$", r"(?m)a$b", r"(?m:^a)",  # a line's anchor: the grammar engine refuses it too
                  r"(?x)[a b]", r"(?x)[#a]", "(?x)a\u00a0b",  # what (?x) would skip in a class, or beyond spaces
                  "(?x)a\tb", "(?x)a\nb", "(?x)a#c\nb", "(?x)a\\\nb"]:  # read as themselves by the grammar engine
        assert automaton(regex) is None, regex
    assert automaton(r"a|b") is not None


def test_flags_hold_where_they_are_written():
    """Case folding applies to literals and classes before a negation, not to \\W; a scoped flag ends with
    its group; a (?flags) in a group holds to the group's end, across its options (as the grammar engine's
    Rust syntax has it: Python's re takes flags only at the start)."""
    def reads(regex, text):
        states = states_after(automaton(regex), text)
        return bool(states) and automaton(regex).closing(states) == b""
    assert reads(r"(?i)[^a]", "b") and not reads(r"(?i)[^a]", "A")
    assert not reads(r"(?i)\W", "k") and reads(r"(?i)\x41", "a")
    assert reads(r"(?i:a)b", "Ab") and not reads(r"(?i:a)b", "AB")
    assert reads(r"(a(?i)b|c)d", "aBd") and reads(r"(a(?i)b|c)d", "Cd") and not reads(r"(a(?i)b|c)d", "CD")
    assert reads(r"(?i)ß", "ẞ") and not reads(r"(?i)ß", "SS")  # simple case folding: one character each
    assert not reads(r".", "\n") and reads(r"(?s).", "\n") and not reads(r"(?s:.).", "\n\n")
    assert reads("(?x)a b #c", "ab") and reads(r"(?x)a\ b", "a b") and reads(r"(?U)a+?b", "aab")


def test_the_code_points_a_split_character_may_be():
    for char in "é€😀ï日":
        data = char.encode()
        for k in range(1, len(data)):
            low, high = code_range(data[:k])
            assert low <= ord(char) <= high
            assert chr(low).encode().startswith(data[:k]) and chr(high).encode().startswith(data[:k])


# -- with the grammar engine, on the embedded model ----------------------------------------------------------
needs_llguidance = pytest.mark.skipif(not grammar.available(), reason="llguidance is not installed")


@needs_llguidance
@pytest.mark.parametrize("regex,texts", CASES)
def test_forced_closings_are_ones_the_grammar_accepts(smollm2_dir, regex, texts):
    """At every token prefix of matching texts (a cut token may split a character), the closing the budget
    forces at the most tokens left at which it is forced is accepted by the grammar and completes it; and
    with one token left, a split character is finished (the output never ends inside one)."""
    from byzantium.engine.loader import load_tokenizer
    tokenizer = load_tokenizer(smollm2_dir)
    grammars = grammar.Grammars(tokenizer, 49152, {2})
    params = SamplingParams(regex=regex)
    checked = 0
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        for cut in range(len(ids)):
            state = grammars.start(params)
            for token in ids[:cut]:
                state.advance(token)
            assert state.error is None, (regex, cut)
            if tokenizer.decode(ids[:cut]).endswith("\ufffd"):
                state.closer.wait = 0
                finish = state.closer.closing_tokens(ids[:cut], 1)
                assert finish and state.valid_prefix(finish) == len(finish), (regex, cut)
                assert "\ufffd" not in tokenizer.decode(ids[:cut] + finish), (regex, cut)
            closing = None
            for left in range(63, 0, -1):
                state.closer.wait = 0  # as if first asked with `left` tokens left
                closing = state.closer.closing_tokens(ids[:cut], left)
                if closing:
                    break
            if not closing:  # nothing is ever forced only where it matches already, and always will
                assert state.matcher.is_accepting() and re.fullmatch(regex, tokenizer.decode(ids[:cut]))
                continue
            assert state.valid_prefix(closing) == len(closing), (regex, tokenizer.decode(ids[:cut]), closing)
            for token in closing:
                state.advance(token)
            out = ids[:cut] + closing
            if closing == [2]:  # it matched already: ended with EOS
                out = ids[:cut]
            assert state.ended or state.matcher.is_accepting(), (regex, tokenizer.decode(out))
            assert re.fullmatch(regex, tokenizer.decode(out)), (regex, tokenizer.decode(out))
            checked += 1
    assert checked >= len(texts)


@needs_llguidance
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_outputs_match_their_regex_within_short_budgets(smollm2_engine, temperature):
    """Budgets too short for the answers a model would write: every output matches (the ASCII-digit
    reading of \\d, as the grammar takes it), ends within its budget, and has no broken character."""
    engine = smollm2_engine
    regexes = [r"The (phone|number) is \(\d{3}\) \d{3}-\d{4}\.", r"[A-Za-zéèü ,]{3,80}\. (Yes|No)!",
               r"(日本|東京|[a-z]){4,40} = \d{2,6}", r"(?i)(yes|no)\. [a-z ,]{3,80}\."]
    prompts = [engine.render_chat([{"role": "user", "content": text}])
               for text in ("What is the library's phone number?", "Describe Zürich in French.",
                            "Write Japanese words about Tokyo.", "Is Paris in France? Answer, then explain.")]
    least = [len(engine.tokenizer.encode(automaton(rx).closing(automaton(rx).start).decode(), add_special_tokens=False))
             for rx in regexes]  # the tokens of each regex's shortest match
    checked = closed = 0
    for extra in (0, 6):
        params = [SamplingParams(max_tokens=n + extra, temperature=temperature, seed=extra + i, regex=rx)
                  for i, (rx, n) in enumerate(zip(regexes, least))]
        for regex, out, budget in zip(regexes, engine.generate(prompts, params), [n + extra for n in least]):
            assert len(out.token_ids) <= budget and "\ufffd" not in out.text, (regex, out.text)
            assert re.fullmatch(regex.replace(r"\d", "[0-9]"), out.text), (regex, budget, out.text)
            checked += 1
            closed += out.finish_reason == "length"
    assert checked == 2 * len(regexes) and closed > 0

