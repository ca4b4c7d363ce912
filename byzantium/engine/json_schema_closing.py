"""The shortest text that completes a prefix of JSON into a value a JSON schema accepts: how a json_schema
request ends within max_tokens (grammar.py), as JSON mode does with json_closing.py.

A schema often bounds nothing either (a string of any length, a list of any size), and a small model can
loop inside one until its budget runs out. When the tokens left are about to be just enough, the request
writes this text: the open string or number finished, an open key finished as a property its object may
have, then every open object given the required properties it lacks (each the shortest value its schema
accepts) and closed, every open array given the items its minItems asks for and closed.

This reads the common keywords (type, properties, required, additionalProperties, items, prefixItems,
minItems, minLength, maxLength, enum, const, anyOf / oneOf, a single allOf, local $ref, minimum /
maximum, exclusive bounds, multipleOf); a string with a pattern ends with the ending of a short string
the pattern matches (read from the regex) and one with a format with the rest of an example of it. What
this reading cannot complete (a back-reference) is None; the grammar checks every closing before it is
forced (GrammarState.forced_token), so a closing this reading gets wrong is never written."""
import json
import math
import re

import regex  # transformers' dependency: a matcher with a timeout

try:
    from re import _parser as re_parser  # Python 3.11+
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as re_parser

from .json_closing import LITERALS

ANY_TYPE = ["integer", "null", "boolean", "string", "array", "object", "number"]
DIGITS = list("0123456789")
FORMATS = {"date": "2000-01-01", "time": "00:00:00Z", "date-time": "2000-01-01T00:00:00Z", "email": "a@a.aa",
           "uuid": "00000000-0000-0000-0000-000000000000", "ipv4": "0.0.0.0", "ipv6": "::", "hostname": "a",
           "uri": "a:a", "duration": "P0D"}  # an example of each format, as short as its grammar allows
LONGEST_EXAMPLE = 256  # a pattern's examples longer than this are not read
LONGEST_MATCHED, MOST_REPEATS = 64, 6  # strings longer, or patterns with more repeats, are not ended here
PATTERN_SECONDS = 1.0  # a safety net only: within the bounds above a match takes microseconds
MAX_DEPTH = 16  # $ref chains and nesting followed at most this deep


def dumps(value):
    return json.dumps(value, ensure_ascii=False)


def resolve(schema, root):
    """`schema` with local $refs followed ({} for true, None for false or what cannot be followed)."""
    for _ in range(MAX_DEPTH):
        if schema is True:
            return {}
        if not isinstance(schema, dict):
            return None
        if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) == 1 and "$ref" not in schema:
            rest = {k: v for k, v in schema.items() if k != "allOf"}
            part = resolve(schema["allOf"][0], root)
            return None if part is None else {**part, **{k: v for k, v in rest.items() if k not in part}}
        ref = schema.get("$ref")
        if ref is None:
            return schema
        if not isinstance(ref, str) or not ref.startswith("#"):
            return None
        node = root
        for part in filter(None, ref[1:].split("/")):
            node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, dict) else None
        schema = node
    return None


def types(schema):
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return kind
    if any(k in schema for k in ("properties", "required", "additionalProperties")):
        return ["object"]
    if any(k in schema for k in ("items", "prefixItems", "minItems")):
        return ["array"]
    return ANY_TYPE


def shortest(texts):
    texts = [t for t in texts if t is not None]
    return min(texts, key=len) if texts else None


def minimal(schema, root, depth=0):
    """The shortest JSON text `schema` accepts, as far as this reading knows; None when it does not."""
    schema = resolve(schema, root)
    if schema is None or depth > MAX_DEPTH:
        return None
    if "const" in schema:
        return dumps(schema["const"])
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return shortest(dumps(v) for v in schema["enum"])
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list):
        return shortest(minimal(b, root, depth + 1) for b in branches)
    if "allOf" in schema:
        return None
    return shortest(typed_minimal(schema, kind, root, depth) for kind in types(schema))


def typed_minimal(schema, kind, root, depth):
    if kind == "null":
        return "null"
    if kind == "boolean":
        return "false"
    if kind in ("integer", "number"):
        return number(schema, kind == "integer")
    if kind == "string":
        ending = string_ending("", schema)
        return None if ending is None else dumps(ending)
    if kind == "array":
        items = [minimal(item_schema(schema, i), root, depth + 1) for i in range(int(schema.get("minItems", 0)))]
        return None if None in items else "[" + ", ".join(items) + "]"
    if kind == "object":
        return object_text(schema, [], root, depth, opened=False)
    return None


