"""json_closing: the shortest text that completes a prefix of JSON, checked on every prefix of random JSON
values written as the JSON mode grammar writes them."""
import json
import random

import pytest

from byzantium.engine.json_closing import closing_text


def random_value(rng, depth=0):
    kind = rng.choice(["obj", "list", "str", "num", "lit"] if depth < 4 else ["str", "num", "lit"])
    if kind == "obj":
        return {random_string(rng): random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "str":
        return random_string(rng)
    if kind == "num":
        return rng.choice([0, -7, 12, 3.25, -0.5, 1e-7, 6.02e23])
    return rng.choice([True, False, None])


def random_string(rng):
    return "".join(rng.choice('ab "\\/\n\té€😀') for _ in range(rng.randint(0, 5)))


@pytest.mark.parametrize("seed", range(40))
def test_every_prefix_of_json_is_completed_into_json(seed):
    rng = random.Random(seed)
    value = {"v": random_value(rng)} if seed % 2 else random_value(rng)
    text = json.dumps(value, ensure_ascii=bool(seed % 3))
    for cut in range(len(text) + 1):
        closing = closing_text(text[:cut])
        assert closing is not None, text[:cut]
        json.loads(text[:cut] + closing)
    assert closing_text(text) == ""


def test_what_is_filled_in():
    assert closing_text("") == "{}"
    assert closing_text('{"a') == '": 0}'
    assert closing_text('{"a": [1, ') == "0]}"
    assert closing_text('{"a": 1,') == ' "": 0}'
    assert closing_text('{"a": "x\\u00') == '00"}'
    assert closing_text('{"a": tr') == "ue}"
    assert closing_text('{"a": 1.') == "0}"


@pytest.mark.parametrize("text", ["}", '{"a"}', '{"a": 1}x', "{,", '{"a": tx', '{"a": 1 2', '["\\uZZ'])
def test_what_is_not_json_gets_nothing(text):
    assert closing_text(text) is None
