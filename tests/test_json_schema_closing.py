"""engine/json_schema: the shortest text that completes a prefix of JSON into a value a schema accepts,
checked with jsonschema on every prefix of random instances of schemas written as the grammar writes them;
and strict_schema: objects take only the properties they name unless they say otherwise."""
import json
import random

import pytest

from byzantium.engine.sampling.strict_schema import strict
from byzantium.engine.json_closing import JsonPrefix
from byzantium.engine.json_schema import closing, members, minimal

jsonschema = pytest.importorskip("jsonschema")

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "minLength": 2}, "age": {"type": "integer", "minimum": 18,
                                                                             "maximum": 99},
                         "mood": {"enum": ["happy", "sad", "calm"]},
                         "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                         "score": {"type": "number", "exclusiveMinimum": 0.5},
                         "pet": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/pet"}]}},
          "required": ["name", "age", "mood", "tags"],
          "$defs": {"pet": {"type": "object", "properties": {"kind": {"const": "cat"}, "legs": {"type": "integer"}},
                            "required": ["kind"]}}}
NESTED = {"type": "object",
          "properties": {"city": {"type": "string"},
                         "landmarks": {"type": "array", "items": {
                             "type": "object", "properties": {"name": {"type": "string"}, "year": {"type": "integer"},
                                                              "open": {"type": "boolean"}},
                             "required": ["name", "year"]}},
                         "grid": {"type": "array", "items": {"type": "array", "items": {"type": "integer"},
                                                             "minItems": 1}, "minItems": 1}},
          "required": ["grid", "city", "landmarks"]}  # the grammar writes them in the order of properties
PYDANTIC = {"$defs": {"Step": {"properties": {"explanation": {"title": "Explanation", "type": "string"},
                                              "output": {"title": "Output", "type": "string"}},
                               "required": ["explanation", "output"], "title": "Step", "type": "object"}},
            "properties": {"steps": {"items": {"$ref": "#/$defs/Step"}, "title": "Steps", "type": "array"},
                           "final_answer": {"title": "Final Answer", "type": "string"}},
            "required": ["steps", "final_answer"], "title": "MathReasoning", "type": "object"}
LIST = {"type": "array", "items": {"type": "integer", "multipleOf": 5, "minimum": 7}, "minItems": 3}
CODES = {"type": "object",  # strings with a pattern or a format (instances drawn from their examples)
         "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$", "examples": ["AB12", "ZZ09"]},
                        "tag": {"type": "string", "pattern": "^(x|[a-z]+-[0-9]+)$", "examples": ["ab-7", "x"]},
                        "day": {"type": "string", "format": "date", "examples": ["2024-02-29"]},
                        "id": {"type": "string", "format": "uuid",
                               "examples": ["123e4567-e89b-12d3-a456-426614174000"]}},
         "required": ["code", "tag", "day", "id"]}
SCHEMAS = [PERSON, NESTED, PYDANTIC, LIST, CODES]