def string_ending(written, schema):
    """The shortest text that ends a string begun as `written` within the schema's minLength, maxLength
    and pattern, among a few candidates (fillers, the endings of short strings the pattern matches),
    or the rest of an example of its format; None when none fits (the grammar checks the format)."""
    low, high, pattern = int(schema.get("minLength", 0)), schema.get("maxLength"), schema.get("pattern")
    if "format" in schema:  # the example's rest: right for the fixed-width formats (dates, times, uuids)
        example = FORMATS.get(schema["format"])
        if example is None:
            return None if written else ""  # a format we have no example of: the grammar says if "" is one
        return example[len(written):] if len(written) <= len(example) else None
    candidates = ["a" * max(0, low - len(written))] + [c * k for k in range(9) for c in "a0A"]
    if isinstance(pattern, str):  # every ending of each example the pattern matches
        candidates += [e[i:] for e in pattern_examples(pattern) for i in range(len(e))]

    if isinstance(pattern, str) and (len(written) > LONGEST_MATCHED or not simple(pattern)):
        return None

    def fits(text):
        if len(text) < low or (isinstance(high, int) and len(text) > high):
            return False
        # fullmatch: valid whether the grammar anchors the pattern or, as JSON Schema does, not
        return not isinstance(pattern, str) or regex.fullmatch(pattern, text, timeout=PATTERN_SECONDS) is not None

    try:
        return next((c for c in sorted(candidates, key=len) if fits(written + c)), None)
    except (TimeoutError, regex.error, ValueError):
        return None


def simple(pattern):
    """A pattern whose matching cannot backtrack without end on a short text: no repeat inside a repeat,
    a few repeats in all. Patterns come from requests, and texts from the model: both are untrusted."""
    def repeats(items, inside):
        count = 0
        for op, arg in items:
            name = str(op)
            subs = []
            if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                if inside:
                    raise ValueError("nested repeat")
                count += 1
                count += repeats(arg[2], True)
                continue
            if name == "SUBPATTERN":
                subs = [arg[-1]]
            elif name == "BRANCH":
                subs = arg[1]
            count += sum(repeats(sub, inside) for sub in subs)
        return count

    try:
        return repeats(re_parser.parse(pattern), False) <= MOST_REPEATS
    except (re.error, ValueError, TypeError, RecursionError):
        return False


def pattern_examples(pattern):
    """Short strings a regex matches, read from its parse (literals, classes, repeats at their minimum,
    each branch), shortest first; [] for what this does not read (back-references)."""
    try:
        return sorted(_examples(re_parser.parse(pattern)), key=len)
    except (re.error, ValueError, TypeError, RecursionError):
        return []


def _examples(items, most=16):
    outs = [""]
    for op, arg in items:
        name = str(op)
        if name == "LITERAL":
            options = [chr(arg)]
        elif name in ("ANY", "NOT_LITERAL"):
            options = ["a" if name == "ANY" or arg != ord("a") else "b"]
        elif name == "IN":
            options = [_class_member(arg)]
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            if arg[0] > LONGEST_EXAMPLE:
                raise ValueError("repeat")
            options = [e * arg[0] for e in _examples(arg[2], most)]
        elif name == "SUBPATTERN":
            options = _examples(arg[-1], most)
        elif name == "BRANCH":
            options = [e for alt in arg[1] for e in _examples(alt, most)]
        elif name in ("AT", "ASSERT", "ASSERT_NOT"):
            continue
        else:
            raise ValueError(name)
        outs = [o for o in dict.fromkeys(o + e for o in outs for e in options) if len(o) <= LONGEST_EXAMPLE][:most]
        if not outs:
            raise ValueError("long")
    return outs


def _class_member(items):
    """A character of a class [...]: its first literal or range, or a digit / word / space for a category."""
    for op, arg in items:
        name = str(op)
        if name == "NEGATE":
            break  # left to the fillers
        if name == "LITERAL":
            return chr(arg)
        if name == "RANGE":
            return chr(arg[0])
        if name == "CATEGORY":
            return {"CATEGORY_DIGIT": "0", "CATEGORY_SPACE": " "}.get(str(arg), "a")
    raise ValueError("class")


def number(schema, integer):
    """The shortest number within the schema's bounds: 0 when it fits, else a bound or the integer next to one."""
    low, high, xlow, xhigh, step = bounds(schema)
    candidates = [0]
    for bound in (low, high):
        if bound is not None:
            candidates += [math.ceil(bound), math.floor(bound)] + ([] if integer else [bound])
    if xlow is not None:
        candidates.append(math.floor(xlow) + 1)
    if xhigh is not None:
        candidates.append(math.ceil(xhigh) - 1)
    if step and low is not None:
        candidates.append(math.ceil(low / step) * step)
    return shortest(dumps(int(v) if float(v).is_integer() else v) for v in candidates if fits(v, schema, integer))


