"""Prompt-lookup speculation: the n-gram drafter, and on real engines (a tiny random Llama, the embedded
SmolLM2) that a speculating engine gives exactly the tokens (and log-probabilities) of one that decodes a
token a step, greedy and sampled, with stops, penalties, prefix-cache hits and sessions, while its drafts
are taken and steps saved."""
import pytest
import torch

from byzantium import Engine, SamplingParams
from byzantium.engine.sequence import Sequence
from byzantium.engine.speculation import PromptLookup

from conftest import random_prompts


def seq_of(tokens):
    return Sequence(0, list(tokens), SamplingParams())


def test_the_drafter_copies_what_followed_the_latest_occurrence_of_the_newest_ngram():
    drafter = PromptLookup(num_tokens=4, max_rows=32, min_n=2, max_n=3)
    seq = seq_of([1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3])
    assert drafter.propose(seq, 4) == [7, 8, 5, 1]  # the later [1, 2, 3] wins over the first
    assert drafter.propose(seq, 2) == [7, 8]
    seq.token_ids += [7, 8, 5]  # the index grows with the sequence
    assert drafter.propose(seq, 4) == [1, 2, 3, 7]
    assert drafter.propose(seq_of([4, 5, 6, 4, 5, 6]), 4) == [4, 5, 6]
    assert drafter.propose(seq_of([1, 2, 3, 4, 5, 6]), 4) == []  # no n-gram repeats
    assert drafter.propose(seq_of([5, 5]), 4) == []  # shorter than min_n + a continuation
    # The longest n-gram first: [2, 3] last followed 0, but [1, 2, 3] is followed by 4.
    assert drafter.propose(seq_of([1, 2, 3, 4, 6, 2, 3, 0, 1, 2, 3]), 1) == [4]
    seq = seq_of([1, 2, 3, 4, 1, 2, 3])
    assert drafter.propose(seq, 4) == [4, 1, 2, 3]
    seq.token_ids[:] = [1, 2]  # replaced by something shorter: indexed again from scratch
    assert drafter.propose(seq, 4) == []
    with pytest.raises(ValueError, match="prompt lookup"):
        PromptLookup(num_tokens=0, max_rows=32)


def pair(path, **kwargs):
    """The same model with and without speculation."""
    return (Engine(path, num_blocks=256, num_speculative_tokens=4, **kwargs),
            Engine(path, num_blocks=256, num_speculative_tokens=0, **kwargs))


def run(engine, prompts, params):
    outs = engine.generate(prompts, params)
    return [(o.token_ids, o.text, o.finish_reason, o.logprobs) for o in outs]


@pytest.fixture(scope="module")
def tiny_pair(tiny_llama):
    return pair(tiny_llama[1])


class Oracle(PromptLookup):
    """Drafts from a plain engine's replies (looked up by prompt), every third one made wrong: the steps
    then both accept and reject drafts, at any temperature."""

    def __init__(self, replies):
        super().__init__(num_tokens=4, max_rows=64)
        self.replies = replies

    def propose(self, seq, k):
        for prompt, reply in self.replies:
            if seq.token_ids[:len(prompt)] == prompt:
                done = len(seq.token_ids) - len(prompt)
                return [t if (done + i) % 3 else (t + 1) % 256 for i, t in enumerate(reply[done:done + k])]
        return []


