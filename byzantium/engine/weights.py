"""The one weight loader: checkpoint tensors (transformers names, read by loader.iter_safetensors, FP8
ones paired with their scales by quantization.checkpoint_tensors) copied into a model's parameters.

Each model declares only how its checkpoint names differ (WeightNames: a multimodal checkpoint's text
tower prefixes, the layout of stacked experts); everything else is common to our models: q/k/v and
gate/up fused into one linear each (PACKED), MoE experts stacked (w13 [E, 2I, H], w2 [E, H, I]) and
shared out whole among tensor-parallel ranks, a tied LM head untied when the checkpoint ships its own.

Copying one checkpoint tensor into the piece of a parameter that holds it: cut to this rank's slice
(layers/parallel.py's marks), quantized to FP8 on the way where the parameter is FP8 and the checkpoint
is not, broadcast where the checkpoint has one scale for a tensor that we keep per channel."""
import re
from dataclasses import dataclass

import torch

from .layers import parallel

FP8 = (torch.float8_e4m3fn,)


def rank_slice(tensor, cut, shape):
    """The part of a whole checkpoint tensor that this rank holds in a destination of `shape`."""
    group = parallel.current()
    if cut is None:
        return tensor
    if cut == parallel.FIRST_RANK:
        return tensor if group.rank == 0 else torch.zeros_like(tensor)
    if cut == parallel.VOCAB:
        rows = shape[0]
        piece = tensor[group.rank * rows:(group.rank + 1) * rows]
        if piece.shape[0] < rows:  # the last rank's slice, padded
            piece = torch.cat([piece, piece.new_zeros(rows - piece.shape[0], *piece.shape[1:])])
        return piece
    dim = 0 if cut == parallel.COLUMN else tensor.dim() - 1
    if tensor.dim() == 0 or tensor.shape[dim] == shape[dim] or tensor.numel() == 1:
        return tensor  # not cut here (one rank; a replicated K/V head of a model with one; a per-tensor scale)
    whole, local = tensor.shape[dim], shape[dim]
    if whole % local:
        raise ValueError(f"a tensor of {whole} along dim {dim} does not cut into pieces of {local}")
    chunks = whole // local
    return tensor.narrow(dim, group.rank * chunks // group.size * local, local)


def copy_weight(dest, tensor, cut=None, scale=None, name="?"):
    """Copy checkpoint `tensor` (whole, as the checkpoint has it) into `dest`, a parameter or a view of
    one. An FP8 `dest` given a tensor of another dtype gets it quantized per row, the row scales written
    to `scale` (the matching view of the layer's weight_scale)."""
    whole_rows = None
    if dest.dtype in FP8 and tensor.dtype not in FP8 and cut == parallel.ROW:
        from .layers.fp8 import row_scales
        whole_rows = row_scales(tensor)  # every rank scales a row alike: the split equals the whole model
    tensor = rank_slice(tensor, cut, dest.shape)
    if tensor.numel() == 1 and dest.numel() > 1:  # one scale for many rows
        tensor = tensor.reshape(()).expand(dest.shape)
    elif tensor.numel() == dest.numel() and tensor.dim() != dest.dim():  # scales [rows, 1] kept as [rows]
        tensor = tensor.reshape(dest.shape)
    if tensor.shape != dest.shape:
        raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}; expected "
                         f"{tuple(dest.shape)}")
    with torch.no_grad():
        if dest.dtype in FP8 and tensor.dtype not in FP8:
            from .layers.fp8 import quantize_rows
            weight, scales = quantize_rows(tensor.to(dest.device), whole_rows)
            dest.copy_(weight)
            scale.copy_(scales.view(scale.shape))
        else:
            dest.copy_(tensor)


# -- the loader: checkpoint tensors (transformers names) into a model's parameters ---------------------------

