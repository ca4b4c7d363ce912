"""The batched device sampler (engine/sampling/cuda.py): greedy, seeds independent of the batch, the
support of top-k / top-p, the sampled distribution, logprobs, penalties, bad logits. On CPU tensors, and
on CUDA too where torch sees a GPU (bench/gpu_check.sh part 4 runs this file there)."""
from dataclasses import dataclass, field

import pytest
import torch

from byzantium import SamplingParams
from byzantium.engine.sampling import cpu as sampling
from byzantium.engine.sampling import cuda as device_sampling
from byzantium.engine.sampling.cuda import sample
from byzantium.engine.sampling.noise import make_generator


@dataclass
class Request:
    params: SamplingParams
    output_ids: list = field(default_factory=list)
    generator: object = None


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def logits_of(rows, vocab, seed=0, scale=3.0, device="cpu"):
    return (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale).to(device)


def nucleus(row, top_p):
    """The top-p support by sampling.sample's rule (tokens in descending logit order)."""
    probs, order = torch.sort(torch.softmax(row, -1), descending=True)
    before = probs.cumsum(-1) - probs
    return set(order[before < top_p].tolist())


def test_greedy_is_argmax(device):
    logits = logits_of(7, 300, device=device)
    tokens, logprobs = sample(logits, [Request(SamplingParams()) for _ in range(7)])
    assert tokens == logits.argmax(-1).tolist() and logprobs == [None] * 7


MIXED = [SamplingParams(temperature=0.8, seed=1), SamplingParams(temperature=1.0, top_k=5, seed=2),
         SamplingParams(temperature=1.3, top_p=0.6, seed=3), SamplingParams(temperature=0.7, top_k=40, top_p=0.9, seed=4),
         SamplingParams(temperature=1.0, seed=5, presence_penalty=0.5, frequency_penalty=0.3),
         SamplingParams(), SamplingParams(temperature=2.0, top_k=2000, seed=6)]


def test_seeded_rows_do_not_depend_on_the_batch(device):
    vocab = 3000  # > CANDIDATES: top-k / top-p rows go through torch.topk
    logits = logits_of(len(MIXED), vocab, seed=1, device=device)
    requests = [Request(p, output_ids=[3, 3, 9] if i == 4 else []) for i, p in enumerate(MIXED)]
    full, _ = sample(logits, requests)
    for i in range(len(MIXED)):
        alone, _ = sample(logits[i:i + 1], [requests[i]])
        assert alone == [full[i]]
    order = [6, 2, 0, 5, 3, 1, 4]
    shuffled, _ = sample(logits[order], [requests[i] for i in order])
    assert shuffled == [full[i] for i in order]
    with pytest.MonkeyPatch.context() as patch:  # the noise made two rows at a time (top-k / top-p rows too)
        patch.setattr(device_sampling, "NOISE_ROWS", 2)
        assert sample(logits, requests)[0] == full
    # other company: the same rows among unrelated ones
    others = logits_of(5, vocab, seed=2, device=device)
    mixed = torch.cat([others[:2], logits[[1, 3]], others[2:]])
    extra = [Request(SamplingParams(temperature=1.0, seed=s)) for s in (70, 71, 72)]
    tokens, _ = sample(mixed, extra[:2] + [requests[1], requests[3]] + extra[2:] + [Request(SamplingParams())] * 2)
    assert tokens[2:4] == [full[1], full[3]]


def test_seed_and_step_choose_the_stream(device):
    logits = logits_of(1, 500, scale=0.5, device=device).expand(64, 500).contiguous()  # flat: many tokens likely
    same = sample(logits, [Request(SamplingParams(temperature=1.0, seed=7)) for _ in range(64)])[0]
    assert len(set(same)) == 1  # same seed, same step, same logits: same token
    steps = sample(logits, [Request(SamplingParams(temperature=1.0, seed=7), output_ids=[0] * i) for i in range(64)])[0]
    seeds = sample(logits, [Request(SamplingParams(temperature=1.0, seed=s)) for s in range(64)])[0]
    assert len(set(steps)) > 5 and len(set(seeds)) > 5
    unseeded = [Request(SamplingParams(temperature=1.0), generator=make_generator(None, "cpu")) for _ in range(64)]
    assert len(set(sample(logits, unseeded)[0])) > 5


def test_plain_rows_draw_the_cpu_samplers_tokens(device, monkeypatch):
    """One random stream for both samplers: a temperature-only row gets the token sampling.sample gives
    it (the CPU's compiled race and torch's logs round apart only at near-ties of ~1e-7)."""
    logits = logits_of(16, 5000, seed=4, device=device)
    requests = [Request(SamplingParams(temperature=0.8, seed=s), output_ids=[1] * s) for s in range(16)]
    got, _ = sample(logits, requests)
    want, _ = sampling.sample(logits.cpu(), requests)
    assert got == want and len(set(got)) > 8
    monkeypatch.setattr(device_sampling, "NOISE_ROWS", 3)  # the noise made a few rows at a time: same tokens
    assert sample(logits, requests)[0] == got


def test_top_k_and_top_p_respect_their_support(device):
    vocab = 2500
    row = logits_of(1, vocab, seed=3, scale=2.0, device=device)[0]
    logits = row.expand(400, vocab).contiguous()
    for params, allowed in [
            (dict(top_k=7), set(torch.topk(row, 7).indices.tolist())),
            (dict(top_p=0.3), nucleus(row, 0.3)),
            (dict(top_k=50, top_p=0.5), None)]:
        if allowed is None:  # top-p over the top-k tokens, renormalised
            kept = torch.full_like(row, float("-inf"))
            top = torch.topk(row, 50).indices
            kept[top] = row[top]
            allowed = nucleus(kept, 0.5)
        requests = [Request(SamplingParams(temperature=1.0, seed=s, **params)) for s in range(400)]
        tokens = set(sample(logits, requests)[0])
        assert tokens <= allowed and len(tokens) > 1