PROMPTS = [[5, 6, 7, 8] * 6, [9, 10, 11] * 10 + [9], *random_prompts([7, 30, 61], seed=2)]


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=40, temperature=0.0),
    SamplingParams(max_tokens=40, temperature=0.8, seed=7, logprobs=3),
    SamplingParams(max_tokens=40, temperature=1.0, top_k=20, top_p=0.9, seed=3),
    SamplingParams(max_tokens=40, temperature=0.7, seed=5, frequency_penalty=0.5, presence_penalty=0.3),
    SamplingParams(max_tokens=23, temperature=0.9, seed=1, stop_token_ids=[17, 99, 140, 200]),
], ids=["greedy", "sampled-logprobs", "top-k-p", "penalties", "stop-ids"])
def test_verification_gives_the_tokens_of_plain_decoding_at_any_temperature(tiny_pair, params):
    spec, plain = tiny_pair
    expected = run(plain, PROMPTS, params)
    oracle = Oracle([(p, e[0]) for p, e in zip(PROMPTS, expected)])
    spec.drafter, real = oracle, spec.drafter
    spec.scheduler.drafter = oracle
    spec.reset_stats()
    try:
        assert run(spec, PROMPTS, params) == expected
    finally:
        spec.drafter = spec.scheduler.drafter = real
    s = spec.stats
    assert 0 < s["accepted_draft_tokens"] < s["draft_tokens"]  # drafts both taken and turned down


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=40, temperature=0.0),
    SamplingParams(max_tokens=23, temperature=0.0, stop_token_ids=[17, 99]),
], ids=["greedy", "stop-ids"])
def test_prompt_lookup_gives_the_tokens_of_plain_decoding_on_a_tiny_model(tiny_pair, params):
    spec, plain = tiny_pair
    spec.reset_stats()
    assert run(spec, PROMPTS, params) == run(plain, PROMPTS, params)
    assert spec.stats["accepted_draft_tokens"] > 0  # the random model's greedy loops are drafted


def test_a_speculating_step_counts_generated_tokens_and_saves_steps(tiny_pair):
    spec, plain = tiny_pair
    prompts = [[5, 6, 7, 8] * 6, [9, 10, 11] * 10]
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    for engine in (spec, plain):
        engine.reset_stats()
    assert run(spec, prompts, params) == run(plain, prompts, params)
    s, p = spec.stats, plain.stats
    # decode_tokens counts the tokens decode rows gave (a reply of k tokens: k - 1), not rejected drafts.
    assert s["decode_tokens"] == p["decode_tokens"] == 2 * 47
    assert s["accepted_draft_tokens"] <= s["draft_tokens"]
    assert s["steps"] < p["steps"]  # a step took more than one token of a request


def test_drafts_respect_max_tokens_the_row_cap_and_free_blocks(tiny_llama):
    engine = Engine(tiny_llama[1], num_blocks=256, num_speculative_tokens=4, speculative_max_rows=6)
    prompts = [[5, 6, 7, 8] * 6, [9, 10, 11] * 10, [3, 4] * 12]
    outs = engine.generate(prompts, SamplingParams(max_tokens=13, temperature=0.0, ignore_eos=True))
    assert all(len(o.token_ids) == 13 for o in outs)
    # Three requests decode together: at most 6 rows a step, drafts included.
    assert max(r.decode_tokens for r in engine.step_records.records) <= 6
    assert engine.stats["draft_tokens"] > 0
    # A pool with no room for drafts: nobody is preempted for them, and the tokens are the same.
    small = Engine(tiny_llama[1], num_blocks=6, block_size=16, num_speculative_tokens=4)
    plain = Engine(tiny_llama[1], num_blocks=6, block_size=16, num_speculative_tokens=0)
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    assert run(small, [[5, 6, 7] * 10], params) == run(plain, [[5, 6, 7] * 10], params)
    assert small.stats["preemptions"] == 0


def test_prefix_cache_hits_after_speculation_read_what_plain_decoding_wrote(tiny_pair):
    """A block filled by a step's drafts is not hashed (a rejected draft's K/V is overwritten later), so a
    request continuing a speculated reply finds only correct blocks: its tokens equal a plain engine's."""
    spec, plain = tiny_pair
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    prompt = [9, 10, 11, 12] * 5
    first = spec.generate([prompt], params)[0].token_ids
    assert first == plain.generate([prompt], params)[0].token_ids
    longer = prompt + first + [1, 2, 3]
    spec.reset_stats()
    assert run(spec, [longer], params) == run(plain, [longer], params)
    assert spec.stats["cached_tokens"] >= 4 * 16  # it did read the speculated reply's blocks