# Checkpoint linears that our models fuse: checkpoint name -> (our fused linear, which piece of it).
PACKED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
# Checkpoint tensors not read: rope tables, static FP8 activation and K/V scales (activations are scaled per
# token as they come; an FP8 KV cache uses scale 1).
SKIPPED = (".input_scale", ".k_scale", ".v_scale")
EXPERT_PARAMS = (".w13", ".w2", ".w13_scale", ".w2_scale")  # a MoE block's stacked experts, by name suffix
# Routed experts one linear each (FP8 ones with a weight_scale each), or stacked (transformers 5).
_EXPERT = re.compile(r"(.*)\.experts\.(\d+)\.(gate|up|down)_proj\.weight(_scale)?")
_STACKED_EXPERTS = re.compile(r"(.*)\.experts\.(gate_up_proj|down_proj)")


@dataclass(frozen=True)
class WeightNames:
    """What a model declares about its checkpoint's names. prefixes: (checkpoint prefix, ours) pairs, the
    first that matches renames a tensor (ours None: skipped, e.g. a vision tower). experts_transposed:
    stacked expert tensors are [E, in, out] (the checkpoint multiplies x @ W; Llama 4), not [E, out, in]."""
    prefixes: tuple = ()
    experts_transposed: bool = False

    def rename(self, name):
        for prefix, ours in self.prefixes:
            if name.startswith(prefix):
                return None if ours is None else ours + name[len(prefix):]
        return name


def load_weights(model, named_tensors, names=WeightNames()):
    """Copy checkpoint tensors into `model`'s parameters (fused q/k/v and gate/up, stacked experts), each
    tensor-parallel rank its slice (copy_weight), FP8 ones quantized as they are read; check that none is
    missing, unknown or mis-shaped. The model has `arch` (for messages) and `tie_word_embeddings`; a tied
    head that the checkpoint ships different from the embedding is untied (untie_if_different)."""
    params = dict(model.named_parameters())
    loaded, head = set(), None
    for ckpt_name, tensor in named_tensors:
        name = names.rename(ckpt_name)
        if name is None or "rotary_emb." in name or name.endswith(SKIPPED):
            continue
        if name == "lm_head.weight" and model.tie_word_embeddings:
            head = tensor  # kept only if it differs from the embedding
            continue
        target, part = _target(name)
        if target not in params:
            raise ValueError(f"checkpoint tensor {ckpt_name!r} has no place in {model.arch}")
        param = params[target]
        experts = target.endswith(EXPERT_PARAMS)
        if experts:  # this rank holds some of them, whole
            tensor, part = _local_experts(model, target, tensor, part, ckpt_name, names.experts_transposed)
            if tensor is None:
                continue
        scale_target = None
        if param.dtype in FP8 and tensor.dtype not in FP8:  # quantized as it is read, its scales written
            scale_target = target + "_scale" if experts else target.removesuffix("weight") + "weight_scale"
        if experts and part is None:  # stacked experts: one at a time (FP8: each quantized per row)
            _copy_experts(param, scale_target and params[scale_target], tensor, ckpt_name)
        else:
            scale = scale_target and _piece(model, scale_target, params[scale_target], part)
            copy_weight(_piece(model, target, param, part), tensor, parallel.cut_of(model, target), scale, ckpt_name)
        for t in filter(None, (target, scale_target)):
            loaded |= {(t, p) for p in (_parts(t, params[t]) if part is None else [part])}
    expected = {(t, p) for t, param in params.items() for p in _parts(t, param)}
    missing = sorted(str(t if p is None else f"{t}[{p}]") for t, p in expected - loaded)
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensors of {model.arch}, e.g. {missing[:3]}")
    if head is not None:
        untie_if_different(model, head)


def _target(name):
    """(our parameter, which piece of it or None for all of it) of a checkpoint tensor."""
    if m := _STACKED_EXPERTS.fullmatch(name):
        return f"{m[1]}.{'w13' if m[2] == 'gate_up_proj' else 'w2'}", None
    if m := _EXPERT.fullmatch(name):
        prefix, expert, proj, scale = m[1], int(m[2]), m[3], m[4] or ""
        if proj == "down":
            return f"{prefix}.w2{scale}", expert
        return f"{prefix}.w13{scale}", (expert, int(proj == "up"))
    for ckpt, (ours, index) in PACKED.items():
        if f".{ckpt}." in name:
            return name.replace(f".{ckpt}.", f".{ours}."), index
    return name, None


