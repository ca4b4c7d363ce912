"""lm-evaluation-harness on the engine, with no server in between: `lm_eval --model byzantium --model_args
pretrained=PATH_OR_NAME,dtype=float32,...` (every key but pretrained, max_length and add_bos_token goes to
Engine as an option: device, dtype, tensor_parallel, quantization, num_blocks...). lm-eval finds the model
through the `lm_eval.models` entry point of `byzantium[eval]`; `import byzantium.eval.lm_eval_model` also
registers it.

Log-likelihoods go through Engine.loglikelihood: one batch for all the requests, each context's KV
computed once and shared by its continuations (the prefix cache). Tokenizing follows lm-eval's `hf` model
(no special tokens added unless add_bos_token), so the two score the same tokens.
"""
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from ..backends import SamplingParams
from ..engine.engine import Engine


@register_model("byzantium")
class ByzantiumLM(TemplateLM):
    def __init__(self, pretrained, max_length=None, add_bos_token=False, batch_size=None, max_batch_size=None,
                 **engine_options):
        super().__init__()
        engine_options = {k: v for k, v in engine_options.items() if v is not None}
        self.engine = Engine(pretrained, **engine_options)
        if self.engine.tokenizer is None:
            raise ValueError(f"{pretrained} has no tokenizer files: lm-eval's tasks are text")
        self.tokenizer = self.engine.tokenizer
        self.max_length = int(max_length or self.engine.max_model_len)
        self.add_bos_token = add_bos_token

    @property
    def eot_token_id(self):
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self):  # what an empty context is scored after, as lm-eval's hf model does
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        special = self.add_bos_token if add_special_tokens is None else add_special_tokens
        return self.tokenizer.encode(string, add_special_tokens=special)

    def tok_decode(self, tokens, **kwargs):
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
        pairs = [self._fit(context, continuation) for _, context, continuation in requests]
        results = self.engine.loglikelihood(pairs, tag="lm_eval")
        for (key, _, _), result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", key, result)
        return results

    def _fit(self, context, continuation):
        """Keep the last max_length - 1 tokens (the engine keeps one slot to generate), as lm-eval's hf
        model cuts from the left."""
        whole = (list(context) + list(continuation))[-(self.max_length - 1):]
        cut = len(whole) - len(continuation)
        return (whole[:cut], whole[cut:]) if cut > 0 else (whole[:1], whole[1:])

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        """The whole text's log-likelihood in windows of max_length tokens (lm-eval's rolling windows)."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
        scored = []
        for (text,) in [r.args for r in requests]:
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length - 1, context_len=1)]
            results = self.engine.loglikelihood(windows, tag="lm_eval")
            total = sum(logprob for logprob, _ in results)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            scored.append(total)
        return scored

    def generate_until(self, requests, disable_tqdm=False):
        """Greedy (or the task's sampling) generation, all requests in one batch, cut at the task's `until`."""
        prompts, params = [], []
        for request in requests:
            context, kwargs = request.args
            kwargs = dict(kwargs)
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_tokens = int(kwargs.pop("max_gen_toks", 256))
            temperature = float(kwargs.pop("temperature", 0.0)) if kwargs.pop("do_sample", False) else 0.0
            ids = self.tok_encode(context)[-(self.max_length - max_tokens - 1):]
            prompts.append(ids)
            params.append(SamplingParams(max_tokens=max_tokens, temperature=temperature, stop=until or None))
        outs = self.engine.generate(prompts, params, tag="lm_eval")
        texts = [out.text for out in outs]
        for request, text in zip(requests, texts):
            self.cache_hook.add_partial("generate_until", request.args, text)
        return texts