def chi_square(tokens, probs):
    counts = torch.bincount(torch.tensor(tokens), minlength=probs.numel()).double()
    expected = probs.double() * len(tokens)
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("params, support", [(dict(temperature=0.7), None), (dict(temperature=1.5, top_k=4), 4),
                                             (dict(temperature=1.0, top_p=0.8), "p")])
def test_distribution_matches_softmax(params, support, device):
    """Over 20000 seeds the token counts fit softmax(logits / T) (restricted and renormalised where
    top-k / top-p say): a chi-square far below the 0.1% critical value (df <= 7: 24.3)."""
    row = torch.tensor([2.0, 1.5, 1.0, 0.7, 0.2, -0.3, -1.0, -2.0])
    n = 20000
    requests = [Request(SamplingParams(seed=s, **params)) for s in range(n)]
    tokens = sample(row.to(device).expand(n, 8).contiguous(), requests)[0]
    probs = torch.softmax(row / params["temperature"], -1)
    if support == 4:
        probs = torch.softmax(row[:4] / params["temperature"], -1)
        probs = torch.cat([probs, torch.zeros(4)])
    elif support == "p":
        keep = sorted(nucleus(row, 0.8))
        probs = torch.zeros(8)
        probs[keep] = torch.softmax(row[keep], -1)
    outside = [t for t in tokens if probs[t] == 0]
    assert not outside
    kept = probs > 0
    stat = chi_square([int(torch.nonzero(kept)[:, 0].tolist().index(t)) for t in tokens], probs[kept])
    assert stat < 24.3


def test_logprobs_are_log_softmax_of_the_raw_logits(device):
    logits = logits_of(4, 700, seed=4, device=device)
    requests = [Request(SamplingParams(logprobs=5)), Request(SamplingParams(temperature=1.0, seed=1, logprobs=0)),
                Request(SamplingParams(temperature=0.5, top_k=3, seed=2, logprobs=2)), Request(SamplingParams())]
    tokens, logprobs = sample(logits, requests)
    reference = torch.log_softmax(logits, -1)
    assert logprobs[3] is None
    assert list(logprobs[1]) == [tokens[1]]
    for i, n in ((0, 5), (2, 2)):
        top = torch.topk(reference[i], n).indices.tolist()
        assert set(logprobs[i]) == set(top) | {tokens[i]}
    for i in range(3):
        for token, lp in logprobs[i].items():
            assert abs(lp - float(reference[i, token])) < 1e-5


def test_penalties_match_the_cpu_sampler(device):
    logits = logits_of(3, 50, seed=5, scale=1.0, device=device)
    params = [SamplingParams(presence_penalty=2.0), SamplingParams(frequency_penalty=1.5),
              SamplingParams(presence_penalty=-1.0, frequency_penalty=0.5)]
    generated = [[int(logits[0].argmax())], [int(logits[1].argmax())] * 3, [4, 4, 7]]
    requests = [Request(p, output_ids=g) for p, g in zip(params, generated)]
    cpu = sampling.sample(logits, [Request(p, g, torch.Generator()) for p, g in zip(params, generated)])[0]
    assert sample(logits, requests)[0] == cpu
    assert cpu[:2] != logits[:2].argmax(-1).tolist()  # the penalties changed the greedy choice
    penalized = device_sampling._penalize(logits, requests)
    for i in range(3):
        assert torch.equal(penalized[i], sampling._penalize(logits[i], requests[i]))


def test_wide_nucleus_and_large_top_k_take_the_full_sort(monkeypatch, device):
    """A nucleus wider than the candidates is redone over the whole vocabulary (the second pass); the
    tokens equal those of a sampler whose candidates are the whole vocabulary."""
    vocab = 200
    logits = logits_of(6, vocab, seed=6, scale=0.3, device=device)  # flat: the 0.95 nucleus holds most tokens
    # tie some logits: the order among equal logits must not depend on the path
    logits[:, 100:140] = logits[:, 100:101]
    requests = [Request(SamplingParams(temperature=1.0, top_p=0.95, seed=s)) for s in range(3)]
    requests += [Request(SamplingParams(temperature=1.0, top_k=k, seed=9)) for k in (30, 120, 150)]
    wide = sample(logits, requests)[0]
    monkeypatch.setattr(device_sampling, "CANDIDATES", 16)
    widths, narrow = [], device_sampling._narrow
    monkeypatch.setattr(device_sampling, "_narrow", lambda x, *a: widths.append((len(x), a[-1])) or narrow(x, *a))
    assert sample(logits, requests)[0] == wide
    assert widths == [(3, 16), (3, vocab), (3, vocab)]  # top-p: 16 candidates, then redone; top-k > 16: full
    for i in range(3, 6):
        assert wide[i] in set(torch.topk(logits[i], requests[i].params.top_k).indices.tolist()) | set(
            torch.nonzero(logits[i] == logits[i, 100])[:, 0].tolist())


def test_bad_logits_fail_sampled_rows_only(device):
    logits = logits_of(2, 40, device=device)
    logits[1, 3] = float("nan")
    with pytest.raises(RuntimeError, match="no valid probability distribution"):
        sample(logits, [Request(SamplingParams()), Request(SamplingParams(temperature=1.0, seed=0))])
    with pytest.raises(RuntimeError):
        sample(logits, [Request(SamplingParams()), Request(SamplingParams(temperature=1.0, top_k=5, seed=0))])
    sample(logits, [Request(SamplingParams()), Request(SamplingParams())])  # greedy: argmax, as the CPU sampler
