"""The shortest JSON text a schema accepts (as far as this reading knows), and the members of a schema:
what the closing gives a value, an object's missing required properties, an array's missing items."""
import json

from .numbers import number
from .schemas import MAX_DEPTH, item_schema, ordered, property_schema, resolve, types
from .strings import string_ending


def dumps(value):
    return json.dumps(value, ensure_ascii=False)


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
