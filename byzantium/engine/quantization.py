"""Which linears run in FP8, read from a checkpoint's quantization_config (or asked for with
quantization="fp8"), and the checkpoint tensors put in the form weights.load_weights copies.

Known formats (anything else is refused, naming it, when the config is read: before any weight is):
- compressed-tensors (RedHatAI's FP8 releases, llm-compressor), format float-quantized or naive-quantized
  (both store float8_e4m3fn weights): weights {num_bits: 8, type: float, strategy: channel | tensor},
  weight_scale [out, 1] or [1] / []; input activations FP8 per token (dynamic) or per tensor (static);
  `ignore` names and `re:` regexes, `targets` ["Linear"] or names and regexes.
- quant_method "fp8" (vLLM / AutoFP8: weight_scale per tensor; transformers' FineGrainedFP8: weight_scale_inv
  per tensor or per block of weight_block_size).
- quantization="fp8" on a bf16/fp32 checkpoint: every decoder-layer linear and MoE expert quantized per
  output row as it is read.
MoE experts (models/moe.py's and llama4.py's stacked w13/w2) are FP8 where every expert linear of the
block is (checkpoint names {block}.experts.{e}.gate_proj / up_proj / down_proj, targeted and not ignored):
e4m3 with fp32 scales per (expert, output row), w13_scale [E, 2I] and w2_scale [E, H] (models/moe.py,
swap_fp8_experts); kernels/moe.py runs them.
Activations are always scaled per token as they come: static input_scale / activation_scale tensors are
skipped (as are K/V scales: an FP8 KV cache uses scale 1). The embedding, the LM head and MoE routers stay
in the compute dtype (vLLM's default): an FP8 tensor meant for one of these (or for a linear or experts
the config leaves out) is dequantized on the way in. Block-wise weights are dequantized and quantized
again per row (the layout Fp8Linear runs): a second e4m3 rounding, up to 2^-4 more relative error on a
weight.
"""
import re
from dataclasses import dataclass, field

import torch
from torch import nn

from .layers.fp8 import FP8, TILE_ELEMENTS, Fp8Linear
from .models.moe import EXPERT_PROJECTIONS, use_fp8_experts
from .weights import PACKED

# Checkpoint tensors never read: static activation scales and K/V cache scales.
SKIPPED_SUFFIXES = (".input_scale", ".activation_scale", ".output_scale", ".k_scale", ".v_scale")
FLOAT_FORMATS = ("float-quantized", "naive-quantized")  # compressed-tensors: float8_e4m3fn weights, as stored
_LAYER = re.compile(r"(?:^|\.)(layers\.\d+\..*)")  # a decoder layer's part of a name
ROUTERS = ("gate", "router")  # a MoE block's router linear (Qwen3-MoE mlp.gate, Llama 4 feed_forward.router)


@dataclass(frozen=True)
class Fp8Spec:
    """Which decoder linears are FP8. method: "compressed-tensors", "fp8" (a checkpoint stored in FP8) or
    "load" (quantization="fp8" on a high-precision checkpoint)."""
    method: str
    targets: tuple = ("Linear",)
    ignore: tuple = ()
    weight_strategy: str = "channel"  # "channel", "tensor" or "block"
    block: tuple | None = None  # (rows, cols) of a block-wise checkpoint
    notes: tuple = field(default=(), compare=False)  # what of the config is not acted on, said in describe()

    @property
    def source(self):
        """How the weights came to be FP8, for describe(): quantized here, or published so."""
        return "quantized at load" if self.method == "load" else f"as published ({self.method})"

    def is_fp8(self, name, pieces=None):
        """Whether the nn.Linear `name` (our name) runs in FP8: a decoder-layer linear, not a router,
        targeted and not ignored, every checkpoint piece of it (`pieces`, e.g. q/k/v_proj of qkv_proj)."""
        if not _LAYER.search(name) or name.rsplit(".", 1)[-1] in ROUTERS:
            return False
        return all(self._targeted(p) and not self._ignored(p) for p in pieces or [name])

    def _targeted(self, name):
        return "Linear" in self.targets or any(_matches(t, name) for t in self.targets)

    def _ignored(self, name):
        return any(_matches(entry, name) for entry in self.ignore)


def _matches(entry, name):
    """A config's module entry against one of our names: "re:" a regex (re.match, as compressed-tensors and
    vLLM do); else a name, equal to ours, a dotted part of it (transformers' modules_to_not_convert), or
    the same decoder-layer part under another prefix (model.language_model.layers.0... = model.layers.0...)."""
    if entry.startswith("re:"):
        return re.match(entry[3:], name) is not None
    if f".{entry}." in f".{name}.":
        return True
    ours, theirs = _LAYER.search(name), _LAYER.search(entry)
    return ours is not None and theirs is not None and ours[1] == theirs[1]