def number_closing(written, schema):
    """The fewest digits (at most two, or a fraction of at most two) that end the number `written` within
    the schema's bounds."""
    integer = "number" not in types(schema)
    two = [a + b for a in DIGITS for b in DIGITS]
    for rest in [""] + DIGITS + two + ([] if integer else ["." + d for d in DIGITS + two]):
        try:
            value = json.loads(written + rest)
        except ValueError:
            continue
        if fits(value, schema, integer):
            return rest
    return None


def bounds(schema):
    """(minimum, maximum, exclusiveMinimum, exclusiveMaximum, multipleOf), each None where not given."""
    def num(key):
        value = schema.get(key)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    low, high, xlow, xhigh, step = (num(k) for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                                     "multipleOf"))
    if schema.get("exclusiveMinimum") is True:  # draft 4: a flag on minimum
        low, xlow = None, low
    if schema.get("exclusiveMaximum") is True:
        high, xhigh = None, high
    return low, high, xlow, xhigh, step if step and step > 0 else None


def fits(value, schema, integer):
    low, high, xlow, xhigh, step = bounds(schema)
    return ((low is None or value >= low) and (high is None or value <= high) and (xlow is None or value > xlow)
            and (xhigh is None or value < xhigh) and (step is None or abs(value / step - round(value / step)) < 1e-9)
            and (not integer or float(value).is_integer()))


def property_schema(schema, key):
    """The schema of property `key` of an object schema; None when the object may not have it."""
    props = schema.get("properties")
    if isinstance(props, dict) and key in props:
        return props[key]
    extra = schema.get("additionalProperties", True)
    return {} if extra is True else extra if isinstance(extra, dict) else None


def item_schema(schema, index):
    """The schema of item `index` of an array schema; None when the array may not have it."""
    prefix = schema.get("prefixItems")
    items = schema.get("items", True)
    if isinstance(items, list):  # draft 4's tuples
        prefix, items = items, schema.get("additionalItems", True)
    if isinstance(prefix, list) and index < len(prefix):
        return prefix[index]
    return {} if items is True else items if isinstance(items, dict) else None


def object_text(schema, keys, root, depth, opened):
    """What an object with `keys` written so far needs to close: its missing required properties in the
    order of `properties` (the order the grammar writes them in), each with its shortest value, then "}"
    (and "{" first unless `opened`)."""
    parts = []
    for key in ordered(schema, schema.get("required", [])):
        if key in keys:
            continue
        value = minimal(property_schema(schema, key), root, depth + 1)
        if value is None:
            return None
        parts.append(f"{dumps(key)}: {value}")
    text = ", ".join(parts) + "}"
    if not opened:
        return "{" + text
    return (", " if keys and parts else "") + text


def ordered(schema, names):
    """`names` in the order of the schema's properties, those it does not name last."""
    props = list(schema.get("properties", {}) if isinstance(schema.get("properties"), dict) else {})
    return sorted(names, key=lambda k: props.index(k) if k in props else len(props))


def container(schema, kind, written, root):
    """The branch of `schema` an open object ("{", with `written` keys) or array ("[") is an instance of."""
    schema = resolve(schema, root)
    if schema is None:
        return None
    branches = schema.get("anyOf") or schema.get("oneOf") or [schema]
    for branch in branches:
        branch = resolve(branch, root)
        if branch is None or ("object" if kind == "{" else "array") not in types(branch):
            continue
        if kind == "[" or all(property_schema(branch, k) is not None for k in written):
            return branch
    return None


def key_name(raw):
    try:
        return json.loads(f'"{raw}"')
    except ValueError:
        return raw


def closing(prefix, root):
    """What to append to the text `prefix` (a json_closing.JsonPrefix that has read it) to make it a whole
    value `root` accepts ("" when it is one), or None when this reading cannot say."""
    if prefix.broken:
        return None
    schemas, schema = [], root
    for i, (kind, frame) in enumerate(zip(prefix.stack, prefix.frames)):
        keys = [key_name(k) for k in frame] if kind == "{" else []
        schema = container(schema, kind, keys, root)
        if schema is None:
            return None
        schemas.append(schema)
        if i + 1 < len(prefix.stack):  # the next open container is the value of the last key, or the last item
            schema = property_schema(schema, keys[-1]) if kind == "{" else item_schema(schema, frame - 1)
    keys = [[key_name(k) for k in frame] if kind == "{" else frame for kind, frame in zip(prefix.stack, prefix.frames)]
    text = value_closing(prefix, schemas, keys, root)
    for i in range(len(schemas) - 1, -1, -1):
        if text is None:
            return None
        rest = container_closing(prefix.stack[i], schemas[i], keys[i], root)
        text = None if rest is None else text + rest
    return text


