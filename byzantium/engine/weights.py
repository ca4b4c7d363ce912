"""Copying one checkpoint tensor into the piece of a parameter that holds it: cut to this rank's slice
(layers/parallel.py's marks), quantized to FP8 on the way where the parameter is FP8 and the checkpoint
is not, broadcast where the checkpoint has one scale for a tensor that we keep per channel."""
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
