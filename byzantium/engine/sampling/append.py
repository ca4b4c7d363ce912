"""After a forward pass: sample each request's next tokens, append them, and decide which requests stop.

A plain step samples one row per request, one round. A speculative step (speculation.py) fed a request
its draft tokens as extra rows: its rows are sampled in order, going on to the next row only while the
token just sampled is the draft that row was fed (so the next row's logits follow from it). Structured
outputs plug in around each round: the rows draw from their grammar's mask and the matcher advances
through the tokens taken (grammar.py); a grammar that ended or failed stops its request.
"""
import torch

from ..grammar import advance, masks
from . import cpu, cuda
from .noise import make_generator


class TokenAppender:
    """The sampler of the engine's device and the rules that end a request (EOS, stop tokens and strings,
    max_tokens, the model's length, a grammar's end)."""

    def __init__(self, device, eos_token_ids, tokenizer, max_model_len):
        self.device = device
        self.sample = cuda.sample if device.type == "cuda" else cpu.sample  # sampler.py: one contract
        self.eos_token_ids, self.tokenizer, self.max_model_len = eos_token_ids, tokenizer, max_model_len

    def generator(self, params):
        """A new request's own generator on this device (noise.py)."""
        return make_generator(params.seed, self.device)

    def append(self, logits, to_sample):
        """Sample each request's rows in turn and append the tokens.

        to_sample: [(seq, its logits rows, its drafts, counted)] (counted: its accepted drafts count in the
        stats). Returns (finished, accepted drafts counted, (the requests whose sampling raised, the error)
        or None)."""
        finished, accepted_count, position = [], 0, 0
        while to_sample:
            seqs = [seq for seq, _, _, _ in to_sample]
            try:
                tokens, logprobs = self.sample_rows(logits, [index[position] for _, index, _, _ in to_sample], seqs)
            except Exception as error:  # noqa: BLE001 - e.g. NaN logits: these requests fail, not the engine
                return finished, accepted_count, (seqs, error)
            going = []
            for (seq, index, drafts, counted), token, lp in zip(to_sample, tokens, logprobs):
                seq.token_ids.append(token)
                seq.num_computed = len(seq) - 1  # accepted drafts' K/V are computed, the newest token's not
                if lp is not None:
                    seq.logprobs.append(lp)
                accepted = position < len(drafts) and token == drafts[position]
                accepted_count += accepted and counted
                if self.stopped(seq, token):
                    finished.append(seq)
                elif accepted:
                    going.append((seq, index, drafts, counted))
            to_sample, position = going, position + 1
        return finished, accepted_count, None

    def sample_rows(self, logits, index, seqs):
        """One token for each of seqs from its row logits[index[i]], within its grammar's mask."""
        allowed = masks(seqs, logits.shape[1], pin=logits.is_cuda)
        if logits.is_cuda and index == list(range(len(logits))):  # every row in order: no copy
            picked = logits
        else:
            picked = logits.index_select(0, torch.tensor(index, device=logits.device))
        tokens, logprobs = self.sample(picked, seqs, allowed)
        if allowed is not None:
            advance(seqs, tokens)
        return tokens, logprobs

    def stopped(self, seq, token):
        """Whether seq ends with `token` just appended; sets its finish_reason (and where stop text starts)."""
        params, grammar = seq.params, getattr(seq, "grammar", None)
        if grammar is not None and grammar.error is not None:
            seq.error, seq.finish_reason = ValueError(f"structured output: {grammar.error}"), "error"
            return True
        if grammar is not None and grammar.ended:  # complete, nothing more can follow (or it took EOS)
            seq.finish_reason = "length" if grammar.closed_early else "stop"  # JSON closed by its budget
        elif (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
            seq.finish_reason = "stop"
        elif params.stop and self.tokenizer is not None:
            text = self.tokenizer.decode(seq.output_ids, skip_special_tokens=True)
            hits = [i for i in (text.find(s) for s in params.stop) if i >= 0]
            if hits:
                seq.stop_text_at, seq.finish_reason = min(hits), "stop"
        if seq.finish_reason is None and (seq.num_output >= params.max_tokens or len(seq) >= self.max_model_len):
            seq.finish_reason = "length"
        return seq.finish_reason is not None