def resolve(schema, root):
    while "$ref" in schema:
        schema = root["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def instance(schema, root, rng, depth=0):
    """A random value `schema` accepts (the keywords used above)."""
    schema = resolve(schema, root)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if "anyOf" in schema:
        return instance(rng.choice(schema["anyOf"]), root, rng, depth)
    kind = schema["type"]
    if kind == "object":
        props = schema["properties"]
        keys = [k for k in props if k in schema.get("required", []) or rng.random() < 0.5]  # in the grammar's order
        return {k: instance(props[k], root, rng, depth + 1) for k in keys}
    if kind == "array":
        low = schema.get("minItems", 0)
        return [instance(schema["items"], root, rng, depth + 1) for _ in range(rng.randint(low, low + 3))]
    if kind == "string" and "examples" in schema:
        return rng.choice(schema["examples"])
    if kind == "string":
        return "".join(rng.choice('ab "\\/\n\té€😀') for _ in range(rng.randint(schema.get("minLength", 0), 6)))
    if kind == "integer":
        step = schema.get("multipleOf", 1)
        return step * rng.randint(-(-schema.get("minimum", -50) // step), schema.get("maximum", 200) // step)
    if kind == "number":
        return rng.choice([0.75, 3.25, 12, 1e-3 + 0.5001])
    return None if kind == "null" else rng.choice([True, False])


@pytest.mark.parametrize("seed", range(25))
def test_every_prefix_of_an_instance_is_completed_into_an_instance(seed):
    rng = random.Random(seed)
    schema = strict(SCHEMAS[seed % len(SCHEMAS)])
    value = instance(schema, schema, rng)
    text = json.dumps(value, ensure_ascii=bool(seed % 3))
    for cut in range(len(text) + 1):
        prefix = JsonPrefix()
        prefix.feed(text[:cut])
        rest = closing(prefix, schema)
        assert rest is not None, text[:cut]
        jsonschema.validate(json.loads(text[:cut] + rest), schema, format_checker=jsonschema.FormatChecker())
    whole = JsonPrefix()
    whole.feed(text)
    assert closing(whole, schema) == ""


def test_shortest_values():
    assert json.loads(minimal(PERSON, PERSON)) == {"name": "aa", "age": 18, "mood": "sad", "tags": ["", ""]}
    assert minimal(LIST, LIST) == "[10, 10, 10]"
    assert minimal({"type": "number", "exclusiveMinimum": 0.5, "maximum": 0.75}, {}) == "0.75"
    assert minimal({"type": ["string", "null"]}, {}) == '""'
    assert minimal({"type": "string", "pattern": "^[a-z]+$"}, {}) == '"a"'
    assert minimal({"type": "string", "pattern": "^[A-Z]{2}(-[0-9]{2,}|x)$"}, {}) == '"AAx"'
    assert minimal({"type": "string", "format": "date"}, {}) == '"2000-01-01"'
    assert minimal({"type": "string", "pattern": r"^(ab)\1$"}, {}) is None  # a back-reference: not read here
    assert {'"tags": ["", ""]', '"kind": "cat"', '""'} <= set(members(PERSON))


def test_a_key_is_finished_as_a_property_and_a_number_within_its_bounds():
    def close(text, schema=PERSON):
        prefix = JsonPrefix()
        prefix.feed(text)
        return closing(prefix, strict(schema))

    assert close('{"na') == 'me": "aa", "age": 18, "mood": "sad", "tags": ["", ""]}'
    assert close('{"name": "Bo", "age": 3') == '0, "mood": "sad", "tags": ["", ""]}'
    assert close('{"name": "Bo", "age": 33, "mood": "h') == 'appy", "tags": ["", ""]}'
    assert close('{"name": "Bo", "age": 33, "mood": "x') is None  # no such option: the grammar refused it already


def test_strict_closes_objects_that_say_nothing_of_other_properties():
    schema = strict({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {}}},
                                                      "c": {"type": "object"},
                                                      "d": {"type": "object", "properties": {},
                                                            "additionalProperties": {"type": "integer"}},
                                                      "e": {"allOf": [{"properties": {"p": {}}},
                                                                      {"properties": {"q": {}}}]},
                                                      "f": {"properties": {"g": {}}, "anyOf": [{"required": ["g"]}]}},
                     "$defs": {"x": {"properties": {"y": {}}}}})
    assert schema["additionalProperties"] is False
    assert schema["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in schema["properties"]["c"]  # a bare object stays any object
    assert schema["properties"]["d"]["additionalProperties"] == {"type": "integer"}
    assert schema["$defs"]["x"]["additionalProperties"] is False
    e = schema["properties"]["e"]
    assert "additionalProperties" not in e and all("additionalProperties" not in part for part in e["allOf"])
    assert "additionalProperties" not in schema["properties"]["f"]["anyOf"][0]  # it names no properties
    assert schema["properties"]["f"]["additionalProperties"] is False
    jsonschema.validate({"a": {"b": 1}, "e": {"p": 1, "q": 2}, "f": {"g": 0}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"a": {"b": 1, "z": 2}}, schema)


def test_an_untrusted_pattern_cannot_stall_the_closing():
    """Patterns come from requests and strings from the model: a pattern that could backtrack without end
    (a repeat inside a repeat; Python's re takes ~2^40 steps on this one) is run through an automaton,
    which never backtracks; a huge repeat or a long string is not ended here (None: nothing is forced)."""
    from byzantium.engine.json_schema.strings import pattern_automaton, string_ending
    assert string_ending("a" * 40 + "!", {"pattern": "^(a+)+$"}) is None
    assert string_ending("a" * 40, {"pattern": "^(a+)+$"}) == ""
    assert pattern_automaton("a{100000}") is None and string_ending("", {"pattern": "^a{100000}$"}) is None
    assert string_ending("A" * 80, {"pattern": "^[A-Z]+$"}) is None
    assert string_ending("AB1", {"pattern": "^[A-Z]{2}[0-9]{2}$"}) == "0"


PATTERNS = [("^[A-Z]{2}-[0-9]{3}$", 0, ["AB-123", "ZZ-000"]),
            ("^(x|[a-z]+-[0-9]+)$", 0, ["x", "abc-42"]),
            ("^(ab|cde)+$", 7, ["ababcde", "cdecdecde"]),  # the shortest ending reaches minLength
            ("^[a-z]+$", 5, ["hello", "abcdefgh"]),
            (r'^a"b\\c[0-9]*\n?$', 0, ['a"b\\c', 'a"b\\c12\n']),  # a quote, a backslash, a control character
            (r"^\d{4}-\d{2}(-\d{2})?$", 0, ["2024-02", "2024-02-29"]),
            ("^caf\u00e9 [^ ]+$", 0, ["caf\u00e9 \U0001F600"]),
            ("(?i)^[a-z]+$", 3, ["Hello", "abcDEF"]),  # inline flags: case-insensitive, dot-all, verbose, scoped
            ("(?s)^<.{1,5}>$", 0, ["<a\nb>", "<\n>"]),
            ("(?x) ^ [A-Z]{2} - [0-9]+ $  # a code", 0, ["AB-12"]),
            ("^id-(?i:[a-f]+)-[0-9]$", 0, ["id-aBc-7"])]


@pytest.mark.parametrize("pattern, least, values", PATTERNS)
def test_a_pattern_string_closes_to_a_match_from_every_prefix(pattern, least, values):
    """A property with a pattern (and a minLength), cut anywhere in its instances as the grammar writes
    them: the closing completes it into a string the pattern matches (re.fullmatch), escaped as JSON."""
    import re
    schema = strict({"type": "object", "properties": {"k": {"type": "string", "pattern": pattern,
                                                            "minLength": least}}, "required": ["k"]})
    for value in values:
        text = json.dumps({"k": value}, ensure_ascii=False)
        for cut in range(len(text) + 1):
            prefix = JsonPrefix()
            prefix.feed(text[:cut])
            rest = closing(prefix, schema)
            assert rest is not None, text[:cut]
            string = json.loads(text[:cut] + rest)["k"]
            assert re.fullmatch(pattern, string) and len(string) >= least, (text[:cut], rest)
            jsonschema.validate({"k": string}, schema)
    shortest = json.loads(minimal(schema, schema))["k"]
    assert re.fullmatch(pattern, shortest) and len(shortest) >= least
    assert len(shortest) <= min(len(v) for v in values)  # no instance above is shorter


def test_a_pattern_the_automaton_does_not_read_gets_no_closing_as_before():
    """A pattern the automaton does not read (a back-reference, look-around, \\b, \\p{..}, a ^ or $
    under (?m)) gives no closing wherever the string is open: None, so nothing is forced, as a back-reference
    always gave."""
    from byzantium.engine.json_schema.strings import pattern_automaton, string_ending
    for pattern in [r"^(ab)\1$", r"^(?=a)a+$", r"^\ba$", r"^\p{L}+$", r"(?m)^[a-z]+$"]:
        assert pattern_automaton(pattern) is None, pattern
        schema = {"type": "object", "properties": {"k": {"type": "string", "pattern": pattern}}, "required": ["k"]}
        for text in ['{"k": "', '{"k": "a', '{"k', "{"]:
            prefix = JsonPrefix()
            prefix.feed(text)
            assert closing(prefix, schema) is None, (pattern, text)
        assert string_ending("", schema["properties"]["k"]) is None
        assert minimal(schema, schema) is None and '"k": ' in members(schema)
        written = JsonPrefix()
        written.feed('{"k": "ab"}')
        assert closing(written, schema) == ""  # a whole value still needs nothing
