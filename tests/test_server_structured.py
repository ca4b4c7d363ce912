"""Structured outputs through the server, with the official client: response_format json_schema gives
schema-valid JSON on the embedded model at temperature 0 and 1 (every one of 20 prompts), guided_choice
and guided_regex hold, and bad or conflicting constraints are 400s naming their field.

JSON mode without a schema (json_object) gives a JSON object every time too: the 135M model often writes
an object that would not close before max_tokens, and the engine makes it close within its budget
(finish_reason "length"; engine/json_closing.py), and so does a schema that bounds nothing
(engine/json_schema/)."""
import json
import re

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("llguidance")

from test_server import MODEL, build, serve  # noqa: E402
from test_server import llm  # noqa: E402,F401  (the module's served model)

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "mood": {"enum": ["happy", "sad", "calm"]},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3}},
          "required": ["name", "age", "mood"], "additionalProperties": False}
TOPICS = ["a pirate", "a teacher", "a robot", "a farmer", "a dancer", "a chef", "a pilot", "a poet", "a nurse",
          "a painter", "a sailor", "a judge", "a baker", "a miner", "a singer", "a doctor", "a student", "a monk",
          "a clown", "a knight"]


@pytest.fixture(scope="module")
def client(llm):  # noqa: F811
    with serve(build(llm)) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="anything", max_retries=0, timeout=300)


def valid(person):
    assert set(person) <= set(SCHEMA["properties"]) and {"name", "age", "mood"} <= set(person)
    assert isinstance(person["name"], str) and len(person["name"]) <= 20
    assert isinstance(person["age"], int) and 0 <= person["age"] <= 120
    assert person["mood"] in ("happy", "sad", "calm")
    assert all(isinstance(t, str) for t in person.get("tags", [])) and len(person.get("tags", [])) <= 3
    return True


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_gives_valid_json_every_time(client, temperature):
    format_ = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    for i, topic in enumerate(TOPICS):
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Describe {topic} as a JSON object."}],
            response_format=format_, temperature=temperature, seed=i, max_tokens=160)
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", (topic, choice.message.content)
        assert valid(json.loads(choice.message.content))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_object_gives_a_json_object_every_time(client, temperature):
    for i, topic in enumerate(TOPICS):
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Give {topic}'s name and age as JSON."}],
            response_format={"type": "json_object"}, temperature=temperature, seed=i, max_tokens=48)
        choice = reply.choices[0]
        assert isinstance(json.loads(choice.message.content), dict), choice.message.content
        assert choice.finish_reason in ("stop", "length")  # "length": closed by its budget (json_closing.py)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_schema_that_bounds_nothing_gives_an_instance_every_time(client, temperature):
    """Strings and lists of any length and other properties not excluded: the objects take only the
    properties they name (strict_schema.py), and an answer that would run past max_tokens is closed as an
    instance (json_schema/)."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"title": {"type": "string"}, "year": {"type": "integer"},
                                               "genres": {"type": "array", "items": {"type": "string"}},
                                               "plot": {"type": "string"}},
              "required": ["title", "year", "genres", "plot"]}
    format_ = {"type": "json_schema", "json_schema": {"name": "movie", "schema": schema}}
    lengths = set()
    for i, topic in enumerate(TOPICS):
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Describe a movie about {topic} as JSON."}],
            response_format=format_, temperature=temperature, seed=i, max_tokens=48)
        choice = reply.choices[0]
        value = json.loads(choice.message.content)
        jsonschema.validate(value, schema)
        assert set(value) == set(schema["properties"]), choice.message.content
        lengths.add(choice.finish_reason)
    assert lengths <= {"stop", "length"} and "length" in lengths  # some were closed by their budget


def test_guided_choice_and_regex(client):
    reply = client.completions.create(model=MODEL, prompt="Is the sky green? Answer:", max_tokens=8, temperature=1.0,
                                      seed=3, extra_body={"guided_choice": ["yes", "no", "maybe"]})
    assert reply.choices[0].text in ("yes", "no", "maybe")
    reply = client.completions.create(model=MODEL, prompt="A date:", max_tokens=16, temperature=1.0, seed=4,
                                      extra_body={"guided_regex": r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"})
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", reply.choices[0].text)


def test_bad_and_conflicting_constraints_are_400s_naming_their_field(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                       response_format={"type": "json_object"}, extra_body={"guided_regex": "a+"})
    assert error.value.body["param"] == "guided_regex"
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                       response_format={"type": "json_schema", "json_schema": {"name": "x"}})
    assert error.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=MODEL, prompt="x", max_tokens=4, extra_body={"guided_regex": "(unclosed"})
    assert "regex" in error.value.body["message"].lower() or error.value.body["param"] == "guided_regex"