def quantization_spec(config, quantization=None):
    """The Fp8Spec of checkpoint `config` (a transformers config) and the engine's `quantization` option,
    or None for a model that runs unquantized. Raises ValueError naming any format it does not know."""
    qc = _quantization_config(config)
    if qc is None:
        return Fp8Spec("load") if quantization == "fp8" else None
    method = str(qc.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    if method == "fp8":
        return _fp8_method(qc)
    raise ValueError(f"checkpoint quantization {method or qc!r} is not supported; Byzantium loads FP8 checkpoints "
                     "(compressed-tensors float-quantized, quant_method 'fp8') and quantizes bf16/fp32 checkpoints "
                     "to FP8 at load (quantization='fp8')")


def _quantization_config(config):
    for source in (config, getattr(config, "text_config", None)):
        qc = getattr(source, "quantization_config", None) if source is not None else None
        if qc is not None:
            return qc.to_dict() if hasattr(qc, "to_dict") else dict(qc)
    return None


def _compressed_tensors(qc):
    sparsity = qc.get("sparsity_config") or {}
    if sparsity.get("format") not in (None, "dense"):
        raise ValueError(f"compressed-tensors sparsity format {sparsity.get('format')!r} is not supported")
    groups = qc.get("config_groups") or {}
    if not groups:
        raise ValueError("compressed-tensors quantization_config without config_groups is not supported")
    targets, strategies, notes = [], set(), []
    for name, group in groups.items():
        fmt = group.get("format") or qc.get("format")
        if fmt not in FLOAT_FORMATS:
            raise ValueError(f"compressed-tensors format {fmt!r} (config group {name!r}) is not supported; known: "
                             f"{', '.join(FLOAT_FORMATS)} with FP8 weights")
        weights = group.get("weights") or {}
        scheme = f"{weights.get('type')} {weights.get('num_bits')}-bit {weights.get('strategy')}"
        if weights.get("type") != "float" or weights.get("num_bits") != 8:
            raise ValueError(f"compressed-tensors weights {scheme} (config group {name!r}) are not supported; "
                             "known: float 8-bit (FP8 e4m3), per channel or per tensor")
        if weights.get("strategy") not in ("channel", "tensor") or weights.get("dynamic") \
                or weights.get("symmetric") is False or weights.get("group_size") or weights.get("block_structure"):
            raise ValueError(f"compressed-tensors weights {scheme} (config group {name!r}, dynamic="
                             f"{weights.get('dynamic')}, symmetric={weights.get('symmetric')}) are not supported; "
                             "known: static symmetric FP8 per channel or per tensor")
        acts = group.get("input_activations")
        if acts is not None:
            if acts.get("type") != "float" or acts.get("num_bits") != 8 or acts.get("strategy") not in ("token", "tensor"):
                raise ValueError(f"compressed-tensors input activations {acts.get('type')} {acts.get('num_bits')}-bit "
                                 f"{acts.get('strategy')} (config group {name!r}) are not supported; known: FP8 per "
                                 "token or per tensor")
            if not acts.get("dynamic", False):
                notes.append("static input scales skipped: activations scaled per token")
        if group.get("output_activations") is not None:
            raise ValueError(f"compressed-tensors output activation quantization (config group {name!r}) is not supported")
        targets += group.get("targets") or ["Linear"]
        strategies.add(weights["strategy"])
    if qc.get("kv_cache_scheme"):
        notes.append("kv_cache_scheme scales skipped: an FP8 KV cache uses scale 1")
    return Fp8Spec("compressed-tensors", tuple(targets), tuple(qc.get("ignore") or ()),
                   "channel" if "channel" in strategies else "tensor", notes=tuple(notes))


def _fp8_method(qc):
    if str(qc.get("fmt", "e4m3")).lower() != "e4m3":
        raise ValueError(f"quant_method 'fp8' with fmt {qc.get('fmt')!r} is not supported; known: e4m3")
    if qc.get("scale_fmt", "float") != "float":
        raise ValueError(f"quant_method 'fp8' with scale_fmt {qc.get('scale_fmt')!r} (e.g. ue8m0) is not supported; "
                         "known: float")
    if qc.get("expert_dtype", "fp8") != "fp8":
        raise ValueError(f"quant_method 'fp8' with expert_dtype {qc.get('expert_dtype')!r} is not supported")
    scheme = str(qc.get("activation_scheme", "dynamic")).lower()
    if scheme not in ("dynamic", "static"):
        raise ValueError(f"quant_method 'fp8' with activation_scheme {scheme!r} is not supported")
    ignore = tuple(qc.get("modules_to_not_convert") or qc.get("ignored_layers") or ())
    block = qc.get("weight_block_size")
    notes = ("static activation scales skipped: activations scaled per token",) if scheme == "static" else ()
    return Fp8Spec("fp8", ("Linear",), ignore, "block" if block else "tensor", tuple(block) if block else None,
                   notes=notes)


def swap_fp8_linears(model, spec):
    """Replace the nn.Linears `spec` makes FP8 by Fp8Linears (layers/fp8.py), on the model's device (meta,
    before to_empty: after model.to(dtype), which would cast an FP8 weight). Returns the decoder-layer
    parts ("layers.3.self_attn.q_proj") of the checkpoint modules whose weights now land in FP8."""
    unfused = {}  # our fused linear -> its checkpoint pieces (weights.PACKED: checkpoint -> (ours, index))
    for ckpt, (ours, _) in PACKED.items():
        unfused.setdefault(ours, []).append(ckpt)
    fp8_parts = set()
    for name, module in list(model.named_modules()):
        if type(module) is not nn.Linear:
            continue
        owner, _, attr = name.rpartition(".")
        pieces = [f"{owner}.{piece}" if owner else piece for piece in unfused.get(attr, [attr])]
        if spec.is_fp8(name, pieces):
            setattr(model.get_submodule(owner), attr, Fp8Linear.like(module))
            fp8_parts |= {_LAYER.search(p)[1] for p in pieces}
    return fp8_parts


def swap_fp8_experts(model, spec):
    """Make the stacked experts of each MoE block (a module with w13 and w2 parameters) FP8 where `spec`
    makes every expert linear of the block FP8 (models/moe.py use_fp8_experts; on meta, after
    model.to(dtype)). Returns the decoder-layer parts of their checkpoint linears, all experts' (those of
    other tensor-parallel ranks pass through untouched and are skipped by weights.load_weights)."""
    fp8_parts = set()
    for name, block in list(model.named_modules()):
        if not all(isinstance(getattr(block, w, None), nn.Parameter) for w in ("w13", "w2")):
            continue
        pieces = [f"{name}.experts.{e}.{proj}" for e in range(block.num_experts) for proj in EXPERT_PROJECTIONS]
        if spec.is_fp8(f"{name}.experts", pieces):
            use_fp8_experts(block)
            fp8_parts |= {_LAYER.search(p)[1] for p in pieces}
    return fp8_parts


def checkpoint_tensors(named_tensors, spec, fp8_parts, dtype):
    """The checkpoint's (name, tensor)s as weights.load_weights takes them: FP8 weights that land in an
    Fp8Linear or FP8 experts pass with their weight_scale (a per-tensor weight_scale_inv renamed
    weight_scale); any other FP8 weight (block-wise; the LM head, a layer or experts kept in `dtype`) is
    dequantized with its scale,
    to `dtype`, or to fp32 where the model quantizes it again per row; SKIPPED_SUFFIXES are dropped."""
    weights, scales = {}, {}  # FP8 weights waiting for their scale, and scales for their weight
    for name, tensor in named_tensors:
        if name.endswith(SKIPPED_SUFFIXES):
            continue
        module, _, leaf = name.rpartition(".")
        part = _LAYER.search(module)
        fp8_dest = part is not None and part[1] in fp8_parts
        passes = fp8_dest and spec.block is None
        if leaf in ("weight_scale", "weight_scale_inv"):
            if passes:
                yield f"{module}.weight_scale", tensor
            elif module in weights:
                yield f"{module}.weight", _dequantize(weights.pop(module), tensor, spec.block, fp8_dest, dtype)
            else:
                scales[module] = tensor
        elif leaf == "weight" and tensor.dtype == FP8 and not passes:
            if module in scales:
                yield name, _dequantize(tensor, scales.pop(module), spec.block, fp8_dest, dtype)
            else:
                weights[module] = tensor
        else:
            yield name, tensor
    if weights or scales:
        names = sorted([f"{m}.weight" for m in weights] + [f"{m}.weight_scale" for m in scales])
        raise ValueError(f"checkpoint FP8 weights without their scales (or scales without weights): {names[:3]}")


def _dequantize(weight, scale, block, requantized, dtype):
    """weight * scale (per tensor, per row, or per block of `block`) in `dtype` (fp32 when it will be
    quantized again), a tile of rows at a time."""
    rows, cols = weight.shape[-2:]
    out = torch.empty(weight.shape, dtype=torch.float32 if requantized else dtype, device=weight.device)
    scale = scale.float()
    step = max(1, TILE_ELEMENTS // max(cols, 1))
    if block is not None:
        step = -(-step // block[0]) * block[0]  # tiles start on block rows
    for start in range(0, rows, step):
        w = weight[..., start:start + step, :].float()
        if block is not None:
            s = scale[..., start // block[0]:-(-(start + w.shape[-2]) // block[0]), :]
            s = s.repeat_interleave(block[0], -2)[..., :w.shape[-2], :].repeat_interleave(block[1], -1)[..., :cols]
        elif scale.numel() == 1:
            s = scale.reshape(())
        else:  # per row: [rows, 1] or [rows]
            s = scale.reshape(*weight.shape[:-1], 1)[..., start:start + w.shape[-2], :]
        out[..., start:start + step, :] = w * s
    return out
