"""Structured outputs (engine/grammar.py): SamplingParams json_schema / json_object / regex / choice /
grammar, enforced while decoding by llguidance's masks.

The parameter checks and the mask arithmetic need no grammar library; the rest runs the embedded
SmolLM2 and needs llguidance (the `structured` extra, in the test extra too), and says so when it is
missing."""
import json
import re
import sys
from types import SimpleNamespace

import pytest
import torch

from byzantium import SamplingParams
from byzantium.engine import grammar
from byzantium.engine.grammar import INSTALL, apply_bitmask

needs_llguidance = pytest.mark.skipif(
    not grammar.available(),
    reason="llguidance is not installed (pip install 'byzantium[structured]'); without it a constrained request "
           "is refused with an ImportError, which test_without_the_library checks")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,8}$"}, "minItems": 1,
                 "maxItems": 3},
    },
    "required": ["name", "age", "role", "tags"],
    "additionalProperties": False,
}
TOPICS = ["a cat", "a city", "a book", "a car", "a planet", "a song", "a tree", "a river", "a chef", "a robot",
          "a movie", "a bird", "a house", "a game", "a phone", "a school", "a ship", "a storm", "a garden", "a coin"]


def validate(instance, schema):
    """jsonschema's verdict where it is installed, else a check of the parts of SCHEMA used here."""
    try:
        import jsonschema
    except ImportError:
        jsonschema = None
    if jsonschema is not None:
        jsonschema.validate(instance, schema)
        return
    assert isinstance(instance, dict) and set(instance) == set(schema["required"])
    props = schema["properties"]
    assert isinstance(instance["name"], str) and 1 <= len(instance["name"]) <= 16
    assert isinstance(instance["age"], int) and not isinstance(instance["age"], bool) and 0 <= instance["age"] <= 120
    assert instance["role"] in props["role"]["enum"]
    assert 1 <= len(instance["tags"]) <= 3 and all(re.fullmatch("[a-z]{1,8}", t) for t in instance["tags"])


def chat(engine, text):
    return engine.render_chat([{"role": "user", "content": text}])


