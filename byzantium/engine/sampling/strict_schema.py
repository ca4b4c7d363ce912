"""A JSON schema as structured outputs read it: an object takes only the properties it names, unless it
says otherwise (additionalProperties, patternProperties or unevaluatedProperties of its own).

JSON Schema itself allows any other property by default, which a grammar then lets a model write
without end (a 135M model asked for {name, age, hobbies} went on with "salary", "email", ... in 17 of 20
greedy answers). OpenAI's strict mode requires additionalProperties: false on every object, and xgrammar,
vLLM's default grammar engine, assumes it where a schema is silent; so do we."""

OPEN_KEYWORDS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
SUBSCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
              "unevaluatedProperties", "additionalItems")


def strict(schema, close=True):
    """A copy of `schema` in which every object schema that names its properties and has no rule for
    other ones refuses them. An allOf of several parts is left open, and its parts too (each would refuse
    the others' properties)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    parts = schema.get("allOf") if isinstance(schema.get("allOf"), list) else []
    if close and is_object(schema) and not any(k in schema for k in OPEN_KEYWORDS) and len(parts) < 2:
        out["additionalProperties"] = False
    if parts:
        out["allOf"] = [strict(sub, close=len(parts) == 1) for sub in parts]
    for key in SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            out[key] = {name: strict(sub) for name, sub in schema[key].items()}
    for key in SUBSCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            out[key] = [strict(sub) for sub in schema[key]]
    for key in SUBSCHEMAS:
        if isinstance(schema.get(key), (dict, list)):
            out[key] = [strict(s) for s in schema[key]] if isinstance(schema[key], list) else strict(schema[key])
    return out


def is_object(schema):
    """The schema describes objects by their properties (a bare {"type": "object"} stays any object, and
    so does a branch that only lists what is required)."""
    kind = schema.get("type")
    typed = kind == "object" or (isinstance(kind, list) and "object" in kind) or kind is None
    return typed and isinstance(schema.get("properties"), dict)