def test_sessions_speculate_and_keep_their_context(tiny_pair):
    spec, plain = tiny_pair
    params = SamplingParams(max_tokens=20, temperature=0.9, seed=11, ignore_eos=True)
    replies = []
    for engine in (spec, plain):
        session = engine.open_session([5, 6, 7, 8] * 4)
        turns = [engine.continue_([session], params)[0].token_ids]
        engine.extend(session, [5, 6, 7, 8, 5, 6])
        turns.append(engine.continue_([session], params)[0].token_ids)
        replies.append((turns, session.token_ids))
        engine.close_session(session)
    assert replies[0] == replies[1]


def test_speculation_on_smollm2_gives_the_tokens_of_plain_decoding(smollm2_dir):
    spec, plain = pair(smollm2_dir)
    prompts = [spec.chat_prompts([[{"role": "user", "content": c}]])[0] for c in (
        "Repeat this sentence three times: the cat sat on the mat.",
        "List the numbers from 1 to 20, separated by commas.",
        "Write one sentence about the sea.")]
    for params in (SamplingParams(max_tokens=48, temperature=0.0),
                   SamplingParams(max_tokens=48, temperature=0.7, seed=2, stop=["\n\n"])):
        spec.reset_stats()
        assert run(spec, prompts, params) == run(plain, prompts, params)
        assert spec.stats["accepted_draft_tokens"] > 0
    assert spec.describe()["speculation"]["num_speculative_tokens"] == 4
    assert plain.describe()["speculation"] is None


def test_bad_speculation_settings_are_refused_before_loading(tiny_llama):
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        Engine(tiny_llama[1], num_speculative_tokens=-1)
    with pytest.raises(ValueError, match="speculative_max_rows"):
        Engine(tiny_llama[1], speculative_max_rows=0)


# -- identical contexts computed once (scheduler.riding) ---------------------------------------------

def alone(make_engine, prompts, params):
    """Each request on its own engine: nothing to ride on, and no prefix another run cached (a cached prefix
    sends the rest of a prompt through another attention kernel: a short append runs row by row, up to a
    limit timed on the machine, and its last bits differ)."""
    return [run(make_engine(), [p], q)[0] for p, q in zip(prompts, params)]


@pytest.mark.parametrize("speculate", [0, 4])
def test_identical_requests_ride_on_one_row_and_get_their_own_tokens(tiny_llama, speculate):
    """Copies of one prompt: greedy ones stay together, sampled ones with other seeds part as they sample
    other tokens (mid-block: their block is copied), and requests with other limits stop on their own;
    every request's tokens are those it gets alone, with fewer rows computed."""
    engine = Engine(tiny_llama[1], num_blocks=256, num_speculative_tokens=speculate)
    prompt = random_prompts([21], seed=4)[0]
    params = [SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True),
              SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, logprobs=2),
              SamplingParams(max_tokens=17, temperature=0.0, ignore_eos=True),
              SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, stop_token_ids=[77, 130]),
              *[SamplingParams(max_tokens=40, temperature=0.9, seed=s, ignore_eos=True) for s in (1, 2, 3)],
              # penalties make greedy copies part after a while, each at its own token
              *[SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, frequency_penalty=f) for f in (0.5, 2.0)]]
    prompts = [prompt] * len(params) + [random_prompts([13], seed=5)[0]]
    params.append(SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    engine.reset_stats()
    together = run_each(engine, prompts, params)
    s = dict(engine.stats)
    assert together == alone(lambda: Engine(tiny_llama[1], num_blocks=256, num_speculative_tokens=speculate),
                             prompts, params)
    assert s["shared_decode_tokens"] > 3 * 16  # the greedy copies rode on one row
    # The stats count every request's tokens: a reply of k tokens, k - 1 of them from decoding.
    assert s["decode_tokens"] == sum(len(t[0]) - 1 for t in together)


def run_each(engine, prompts, params):
    outs = engine.generate(prompts, params)
    return [(o.token_ids, o.text, o.finish_reason, o.logprobs) for o in outs]


def test_riders_in_a_small_pool_get_their_own_tokens(tiny_llama):
    """Copies that part at different tokens (greedy, other penalties) in a pool too small for all of them:
    copies, preemptions and recomputes, and the tokens each request gets alone."""
    prompt = random_prompts([20], seed=6)[0]
    params = [SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, frequency_penalty=f)
              for f in (0.0, 0.5, 1.0, 2.0)]
    small = Engine(tiny_llama[1], num_blocks=6, block_size=16, num_speculative_tokens=0)
    assert run_each(small, [prompt] * 4, params) == alone(
        lambda: Engine(tiny_llama[1], num_blocks=256, num_speculative_tokens=0), [prompt] * 4, params)
    assert small.stats["shared_decode_tokens"] > 0 and small.stats["preemptions"] > 0