# -- no grammar library needed ------------------------------------------------------------------------
def test_params_take_one_constraint():
    assert SamplingParams().structured is None
    assert SamplingParams(json_schema=SCHEMA).structured == ("json_schema", json.dumps(SCHEMA))
    assert SamplingParams(json_schema=json.dumps(SCHEMA)).structured == ("json_schema", json.dumps(SCHEMA))
    assert SamplingParams(json_object=True).structured == ("json_schema", '{"type": "object"}')
    assert SamplingParams(regex=r"\d+").structured == ("regex", r"\d+")
    assert SamplingParams(choice=("yes", "no")).structured == ("choice", '["yes", "no"]')
    assert SamplingParams(grammar='start: "a"').structured == ("grammar", 'start: "a"')
    with pytest.raises(ValueError, match="at most one of .* got json_schema and regex"):
        SamplingParams(json_schema=SCHEMA, regex="a")
    with pytest.raises(ValueError, match="json_object and choice"):
        SamplingParams(json_object=True, choice=["a"])
    for bad in [dict(json_schema="{not json"), dict(json_schema="[1]"), dict(json_schema=3), dict(regex=""),
                dict(choice=[]), dict(choice="yes"), dict(choice=["a", ""]), dict(choice=3), dict(grammar=""),
                dict(json_object=1), dict(json_schema={"enum": {1, 2}})]:
        with pytest.raises(ValueError):
            SamplingParams(**bad)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_apply_bitmask_masks_only_its_rows(device, monkeypatch):
    vocab = 1000  # not a multiple of 32: the last word's high bits name no token
    g = torch.Generator().manual_seed(0)
    bitmask = torch.randint(-2 ** 31, 2 ** 31 - 1, (3, 32), dtype=torch.int32, generator=g)
    logits = torch.randn(5, vocab, generator=g).to(device)
    rows = [4, 0, 2]
    expected = logits.clone()
    for j, i in enumerate(rows):
        allowed = torch.tensor([(int(bitmask[j, t // 32]) >> (t % 32)) & 1 for t in range(vocab)], dtype=torch.bool)
        expected[i, ~allowed.to(device)] = float("-inf")
    assert torch.equal(apply_bitmask(logits, (rows, bitmask)), expected)
    # every row constrained, in order: the same numbers as through the partial path
    every = apply_bitmask(logits[:3], ([0, 1, 2], bitmask))
    for j in range(3):
        assert torch.equal(every[j], apply_bitmask(logits[j:j + 1], ([0], bitmask[j:j + 1]))[0])
    # the torch unpacking (CUDA's, and big-endian hosts') equals numpy's
    monkeypatch.setattr(grammar, "sys", SimpleNamespace(byteorder="big"))
    assert torch.equal(apply_bitmask(logits, (rows, bitmask)), expected)


def test_samplers_refuse_a_constraint_they_are_not_given_masks_for():
    from byzantium.engine.sampling import cpu as sampling
    from byzantium.engine.sampling import cuda as device_sampling
    request = SimpleNamespace(params=SamplingParams(regex="a+"), generator=None, output_ids=[])
    for sample in (sampling.sample, device_sampling.sample):
        with pytest.raises(ValueError, match="enforced by the byzantium engine"):
            sample(torch.zeros(1, 8), [request])


def test_both_samplers_draw_only_allowed_tokens():
    """The CPU sampler and the device sampler (run here on CPU tensors) take the same masks: every token drawn
    is allowed, both draw the same token for the same row, the unconstrained rows draw what they draw without
    masks, and logprobs are the model's (unmasked) ones."""
    from byzantium.engine.sampling import cpu as sampling
    from byzantium.engine.sampling import cuda as device_sampling
    vocab, n = 300, 6
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(n, vocab, generator=g) * 3
    params = [SamplingParams(), SamplingParams(temperature=1.0, seed=1, logprobs=2),
              SamplingParams(temperature=0.8, top_k=20, seed=2), SamplingParams(temperature=1.2, top_p=0.9, seed=3),
              SamplingParams(temperature=1.0, seed=4, presence_penalty=0.5), SamplingParams(logprobs=0)]
    requests = [SimpleNamespace(params=p, generator=None, output_ids=[5, 7]) for p in params]
    rows = [0, 1, 3, 4]
    bitmask = torch.zeros(len(rows), (vocab + 31) // 32, dtype=torch.int32)
    allowed = {}
    for j, i in enumerate(rows):
        allowed[i] = sorted(torch.randperm(vocab, generator=g)[:1 + 5 * j].tolist())
        for t in allowed[i]:
            bitmask[j, t // 32] |= torch.tensor(1 << (t % 32)).to(torch.int32)
    free_tokens, _ = sampling.sample(logits, requests)
    for sample in (sampling.sample, device_sampling.sample):
        tokens, logprobs = sample(logits, requests, (rows, bitmask))
        for i in rows:
            assert tokens[i] in allowed[i]
        for i in set(range(n)) - set(rows):
            assert tokens[i] == free_tokens[i]
        raw = torch.log_softmax(logits[1], -1)
        assert logprobs[1][tokens[1]] == pytest.approx(float(raw[tokens[1]]), abs=1e-5)
        assert set(logprobs[1]) >= set(raw.topk(2).indices.tolist())
        if sample is sampling.sample:
            cpu_tokens = tokens
    assert tokens == cpu_tokens


def test_without_the_library(monkeypatch):
    """A missing llguidance: constrained requests fail with how to install it; nothing else needs it."""
    monkeypatch.setitem(sys.modules, "llguidance", None)  # `import llguidance` raises ImportError
    assert not grammar.available()
    grammars = grammar.Grammars(None, 100, {0})
    assert grammars.start(SamplingParams()) is None
    with pytest.raises(ImportError, match=re.escape("pip install 'byzantium[structured]'")):
        grammars.start(SamplingParams(json_object=True))
    assert "llguidance" in INSTALL


# -- with llguidance, on the embedded model ----------------------------------------------------------
@pytest.fixture(scope="module")
def engine(smollm2_engine):
    if not grammar.available():
        pytest.skip("llguidance is not installed: pip install 'byzantium[structured]'")
    return smollm2_engine


@needs_llguidance
def test_matcher_allows_eos_only_when_complete(smollm2_dir):
    from byzantium.engine.loader import load_tokenizer
    tokenizer = load_tokenizer(smollm2_dir)
    grammars = grammar.Grammars(tokenizer, 49152, {2})
    params = SamplingParams(json_schema=SCHEMA, max_tokens=1000)
    state = grammar.Grammars.start(grammars, params)
    request = SimpleNamespace(grammar=state, output_ids=[], num_output=0, params=params)  # far from its budget

    def allowed():
        (_,), bitmask = grammar.masks([request], 49152)
        bits = [(int(bitmask[0, t // 32]) >> (t % 32)) & 1 for t in range(49152)]
        return {t for t, b in enumerate(bits) if b}

    first = allowed()
    assert first and 2 not in first and all(tokenizer.decode([t]).startswith("{") for t in first)
    text = '{"name": "Ann", "age": 7, "role": "user", "tags": ["a"]'
    ids = tokenizer.encode(text)
    assert state.valid_prefix(ids) == len(ids)
    grammar.advance([request] * len(ids), ids)
    assert not state.ended and 2 not in allowed()
    grammar.advance([request], tokenizer.encode("}"))
    assert state.ended and state.error is None and allowed() == {2}
    # the compiled grammar is cached per constraint; each request gets its own copy
    assert len(grammars.compiled) == 1
    other = grammars.start(SamplingParams(json_schema=json.dumps(SCHEMA)))
    assert len(grammars.compiled) == 1 and other.matcher is not state.matcher and not other.ended


@needs_llguidance
def test_bad_constraints_fail_when_added(engine):
    for params in [SamplingParams(regex="(unclosed"), SamplingParams(json_schema={"type": "no-such-type"}),
                   SamplingParams(grammar="start: undefined_rule")]:
        with pytest.raises(ValueError, match="invalid"):
            engine.add_request("Hello", params)
    assert not engine.has_work()


@needs_llguidance
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_outputs_are_valid(engine, temperature):
    prompts = [chat(engine, f"Describe {t} as a person record in JSON: name, age, role and tags.") for t in TOPICS]
    params = [SamplingParams(max_tokens=160, temperature=temperature, seed=i, json_schema=SCHEMA)
              for i in range(len(prompts))]
    outs = engine.generate(prompts, params)
    for out in outs:
        assert out.finish_reason == "stop", out.text
        validate(json.loads(out.text), SCHEMA)


@needs_llguidance
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_object_outputs_always_parse(engine, temperature):
    """JSON mode: every output is a JSON object. Free JSON has no bound on its length, and this 135M model
    often loops inside one ("a sleek exterior, a sleek exterior, ..."), so a request whose budget is
    about to run out is made to close what it opened (json_closing.py); it then ends as "length", a few
    tokens early, and still parses. Short budgets make most of these 20 prompts close that way."""
    prompts = [chat(engine, f"Give a JSON object with two short fields about {t}.") for t in TOPICS]
    outs = engine.generate(prompts, [SamplingParams(max_tokens=40, temperature=temperature, seed=i, json_object=True)
                                     for i in range(len(prompts))])
    closed = 0
    for out in outs:
        assert isinstance(json.loads(out.text), dict), out.text
        assert out.finish_reason in ("stop", "length") and len(out.token_ids) <= 40
        closed += out.finish_reason == "length"
    assert closed > 0  # the closing was exercised, not only objects the model ended itself


# A schema as users write it: other properties not excluded, strings and lists unbounded
LOOSE = {"type": "object",
         "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 1},
                        "hobbies": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                        "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                                     "zip": {"type": "string"}},
                                    "required": ["city", "zip"]}},
         "required": ["name", "age", "hobbies", "address"]}


@needs_llguidance
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_outputs_close_within_their_budget(engine, temperature):
    """A schema that bounds nothing, on budgets too short for most answers: every output is still an
    instance of it (json_schema/), with no property the schema does not name (strict_schema.py)."""
    jsonschema = pytest.importorskip("jsonschema")
    prompts = [chat(engine, f"Describe {t} as a person in JSON.") for t in TOPICS]
    outs = engine.generate(prompts, [SamplingParams(max_tokens=36, temperature=temperature, seed=i, json_schema=LOOSE)
                                     for i in range(len(prompts))])
    closed = 0
    for out in outs:
        value = json.loads(out.text)
        jsonschema.validate(value, LOOSE)
        assert set(value) <= set(LOOSE["properties"]) and set(value["address"]) <= {"city", "zip"}, out.text
        assert out.finish_reason in ("stop", "length") and len(out.token_ids) <= 36
        closed += out.finish_reason == "length"
    assert closed > 0


# as the grammar writes JSON: \u escapes only for control characters, other characters as they are; a
# schema's properties in the schema's order
FREE_JSON = [{"name": 'Ann "the" \u00e9\x01 x', "n": -1.5e3, "ok": True, "none": None,
              "tags": ["a", [], {}, [1, {"b": False}]], "deep": {"x": {"y": ["z\n"]}}},
             {"k": "caf\u00e9 na\u00efve \U0001F600"}]
CODES = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"},
                                         "tag": {"type": "string", "pattern": "^(x|[a-z]+-[0-9]+)$"},
                                         "day": {"type": "string", "format": "date"},
                                         "id": {"type": "string", "format": "uuid"}},
         "required": ["code", "tag", "day", "id"]}
CODES_INSTANCES = [{"code": "AB12", "tag": "ab-7", "day": "2024-02-29", "id": "123e4567-e89b-12d3-a456-426614174000"}]
LOOSE_INSTANCES = [{"name": 'Ann "the" \u00e9', "age": 7, "hobbies": ["chess", "", "caf\u00e9 \U0001F600"],
                    "address": {"city": "Oslo", "zip": "0150"}},
                   {"name": "", "age": 120, "hobbies": ["a"], "address": {"city": "x\n", "zip": ""}}]


@needs_llguidance
@pytest.mark.parametrize("mode", ["json_object", "json_schema", "patterns"])
def test_closing_tokens_are_ones_the_grammar_accepts(smollm2_dir, mode):
    """At every prefix of real JSON texts (JSON mode) and of instances of schemas (strings free, or with
    patterns and formats), the closing the budget would force is accepted by the grammar from that point,
    leaves it complete, and is JSON (an instance of the schema)."""
    jsonschema = pytest.importorskip("jsonschema")
    from byzantium.engine.loader import load_tokenizer
    tokenizer = load_tokenizer(smollm2_dir)
    grammars = grammar.Grammars(tokenizer, 49152, {2})
    schema, values = {"json_object": ({"type": "object"}, FREE_JSON), "json_schema": (LOOSE, LOOSE_INSTANCES),
                      "patterns": (CODES, CODES_INSTANCES)}[mode]
    params = SamplingParams(json_object=True) if mode == "json_object" else SamplingParams(json_schema=schema)

    def closing_when_due(state, ids):  # at the most tokens left at which it is forced
        for left in range(1, 128):
            state.closer.wait = 0  # as if first asked with `left` tokens left
            closing = state.closer.closing_tokens(ids, left)
            if closing:
                return closing
        return None

    checked = 0
    for value in values:
        ids = tokenizer.encode(json.dumps(value, ensure_ascii=False), add_special_tokens=False)
        for cut in range(len(ids)):
            state = grammars.start(params)
            for token in ids[:cut]:
                state.advance(token)
            assert state.error is None, (cut, value)
            closing = closing_when_due(state, ids[:cut])
            assert closing, (cut, value)
            if state.valid_prefix(closing) != len(closing):  # only where the cut splits a character (nothing forced)
                assert tokenizer.decode(ids[:cut]).endswith("\ufffd"), (tokenizer.decode(ids[:cut]), closing)
                assert state.forced_token(SimpleNamespace(output_ids=ids[:cut], num_output=cut,
                                                          params=SamplingParams(max_tokens=cut + 1))) is None
                continue
            for token in closing:
                state.advance(token)
            assert state.ended, tokenizer.decode(ids[:cut] + closing)
            jsonschema.validate(json.loads(tokenizer.decode(ids[:cut] + closing)), schema,
                                format_checker=jsonschema.FormatChecker())
            checked += 1
    assert checked > 40


@needs_llguidance
def test_regex_choice_and_grammar(engine):
    phone = r"\(\d{3}\) \d{3}-\d{4}"
    colors = ["red", "green", "blue", "dark violet"]
    prompts = [chat(engine, "What is the phone number of the city library?"),
               chat(engine, "What color is the sky?"), chat(engine, "Name a color of a plum."),
               chat(engine, "Greet me.")] * 2
    params = [SamplingParams(max_tokens=32, regex=phone), SamplingParams(max_tokens=16, choice=colors),
              SamplingParams(max_tokens=16, choice=colors),
              SamplingParams(max_tokens=16, grammar='start: ("hi" | "hello") " " NAME "!"\nNAME: /[A-Z][a-z]{1,8}/')]
    params += [SamplingParams(max_tokens=32, temperature=1.0, seed=3, regex=phone),
               SamplingParams(max_tokens=16, temperature=1.0, seed=4, choice=colors),
               SamplingParams(max_tokens=16, temperature=1.0, seed=5, choice=colors),
               SamplingParams(max_tokens=16, temperature=1.0, seed=6, grammar='start: "yes" | "no"')]
    outs = engine.generate(prompts, params)
    assert all(out.finish_reason == "stop" for out in outs), [out.text for out in outs]
    assert re.fullmatch(phone, outs[0].text) and re.fullmatch(phone, outs[4].text)
    assert {outs[1].text, outs[2].text, outs[5].text, outs[6].text} <= set(colors)
    assert re.fullmatch(r"(hi|hello) [A-Z][a-z]{1,8}!", outs[3].text)
    assert outs[7].text in ("yes", "no")


@needs_llguidance
def test_unconstrained_rows_unchanged_by_constrained_neighbours(engine):
    """A batch that mixes constrained and plain requests gives each what it gets alone: the plain rows'
    logits are untouched. Identical prompts ride on one another (scheduler.riding) across the constraint:
    each samples from the shared logits with its own mask, and parts when its token differs."""
    question = chat(engine, "List three facts about the moon.")
    other = chat(engine, "Write a JSON object describing a dog.")
    plain = [SamplingParams(max_tokens=20), SamplingParams(max_tokens=20, temperature=1.0, seed=7)]
    constrained = [SamplingParams(max_tokens=20, json_schema=SCHEMA),
                   SamplingParams(max_tokens=20, temperature=1.0, seed=8, json_object=True),
                   SamplingParams(max_tokens=20, regex="[A-Z][a-z ]{3,40}\\.")]
    batch = [(question, plain[0]), (question, constrained[2]), (other, constrained[0]), (other, plain[1]),
             (other, constrained[1])]
    alone = [engine.generate(p, s)[0].token_ids for p, s in batch]
    engine.reset_stats()
    together = engine.generate([p for p, _ in batch], [s for _, s in batch])
    assert [o.token_ids for o in together] == alone
    assert engine.stats["shared_prefill_tokens"] > 0  # the identical prompts did ride together


@needs_llguidance
def test_speculation_gives_the_tokens_plain_decoding_gives(engine, smollm2_dir):
    """With prompt-lookup drafts (the CPU default) constrained requests get the tokens they get without:
    drafts the grammar refuses are cut, the others kept only while they equal the masked sample."""
    from byzantium import Engine
    assert engine.drafter is not None
    record = {"name": "Ann", "age": 41, "role": "admin", "tags": ["red", "blue"]}
    prompts = [chat(engine, f"Copy this record exactly: {json.dumps(record)}"),
               chat(engine, f"Copy this record, with the age 30: {json.dumps(record)}"),
               chat(engine, "Repeat: the phone is (555) 123-4567, the phone is (555) 123-4567.")]
    params = [SamplingParams(max_tokens=48, json_schema=SCHEMA),
              SamplingParams(max_tokens=48, temperature=1.0, seed=11, json_schema=SCHEMA),
              SamplingParams(max_tokens=24, temperature=0.7, seed=12, regex=r"the phone is \(\d{3}\) \d{3}-\d{4}")]
    engine.reset_stats()
    speculative = engine.generate(prompts, params)
    assert engine.stats["accepted_draft_tokens"] > 0
    plain_engine = Engine(smollm2_dir, num_blocks=256, num_speculative_tokens=0)
    assert plain_engine.drafter is None
    assert [o.token_ids for o in plain_engine.generate(prompts, params)] == [o.token_ids for o in speculative]


@needs_llguidance
def test_sessions_and_logprobs(engine):
    """A session's constrained turn, then a plain one (the grammar belongs to its turn); logprobs report the
    model's distribution, not the masked one."""
    session = engine.open_session(chat(engine, "Answer yes or no: is water wet?"))
    try:
        first = engine.continue_(session, SamplingParams(max_tokens=8, choice=["yes", "no"], logprobs=2))[0]
        assert first.text in ("yes", "no") and first.finish_reason == "stop"
        token = first.token_ids[0]
        logits = engine.logits(chat(engine, "Answer yes or no: is water wet?"))[0]
        assert first.logprobs[0][token] == pytest.approx(float(torch.log_softmax(logits, -1)[token]), abs=1e-4)
        engine.extend(session, " Why?")
        second = engine.continue_(session, SamplingParams(max_tokens=8))[0]
        assert second.finish_reason in ("stop", "length") and session.seq.grammar is None
    finally:
        engine.close_session(session)