def value_closing(prefix, schemas, keys, root):
    """The text that finishes what is open inside the innermost container (a string, a number, a key
    without its value, a value after ":" or ","); what it writes is added to `keys`."""
    expect = prefix.expect
    inner = prefix.stack[-1] if prefix.stack else None

    def slot(next_item=False):  # the schema of the value being written in the innermost container
        if inner is None:
            return root
        if inner == "{":
            return property_schema(schemas[-1], keys[-1][-1]) if keys[-1] else None
        return item_schema(schemas[-1], keys[-1] - (0 if next_item else 1))

    space = "" if prefix.last == " " else " "
    if prefix.string is not None:
        escape = prefix.string[1]
        text = "n" if escape == "\\" else "0" * escape if isinstance(escape, int) else ""
        if prefix.string[0]:
            rest = key_closing(prefix.string_text + text, schemas[-1], keys[-1], root)
            return None if rest is None else text + rest
        schema = resolve(slot(), root)
        if schema is None:
            return None
        options = schema.get("enum") if isinstance(schema.get("enum"), list) else (
            [schema["const"]] if "const" in schema else None)
        if options is not None:
            raw = prefix.string_text + text
            rest = [dumps(o)[1 + len(raw):] for o in options if isinstance(o, str) and dumps(o)[1:].startswith(raw)]
            best = shortest(rest)
            return None if best is None else text + best
        ending = string_ending(key_name(prefix.string_text + text), schema)
        return None if ending is None else text + ending + '"'
    if prefix.scalar:
        if prefix.scalar[0] in "tfn":
            return next(lit for lit in LITERALS if lit.startswith(prefix.scalar))[len(prefix.scalar):]
        schema = resolve(slot(), root)
        return None if schema is None else number_closing(prefix.scalar, schema)
    if expect == "colon":
        value = minimal(slot(), root)
        return None if value is None else ": " + value
    if expect == "value":
        value = minimal(slot(next_item=True) if inner == "[" else slot(), root)
        if value is None:
            return None
        if inner == "[":
            keys[-1] += 1
        return (space if prefix.stack else "") + value
    if expect == "key":
        rest = key_closing("", schemas[-1], keys[-1], root)
        return None if rest is None else space + '"' + rest
    return ""  # after a value, or just after "{" / "["


def key_closing(raw, schema, keys, root):
    """Finish an object's key begun as `raw` (the text after its opening quote) and give it the shortest
    value. Properties come in the schema's order: the key is the next required property when it begins
    so, else the shortest property after the last one written that does."""
    props = list(schema.get("properties") if isinstance(schema.get("properties"), dict) else {})
    after = max([props.index(k) + 1 for k in keys if k in props], default=0)
    names = [k for k in props[after:] if dumps(k)[1:].startswith(raw)]
    required = [k for k in ordered(schema, schema.get("required", [])) if k not in keys]
    choices = [required[0]] if required and required[0] in names else sorted(names, key=len)
    if not choices and property_schema(schema, key_name(raw)) is not None:
        choices = [key_name(raw)]  # any other property may be written: end it where it is
    for name in choices:
        value = minimal(property_schema(schema, name), root)
        if value is not None:
            keys.append(name)
            return dumps(name)[1 + len(raw):] + ": " + value
    return None


def container_closing(kind, schema, written, root):
    """What closes one open container (with `written`: its keys, or its item count) once the value
    inside it is finished."""
    if kind == "{":
        return object_text(schema, written, root, 0, opened=True)
    count = written
    items = [minimal(item_schema(schema, i), root) for i in range(count, int(schema.get("minItems", 0)))]
    if None in items:
        return None
    return (", " if count and items else "") + ", ".join(items) + "]"


def members(root):
    """Each property (its key and shortest value) and each item's shortest value anywhere in `root`: what
    one token that begins a member may commit a closing to."""
    texts, stack, seen = [], [root], set()
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack += node
            continue
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        props = node.get("properties")
        if isinstance(props, dict):
            texts += [f"{dumps(k)}: {minimal(v, root) or ''}" for k, v in props.items()]
        for key in ("items", "prefixItems"):
            if node.get(key) is not None:
                texts += [minimal(item, root) or "" for item in (node[key] if isinstance(node[key], list) else [node[key]])]
        stack += [v for v in node.values() if isinstance(v, (dict, list))]
    return texts