def test_unshare_copies_the_block_written_next_or_refuses_without_a_free_one():
    from byzantium.engine.kv_cache import BlockManager
    blocks = BlockManager(num_blocks=4, block_size=4)
    leader, rider = seq_of(list(range(10))), seq_of(list(range(10)))
    blocks.allocate(leader, 10)
    leader.num_computed = rider.num_computed = 9
    blocks.share(rider, leader)
    assert rider.block_table == leader.block_table and blocks.ref_counts[:3] == [2, 2, 2]
    copies = []
    assert blocks.unshare(rider, lambda src, dst: copies.append((src, dst)))
    # Position 9 lies in block 2: it is copied into the free block; blocks 0 and 1 stay shared.
    assert copies == [(leader.block_table[2], 3)] and rider.block_table == leader.block_table[:2] + [3]
    assert blocks.ref_counts == [2, 2, 1, 1] and blocks.num_free == 0
    other = seq_of(list(range(10)))
    other.num_computed = 9
    blocks.share(other, leader)
    assert not blocks.unshare(other, lambda src, dst: copies.append((src, dst)))  # nothing free: unchanged
    assert other.block_table == leader.block_table and len(copies) == 1


def test_a_prefix_cache_hit_after_riding_reads_the_right_blocks(tiny_llama):
    engine = Engine(tiny_llama[1], num_blocks=256)
    prompt = random_prompts([18], seed=7)[0]
    greedy = SamplingParams(max_tokens=45, temperature=0.0, ignore_eos=True)
    first = engine.generate([prompt] * 3, greedy)
    assert len({tuple(o.token_ids) for o in first}) == 1
    longer = prompt + first[0].token_ids + [3, 4]
    engine.reset_stats()
    again = run(engine, [longer], greedy)
    assert engine.stats["cached_tokens"] >= 3 * 16
    assert again == run(Engine(tiny_llama[1], num_blocks=256), [longer], greedy)


def test_identical_prompts_admitted_together_are_prefilled_once(tiny_llama):
    """Copies of a prompt arriving together: one prefill row, the others ride on it from their first token
    (generation) or take its logits (scoring); each gets what it gets alone."""
    engine = Engine(tiny_llama[1], num_blocks=256, num_speculative_tokens=0)
    prompt = random_prompts([37], seed=8)[0]
    params = [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
              SamplingParams(max_tokens=12, temperature=0.8, seed=4, ignore_eos=True, logprobs=1),
              SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)]
    engine.reset_stats()
    together = run_each(engine, [prompt] * 3, params)
    s = dict(engine.stats)
    assert together == alone(lambda: Engine(tiny_llama[1], num_blocks=256, num_speculative_tokens=0), [prompt] * 3,
                             params)
    assert s["prefill_tokens"] == 37 and s["shared_prefill_tokens"] == 2 * 37  # one row for three prompts
    assert s["decode_tokens"] == sum(len(t[0]) - 1 for t in together)
    scored, other = random_prompts([37, 37], seed=9)
    engine.reset_stats()
    logits = engine.logits([scored, other, scored, scored])
    assert engine.stats["prefill_tokens"] == 2 * 37 and engine.stats["shared_prefill_tokens"] == 2 * 37
    assert logits[0].equal(logits[2]) and logits[0].equal(logits[3]) and not logits[0].equal(logits[1])
    for got, p in zip(logits, [scored, other]):  # alone (its prefix now from the cache: other kernels, same values)
        assert torch.allclose(got, engine.logits([p])[0], atol=1e-5)
