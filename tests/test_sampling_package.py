"""engine/sampling: the two samplers under one contract give the same tokens and logprobs for the same logits
(the CUDA one run here on CPU tensors), and the append loop keeps drafts while they match and stops requests
by their rules."""
import pytest
import torch

from byzantium.engine.sampling import SamplingParams, cpu, cuda
from byzantium.engine.sampling.append import TokenAppender
from byzantium.engine.sampling.noise import make_generator
from byzantium.engine.sequence import Sequence

PARAMS = [SamplingParams(), SamplingParams(logprobs=3), SamplingParams(temperature=0.7, seed=1),
          SamplingParams(temperature=1.0, top_k=5, seed=2, logprobs=2), SamplingParams(temperature=1.3, top_p=0.8, seed=3),
          SamplingParams(temperature=0.9, top_k=50, top_p=0.95, seed=4),
          SamplingParams(temperature=1.0, seed=5, presence_penalty=0.4, frequency_penalty=0.6),
          SamplingParams(frequency_penalty=1.5), SamplingParams(temperature=1.0, logprobs=0)]


def requests(params, output_ids=(4, 4, 17)):
    return [Sequence(i, [1, 2, *output_ids], p, generator=make_generator(None, "cpu")) for i, p in enumerate(params)]


def prepared(params):
    seqs = requests(params)
    for seq in seqs:
        seq.output_start = 2  # the last tokens are this request's output: penalties count them
    return seqs


@pytest.mark.parametrize("vocab", [257, 3000])  # under and over cuda.CANDIDATES
def test_cpu_and_cuda_samplers_agree_on_cpu_tensors(vocab):
    seqs = prepared(PARAMS)
    for round in range(5):
        logits = torch.randn(len(seqs), vocab, generator=torch.Generator().manual_seed(round)) * 4
        cpu_tokens, cpu_logprobs = cpu.sample(logits, seqs)
        cuda_tokens, cuda_logprobs = cuda.sample(logits, seqs)
        assert cpu_tokens == cuda_tokens
        for a, b in zip(cpu_logprobs, cuda_logprobs):
            assert (a is None) == (b is None)
            if a is not None:
                assert a.keys() == b.keys()
                assert all(abs(a[t] - b[t]) < 1e-5 for t in a)
        for seq, token in zip(seqs, cpu_tokens):
            seq.token_ids.append(token)  # the next round draws each request's next noise


def test_greedy_rows_are_the_argmax_in_both():
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(7))
    seqs = requests([SamplingParams()] * 4, output_ids=())
    assert cpu.sample(logits, seqs)[0] == cuda.sample(logits, seqs)[0] == logits.argmax(-1).tolist()


def appender(max_model_len=100):
    return TokenAppender(torch.device("cpu"), {0}, None, max_model_len)


def decoding(params, tokens=(5, 6, 7)):
    seq = Sequence(1, list(tokens), None)
    seq.start_turn(params, make_generator(params.seed, "cpu"))
    return seq


def test_drafts_are_kept_while_they_are_the_tokens_sampled():
    seq = decoding(SamplingParams(max_tokens=10))
    logits = torch.full((4, 50), -10.0)
    for row, best in enumerate([11, 12, 30, 14]):  # the greedy tokens of rows 0..3
        logits[row, best] = 10.0
    finished, accepted, failure = appender().append(logits, [(seq, [0, 1, 2, 3], [11, 12, 13], True)])
    # row 0 gives 11 (= draft 0), row 1 gives 12 (= draft 1), row 2 gives 30 (not draft 2): stop there
    assert seq.output_ids == [11, 12, 30] and accepted == 2 and finished == [] and failure is None
    assert seq.num_computed == len(seq) - 1


@pytest.mark.parametrize("params, best, reason", [(SamplingParams(max_tokens=10), 0, "stop"),  # EOS
                                                  (SamplingParams(max_tokens=10, stop_token_ids=[9]), 9, "stop"),
                                                  (SamplingParams(max_tokens=10, ignore_eos=True), 0, None),
                                                  (SamplingParams(max_tokens=1), 3, "length")])
def test_requests_stop_by_their_rules(params, best, reason):
    seq = decoding(params)
    logits = torch.full((1, 20), -10.0)
    logits[0, best] = 10.0
    finished, _, _ = appender().append(logits, [(seq, [0], [], True)])
    assert seq.finish_reason == reason and finished == ([seq] if reason else [])


def test_the_model_length_ends_a_request():
    seq = decoding(SamplingParams(max_tokens=10))
    logits = torch.zeros(1, 20)
    logits[0, 3] = 1.0  # not EOS (0)
    appender(max_model_len=4).append(logits, [(seq, [0], [], True)])
    assert seq.finish_reason == "length"


def test_a_sampler_that_raises_fails_those_requests_only():
    seqs = [decoding(SamplingParams(max_tokens=10)) for _ in range(2)]
    tokens = appender()

    def broken(logits, requests, allowed=None):
        raise RuntimeError("no valid probability distribution")

    tokens.sample = broken
    finished, _, failure = tokens.append(torch.zeros(2, 20), [(seq, [i], [], True) for i, seq in enumerate(seqs)])
    assert finished == [] and failure[0] == seqs and "no valid" in str(failure[1])
    assert all(seq.output_ids == [] for seq in seqs)
