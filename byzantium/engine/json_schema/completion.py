"""The closing of a prefix of JSON: what it lacks to be a whole instance of the schema. The prefix's open
containers are matched to their schemas from the outside in; then the value open in the innermost one is
finished (a string, a number, a key, a value after ":" or ","), and each container is closed from the
inside out with what it still requires."""
import json

from ..json_closing import LITERALS
from .numbers import number_closing
from .schemas import container, item_schema, ordered, property_schema, resolve
from .strings import string_ending
from .values import dumps, minimal, object_text, shortest

ESCAPES = ["n", '"', "\\", "/", "b", "f", "r", "t"]  # what may follow a backslash in JSON; "n" first, as elsewhere


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
        return string_closing(prefix.string_text, escape, schema)
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


def string_closing(raw, escape, schema):
    """Finish a string value begun as `raw` (as written, perhaps inside an escape): the escape finished
    (after a bare backslash, by whichever letter its pattern can go on from), the shortest ending,
    escaped as JSON (a pattern's may hold a quote, a backslash or a control character), and the quote."""
    fills = ESCAPES if escape == "\\" else ["0" * escape if isinstance(escape, int) else ""]
    texts = []
    for fill in fills:
        ending = string_ending(key_name(raw + fill), schema)
        if ending is not None:
            texts.append(fill + dumps(ending)[1:-1] + '"')
    return shortest(texts)


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
