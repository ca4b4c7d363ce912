"""FP8 (e4m3) weights: per-row quantization and the linear that runs on them.

A weight is stored as float8_e4m3fn [out, in] with one fp32 scale per output row (real weight = stored *
scale). Per-tensor checkpoints have their one scale copied to every row (weights.copy_weight), so there
is one layout. The forward pass:
- CUDA with FP8 units (compute capability >= 8.9), bf16 activations, in/out features multiples of 16:
  torch._scaled_mm, with the activations quantized per token (row) as they come (dynamic scales);
- elsewhere (the CPU, older GPUs, other dtypes or shapes): the weight dequantized to the activations' dtype
  a tile of rows at a time (TILE_ELEMENTS weights, e.g. 2048 rows of an 8192-wide layer: 64 MB in fp32),
  so a big layer is never held whole in high precision.
"""
import torch
import torch.nn.functional as F
from torch import nn

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448: e4m3 has no inf, and a cast past it is not saturated on CUDA
TILE_ELEMENTS = 1 << 24  # weights dequantized at once on the fallback path (and quantized at once at load)
MIN_SCALE = 1e-12  # an all-zero row keeps a finite scale


def quantize_rows(tensor, scales=None):
    """(e4m3 tensor, fp32 row scales [rows]) of a 2-D tensor, each row scaled so its absmax maps to 448, or
    by the given `scales` (those of whole rows, for a tensor-parallel rank's slice of their columns: see
    row_scales). Works a tile of rows at a time: a 70B layer is never copied whole to fp32."""
    rows, cols = tensor.shape
    out = torch.empty(rows, cols, dtype=FP8, device=tensor.device)
    given = scales is not None
    scales = (scales.to(tensor.device, torch.float32).reshape(rows) if given
              else torch.empty(rows, dtype=torch.float32, device=tensor.device))
    step = max(1, TILE_ELEMENTS // max(cols, 1))
    for start in range(0, rows, step):
        out[start:start + step], scale = _quantize(tensor[start:start + step],
                                                   scales[start:start + step, None] if given else None)
        scales[start:start + step] = scale.view(-1)
    return out, scales


def row_scales(tensor):
    """The fp32 row scales quantize_rows gives a 2-D tensor (absmax / 448), without quantizing it."""
    step = max(1, TILE_ELEMENTS // max(tensor.shape[1], 1))
    return torch.cat([_scale(tensor[start:start + step].float()).view(-1) for start in range(0, tensor.shape[0], step)])


def _scale(rows):
    return (rows.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=MIN_SCALE)


def _quantize(rows, scale=None):
    """(e4m3 rows, fp32 scales [n, 1]): one scale per row, absmax / 448 unless given."""
    rows = rows.float()
    scale = _scale(rows) if scale is None else scale
    return (rows / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


class Fp8Linear(nn.Module):
    """y = x @ (weight * weight_scale[:, None]).T + bias, the weight held in FP8."""

    def __init__(self, in_features, out_features, bias=True, dtype=None, device=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=FP8, device=device),
                                   requires_grad=False)
        self.weight_scale = nn.Parameter(torch.empty(out_features, dtype=torch.float32, device=device),
                                         requires_grad=False)
        self.bias = (nn.Parameter(torch.empty(out_features, dtype=dtype, device=device), requires_grad=False)
                     if bias else None)

    @classmethod
    def like(cls, linear):
        """An Fp8Linear in place of nn.Linear `linear`: same shape, bias dtype and device (meta while the
        model is built), and its tensor-parallel marks (layers/parallel.py): the weight's cut; the scale,
        one per output row, cut with the rows ("column", "vocab") and whole otherwise; the bias's own."""
        fp8 = cls(linear.in_features, linear.out_features, linear.bias is not None,
                  dtype=linear.weight.dtype, device=linear.weight.device)
        cuts = dict(getattr(linear, "tp_cuts", None) or {})
        for name in ("weight", "bias"):  # marks on the parameters themselves (the older layout)
            param = getattr(linear, name)
            if name not in cuts and getattr(param, "tp_cut", None) is not None:
                cuts[name] = param.tp_cut
        if cuts:
            weight_cut = cuts.get("weight")
            fp8.tp_cuts = {**cuts, "weight_scale": weight_cut if weight_cut in ("column", "vocab") else None}
        return fp8

    def forward(self, x):
        rows = x.reshape(-1, self.in_features)
        if _scaled_mm_ok(rows, self.out_features):
            y = scaled_mm_linear(rows, self.weight, self.weight_scale, self.bias)
        else:
            y = dequantized_linear(rows, self.weight, self.weight_scale, self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, fp8"


_fp8_units = {}  # CUDA device index -> whether it has FP8 tensor cores


def _scaled_mm_ok(x, out_features):
    """Whether torch._scaled_mm can take this: a CUDA device of compute capability >= 8.9 (Ada, Hopper,
    Blackwell), bf16 activations (row-wise scaling gives bf16 out only), and both dimensions of the weight
    multiples of 16 (_scaled_mm's layout rule); anything else takes the dequantizing path."""
    if not x.is_cuda or x.dtype != torch.bfloat16 or x.shape[1] % 16 or out_features % 16:
        return False
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    if index not in _fp8_units:
        _fp8_units[index] = torch.cuda.get_device_capability(index) >= (8, 9)
    return _fp8_units[index]


def scaled_mm_linear(x, weight, weight_scale, bias=None):
    """x [T, in] (bf16) through an FP8 weight on the FP8 units: x quantized per row (scale_a [T, 1]), the
    weight's row scales as scale_b [1, out]; weight.t() is the column-major second operand _scaled_mm
    wants, with no copy. Returns bf16 [T, out]. (torch also runs this on the CPU, where tests check it.)"""
    xq, x_scale = _quantize(x.contiguous())
    y = torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=weight_scale.view(1, -1),
                         out_dtype=torch.bfloat16)
    return y if bias is None else y + bias  # bias added apart: not every _scaled_mm backend takes one row-wise


def dequantized_linear(x, weight, weight_scale, bias=None):
    """x [T, in] through an FP8 weight dequantized to x's dtype a tile of output rows at a time."""
    out_features, in_features = weight.shape
    step = max(1, TILE_ELEMENTS // max(in_features, 1))
    if step >= out_features:
        return F.linear(x, _dequantize(weight, weight_scale, x.dtype), bias)
    out = x.new_empty(x.shape[0], out_features)
    for start in range(0, out_features, step):
        stop = min(start + step, out_features)
        w = _dequantize(weight[start:stop], weight_scale[start:stop], x.dtype)
        out[:, start:stop] = F.linear(x, w, None if bias is None else bias[start:stop])
    return out


def _dequantize(weight, scale, dtype):
    # The product in fp32, rounded once to the activations' dtype (a scale may be past fp16's normal range).
    return weight.float().mul_(scale[:, None]).to(dtype)
