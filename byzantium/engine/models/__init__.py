"""The model code for each architecture a checkpoint's config names; unsupported ones fail here, before
any weight is read."""


def model_class(config):
    """The class (built as cls(config), weights loaded by cls.load_weights) that runs this config."""
    names = getattr(config, "architectures", None) or []
    if names and names[0] in GEMMA3:
        from .gemma3 import Gemma3ForCausalLM
        return Gemma3ForCausalLM
    if (names[0] if names else getattr(config, "model_type", None)) in LLAMA4:
        from .llama4 import Llama4ForCausalLM
        return Llama4ForCausalLM
    from .llama import LlamaForCausalLM, architecture_of
    architecture_of(config)  # raises, naming the supported architectures
    return LlamaForCausalLM


GEMMA3 = ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
# Llama 4's architectures, and its model types for configs that name none
LLAMA4 = ("Llama4ForCausalLM", "Llama4ForConditionalGeneration", "llama4_text", "llama4")