def _local_experts(model, target, tensor, part, ckpt_name, transposed):
    """(the tensor, its piece) in this rank's share of the experts, (None, None) for another rank's expert:
    a stacked checkpoint tensor's experts of this rank in our layout [E, out, in], or one expert's linear
    (its piece renumbered to our local index)."""
    block = model.get_submodule(target.rsplit(".", 1)[0])
    if part is not None:
        expert = part[0] if isinstance(part, tuple) else part
        if expert >= block.num_experts:
            raise ValueError(f"checkpoint tensor {ckpt_name!r}: expert {expert} of {block.num_experts}")
        if expert not in block.experts:
            return None, None
        local = expert - block.experts.start
        return tensor, (local, part[1]) if isinstance(part, tuple) else local
    if tensor.dim() != 3 or tensor.shape[0] != block.num_experts:
        raise ValueError(f"checkpoint tensor {ckpt_name!r} has shape {tuple(tensor.shape)}; expected "
                         f"{block.num_experts} stacked experts")
    mine = tensor[block.experts.start:block.experts.stop]
    return (mine.transpose(1, 2) if transposed else mine), None


def _copy_experts(param, scale, tensor, name):
    """Stacked experts (this rank's, in our layout, any strides) into `param` one expert at a time: an FP8
    `param` gets each quantized per row, its scales written to `scale` [E_local, rows], so no more than
    one expert is ever in fp32."""
    if tensor.shape != param.shape:
        raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)} here; expected "
                         f"{tuple(param.shape)}")
    for e in range(param.shape[0]):
        copy_weight(param[e], tensor[e], None, None if scale is None else scale[e], name)


def _parts(target, param):
    """The pieces a parameter is loaded in, one checkpoint tensor each; [None] when it is one tensor.
    Experts: (expert, gate 0 / up 1) of w13, the expert of w2, and the same of their scales."""
    if ".qkv_proj." in target:
        return [0, 1, 2]
    if ".gate_up_proj." in target:
        return [0, 1]
    if target.endswith((".w13", ".w13_scale")):
        return [(e, p) for e in range(param.shape[0]) for p in (0, 1)]
    if target.endswith((".w2", ".w2_scale")):
        return list(range(param.shape[0]))
    return [None]


def _piece(model, target, param, part):
    """The view of `param` that checkpoint piece `part` is copied into."""
    if part is None:
        return param
    if target.endswith((".w13", ".w13_scale")):  # [E, 2I, H] or its scales [E, 2I]
        expert, half = part
        return param[expert].narrow(0, half * param.shape[1] // 2, param.shape[1] // 2)
    if target.endswith((".w2", ".w2_scale")):
        return param[part]
    if ".qkv_proj." in target:  # the attention module that owns it knows this rank's q and k/v widths
        attn = model.get_submodule(target.split(".qkv_proj.")[0])
        sizes = [attn.q_size, attn.kv_size, attn.kv_size]
    else:  # gate_up_proj: [gate; up]
        sizes = [param.shape[0] // 2] * 2
    return param.narrow(0, sum(sizes[:part]), sizes[part])


def untie_if_different(model, head):
    """A config that ties the head, with a checkpoint that ships one (`head`, whole) different from the
    embedding (Mistral 3's outer config defaults to tied): the head is the model's own."""
    embed = model.model.embed_tokens.weight
    head = rank_slice(head, parallel.VOCAB, embed.shape).to(embed.device, embed.dtype)
    if not torch.equal(head, embed):
        model.lm_head.weight = torch.nn.Parameter(head, requires_grad=False)
        model.tie_word_embeddings = False
