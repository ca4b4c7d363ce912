"""Reading a schema as the closing needs it: local $refs followed, the types it allows, and the schema of
an object's property or an array's item."""
MAX_DEPTH = 16  # $ref chains and nesting followed at most this deep
ANY_TYPE = ["integer", "null", "boolean", "string", "array", "object", "number"]


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
