"""The bf16 panel linears (cpu_gemm.h on avx512_bf16) and bf16 norms and rope (cpu_layer_ops.h on avx512_bf16)
against fp32 arithmetic on the same bf16 numbers and the torch formulas, and a bf16 engine on them against
one on torch's linears and layer ops."""
import pytest
import torch
import torch.nn.functional as F

from byzantium.kernels import cpu_ext

ext = cpu_ext.load() if cpu_ext.supported() else None
pytestmark = pytest.mark.skipif(ext is None or not ext.avx512_bf16_supported(),
                                reason="no avx512_bf16 on this CPU (or no CPU kernels): bf16 linears use oneDNN")


def bf16_close(got, want):
    """got (bf16) is want (fp32 sums of the same bf16 products) rounded once: within half a bf16 step, plus
    what a different order of the fp32 sums can move it by."""
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    err = (got.float() - want).abs()
    assert (err <= want.abs() * 2 ** -8 + 1e-4 * want.abs().max()).all(), err.max()


@pytest.mark.parametrize("rows", [1, 2, 13, 14, 15, 40, 600])  # 600: chunks of rows shared out (cpu_panel_schedule.h)
@pytest.mark.parametrize("k, n", [(64, 128), (576, 960), (37, 5), (1, 3), (8, 33), (1536, 40)])
@pytest.mark.parametrize("bias", [False, True])
def test_bf16_panel_linear_matches_fp32_sums_and_is_batch_invariant(rows, k, n, bias):
    g = torch.Generator().manual_seed(rows * 1000 + k + n)
    x = torch.randn(rows, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) / k ** 0.5).bfloat16()
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    panels = ext.pack_panels_bf16(w)
    assert panels.shape == (-(-n // 32), -(-k // 2), 32, 2) and panels.dtype == torch.bfloat16
    padded = None if b is None else torch.cat([b.float(), torch.zeros(panels.shape[0] * 32 - n)])
    got = ext.panel_linear_bf16(x, panels, padded, n)
    bf16_close(got, F.linear(x.float(), w.float(), None if b is None else b.float()))
    # a row's result is the same in any block of rows (the 14-row blocks and the remainder alike) and under
    # either schedule (a decode-sized call and a prefill-sized one)
    for m in {1, rows // 2, rows - 1} - {0}:
        assert torch.equal(ext.panel_linear_bf16(x[rows - m:], panels, padded, n), got[rows - m:])


def test_bf16_panel_linear_bad_calls():
    w = torch.randn(32, 64).bfloat16()
    panels = ext.pack_panels_bf16(w)
    x = torch.randn(8, 64).bfloat16()[::2]  # a strided view works
    bf16_close(ext.panel_linear_bf16(x, panels, None, 32), F.linear(x.float(), w.float()))
    with pytest.raises(RuntimeError, match="bf16 only"):
        ext.panel_linear_bf16(torch.randn(1, 64), panels, None, 32)
    with pytest.raises(RuntimeError, match="no rows"):
        ext.panel_linear_bf16(torch.randn(0, 64).bfloat16(), panels, None, 32)
    with pytest.raises(RuntimeError, match="N does not match"):
        ext.panel_linear_bf16(torch.randn(1, 64).bfloat16(), panels, None, 33)
    with pytest.raises(RuntimeError, match="shapes"):
        ext.panel_linear_bf16(torch.randn(1, 66).bfloat16(), panels, None, 32)
    with pytest.raises(RuntimeError, match="bias"):
        ext.panel_linear_bf16(torch.randn(1, 64).bfloat16(), panels, torch.zeros(32).bfloat16(), 32)
    with pytest.raises(RuntimeError, match="bf16 \\[N, K\\]"):
        ext.pack_panels_bf16(torch.randn(32, 64))


@pytest.mark.parametrize("rows", [1, 14, 31, 300])
@pytest.mark.parametrize("k, inner", [(576, 1536), (40, 24), (15, 5)])  # I a multiple of 16, and not; odd K
@pytest.mark.parametrize("bias", [False, True])
def test_bf16_fused_glu_matches_silu_of_the_fp32_sums(rows, k, inner, bias):
    from byzantium.engine.layers.linear import PackedLinear
    from byzantium.kernels.linear_choice import PanelsBF16
    g = torch.Generator().manual_seed(rows + k + inner)
    linear = torch.nn.Linear(k, 2 * inner, bias=bias).bfloat16()
    with torch.no_grad():
        linear.weight.copy_(torch.randn(2 * inner, k, generator=g) / k ** 0.5)
        if bias:
            linear.bias.copy_(torch.randn(2 * inner, generator=g))
    x = (torch.randn(rows, k, generator=g) * 2).bfloat16()
    packed = PackedLinear(linear, PanelsBF16(ext))
    gate_up = packed(x)
    glu, panels, glu_bias, half = packed.repack_glu(ext)
    assert glu is ext.panel_glu_bf16 and half == inner and packed.glu
    assert torch.equal(packed(x), gate_up)  # each column the same chain of products in either packing
    sums = F.linear(x.float(), linear.weight.float(), None if not bias else linear.bias.float())
    fused = glu(x, panels, glu_bias, inner)
    bf16_close(fused, F.silu(sums[:, :inner]) * sums[:, inner:])
    assert torch.equal(glu(x[rows // 2:], panels, glu_bias, inner), fused[rows // 2:])  # batch invariant
    assert packed.repack_glu(ext)[1] is panels  # once
    with pytest.raises(RuntimeError, match="I does not match"):
        ext.panel_glu_bf16(x, panels, None, panels.shape[0] * 16 + 1)


def test_bf16_engine_runs_its_linears_on_the_bf16_panels(tiny_llama, monkeypatch):
    from byzantium import Engine
    from byzantium.engine.layers.mlp import GatedMLP
    monkeypatch.setenv("BYZANTIUM_LINEAR_KERNELS", "panels_bf16")
    fast = Engine(tiny_llama[1], num_blocks=64, dtype="bfloat16")
    info = fast.describe()
    assert set(info["linear_kernels"].values()) == {"panels_bf16"}
    assert info["fused_gate_up_silu"] == sum(isinstance(m, GatedMLP) for m in fast.model.modules()) > 0
    assert info["cpu_layer_ops"]  # the bf16 norms and rope
    monkeypatch.setenv("BYZANTIUM_LINEAR_KERNELS", "torch")
    plain = Engine(tiny_llama[1], num_blocks=64, dtype="bfloat16")
    assert info["fused_gate_up_silu"] and not plain.describe()["fused_gate_up_silu"]
    prompts = [list(range(3, 3 + n)) for n in (4, 17, 40)]
    got, want = fast.logits(prompts), plain.logits(prompts)
    for a, b in zip(got, want):
        la, lb = torch.log_softmax(a.float(), -1), torch.log_softmax(b.float(), -1)
        assert (la - lb).abs().max() < 0.05  # bf16 roundings in different places, nothing more


def within_one_ulp(got, want):
    """bf16 results that may differ from the torch formula's by one rounding step (fp32 sums in another order)."""
    assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape
    step = want.float().abs().clamp_min(1e-30) * 2 ** -7
    assert ((got.float() - want.float()).abs() <= step).all()
    assert (got != want).float().mean() < 0.01  # nearly always the same bits


@pytest.mark.parametrize("rows, hidden", [(1, 576), (7, 64), (33, 40), (3, 17)])
def test_bf16_norms_match_the_torch_formula(rows, hidden):
    from byzantium.engine.layers.norm import RMSNorm
    g = torch.Generator().manual_seed(rows + hidden)
    norm = RMSNorm(hidden, 1e-5).bfloat16()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden, generator=g))
    x, residual = (torch.randn(rows, hidden, generator=g).bfloat16() for _ in range(2))
    with torch.no_grad():
        want, want_sum = norm.add_forward(x, residual)  # cpu_ops unset: the torch formula
        within_one_ulp(ext.rms_norm_bf16(x, norm.weight, 1e-5), norm(x))
        got, got_sum = ext.add_rms_norm_bf16(x, residual, norm.weight, 1e-5)
    assert torch.equal(got_sum, want_sum)  # the residual stream: one rounding of the fp32 sum, as torch adds
    within_one_ulp(got, want)
    strided = torch.randn(rows, 2 * hidden, generator=g).bfloat16()[:, :hidden]
    with torch.no_grad():
        within_one_ulp(ext.rms_norm_bf16(strided, norm.weight, 1e-5), norm(strided))
    with pytest.raises(RuntimeError, match="bf16 rows"):
        ext.rms_norm_bf16(x.float(), norm.weight, 1e-5)
    with pytest.raises(RuntimeError, match="residual like x"):
        ext.add_rms_norm_bf16(x, residual[:, :-1], norm.weight, 1e-5)


@pytest.mark.parametrize("tokens, heads, head_dim", [(1, 12, 64), (5, 3, 34), (9, 2, 128)])
def test_bf16_rope_matches_apply_rope_in_fp32(tokens, heads, head_dim):
    from byzantium.engine.layers.rotary import apply_rope
    g = torch.Generator().manual_seed(tokens + heads + head_dim)
    qkv = torch.randn(tokens, heads + 2, head_dim, generator=g).bfloat16()
    x = qkv[:, :heads]  # heads contiguous, rows strided (a slice of the fused qkv)
    angle = torch.rand(tokens, head_dim // 2, generator=g) * 6
    cos = torch.cat([angle.cos(), angle.cos()], -1).bfloat16()
    sin = torch.cat([-angle.sin(), angle.sin()], -1).bfloat16()
    got = ext.rope_bf16(x, cos, sin)
    want = apply_rope(x.float(), cos.float().unsqueeze(1), sin.float().unsqueeze(1))  # fp32 of the same inputs
    assert got.dtype == torch.bfloat16 and got.is_contiguous()
    err = (got.float() - want).abs()
    assert (err <= want.abs() * 2 ** -8 + 1e-6).all()
    with pytest.raises(RuntimeError, match="tables"):
        ext.rope_bf16(x, cos.float(), sin)
