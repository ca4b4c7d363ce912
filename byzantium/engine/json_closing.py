"""The shortest text that turns a prefix of a JSON value into a whole one: how JSON mode ends within
max_tokens (grammar.py). A JSON object grammar bounds nothing, and a small model can stay inside one
string or list until its budget runs out; so when the tokens left are about to be just enough to close
what is open, the request is made to write this text, and its output always parses.

The prefix is JSON as the grammar writes it (", " and ": " between items, no other whitespace, which is
what grammar.JSON_OPTIONS asks for), read as it grows (`feed`). An open key is finished and given the
value 0, an open string, number or literal finished, then every open array and object closed."""

LITERALS = ("true", "false", "null")
HEX = "0123456789abcdefABCDEF"


class JsonPrefix:
    """The state of a JSON text read so far; `closing()` is what completes it."""

    def __init__(self):
        self.stack = []  # "{" or "[" per open container
        self.frames = []  # per open container: an object's keys so far (a list), an array's item count (an int)
        self.string_text = ""  # the open string's characters so far, escapes as written
        self.expect = "value"  # value, key, colon, comma (a value ended), key-or-end / value-or-end after { / [
        self.string = None  # inside a string: [is_key, escape: None, "\\", or hex digits left]
        self.scalar = ""  # an unfinished number or literal
        self.last = ""  # the last character read
        self.broken = False  # not the start of a JSON value: nothing to complete

    def feed(self, text):
        for ch in text:
            if self.broken:
                return
            self.broken = not self._char(ch)
            self.last = ch

    def _char(self, ch):
        if self.string is not None:
            return self._in_string(ch)
        if self.scalar:
            if self._extends_scalar(ch):
                self.scalar += ch
                return True
            if not _whole(self.scalar):
                return False
            self.scalar, self.expect = "", "comma"
        if ch == " ":
            return True
        if not self.stack and self.expect == "comma":  # the value is whole: nothing may follow
            return False
        expect = self.expect
        if expect in ("value", "value-or-end") and ch in '{["-0123456789tfn' and self.stack and self.stack[-1] == "[":
            self.frames[-1] += 1  # an item of the open array starts
        if ch in "{[" and expect in ("value", "value-or-end"):
            self.stack.append(ch)
            self.frames.append([] if ch == "{" else 0)
            self.expect = "key-or-end" if ch == "{" else "value-or-end"
        elif ch in "}]" and self.stack and self.stack[-1] == ("{" if ch == "}" else "[") and expect in (
                "comma", "key-or-end" if ch == "}" else "value-or-end"):
            self.stack.pop()
            self.frames.pop()
            self.expect = "comma"
        elif ch == '"' and expect in ("value", "value-or-end", "key", "key-or-end"):
            self.string, self.string_text = [expect.startswith("key"), None], ""
        elif ch == ":" and expect == "colon":
            self.expect = "value"
        elif ch == "," and expect == "comma" and self.stack:
            self.expect = "key" if self.stack[-1] == "{" else "value"
        elif ch in "-0123456789tfn" and expect in ("value", "value-or-end"):
            self.scalar = ch
        else:
            return False
        return True

    def _in_string(self, ch):
        escape = self.string[1]
        if escape == "\\":
            self.string[1] = 4 if ch == "u" else None
        elif isinstance(escape, int):
            if ch not in HEX:
                return False
            self.string[1] = escape - 1 or None
        elif ch == "\\":
            self.string[1] = "\\"
        elif ch == '"':
            if self.string[0]:
                self.frames[-1].append(self.string_text)
            self.expect, self.string = ("colon" if self.string[0] else "comma"), None
            return True
        self.string_text += ch
        return True

    def _extends_scalar(self, ch):
        if self.scalar[0] in "tfn":
            return any(lit.startswith(self.scalar + ch) for lit in LITERALS)
        return ch in "0123456789+-.eE"

    def closing(self):
        """What to append to make the text one whole JSON value ("" when it is one), or None when the text
        is not the start of one."""
        if self.broken:
            return None
        text, expect = "", self.expect
        if self.string is not None:
            escape = self.string[1]
            text += "n" if escape == "\\" else "0" * escape if isinstance(escape, int) else ""
            text += '"'
            expect = "colon" if self.string[0] else "comma"
        elif self.scalar:
            if self.scalar[0] in "tfn":
                text += next(lit for lit in LITERALS if lit.startswith(self.scalar))[len(self.scalar):]
            elif not self.scalar[-1].isdigit():
                text += "0"
            expect = "comma"
        space = "" if self.last == " " else " "  # the grammar's separators are ", " and ": "
        if expect == "colon":
            text += ": 0"
        elif expect == "value" and not self.stack:  # nothing written yet
            text += "{}"
        elif expect == "value":  # after ":" or after "," in a list
            text += space + "0"
        elif expect == "key":
            text += space + '"": 0'
        return text + "".join("}" if c == "{" else "]" for c in reversed(self.stack))


def _whole(scalar):
    if scalar[0] in "tfn":
        return scalar in LITERALS
    return scalar[-1].isdigit()


def closing_text(prefix):
    """What to append to `prefix` to make it one whole JSON value, or None when it is not the start of one."""
    state = JsonPrefix()
    state.feed(prefix)
    return state.closing()
