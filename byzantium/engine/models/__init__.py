"""The model code for each architecture a checkpoint's config names; unsupported ones fail here, before
any weight is read."""


def model_class(config):
    """The class (built as cls(config), weights loaded by cls.load_weights) that runs this config."""
    names = getattr(config, "architectures", None) or []
    if names and names[0] in GEMMA3:
        from .gemma3 import Gemma3ForCausalLM
        return Gemma3ForCausalLM
    from .llama import LlamaForCausalLM, architecture_of
    architecture_of(config)  # raises, naming the supported architectures
    return LlamaForCausalLM


GEMMA3 = ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
