"""RMSNorm (+ fused residual), SiLU·mul, RoPE and linear: every backend against the plain-torch
reference (and the rotary frequencies against transformers), on shapes including size 1 and
odd sizes."""

from __future__ import annotations

import pytest
import torch

from infergen.config import RopeScaling
from infergen.kernels.build import try_load
from infergen.ops import linear, linear_quantized, rms_norm, rope, silu_mul
from infergen.ops.linear_quantized import CODE_FORMATS, dequantized

BACKENDS = ["torch", "native"]


def test_native_kernels_build_here():
    """gcc is on this machine and CI's: a silent torch fallback would hide the kernels."""
    for name in (
        "gemm_packed_f32",
        "rms_norm_f32",
        "silu_mul_f32",
        "rope_f32",
        "paged_decode_attention_f32",
    ):
        assert try_load(name) is not None, name


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (17, 576), (300, 576)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm(backend, shape, with_residual):
    fn = rms_norm.RMS_NORM_BACKENDS.get(backend)
    h, delta = torch.randn(shape) * 3, torch.randn(shape)
    w = torch.randn(shape[-1])
    h_ref = h + delta if with_residual else h.clone()
    got = fn(h, delta if with_residual else None, w, 1e-5)
    torch.testing.assert_close(got, rms_norm.reference(h_ref, w, 1e-5))
    torch.testing.assert_close(h, h_ref)  # the residual stream is updated in place


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(1, 2), (5, 10), (33, 3072), (64, 3072)])
def test_silu_mul(backend, shape):
    x = torch.randn(shape)
    got = silu_mul.SILU_MUL_BACKENDS.get(backend)(x.clone())
    torch.testing.assert_close(got, silu_mul.reference(x))


def _linear(backend: str, x, w, b):
    row = linear.LINEAR_BACKENDS.get(backend)
    return row.apply(x, row.prepare(w), b, w.shape[0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "tokens,out_features",
    [(1, 1), (1, 7), (3, 7), (8, 5), (9, 33), (16, 130), (1, 577), (24, 64), (25, 64), (40, 3)],
)
@pytest.mark.parametrize("bias", [False, True])
def test_linear(backend, tokens, out_features, bias):
    x, w = torch.randn(tokens, 24), torch.randn(out_features, 24)
    b = torch.randn(out_features) if bias else None
    got = _linear(backend, x, w, b)
    want = linear.reference(x.double(), w.double(), b.double() if bias else None)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def assert_within_dot_error_bound(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    """|fp32 x·wᵀ − exact| ≤ γ_K · (|x|·|w|ᵀ) with γ_K = K·u/(1 − K·u), u = 2⁻²⁴: the worst-case
    rounding error of any K-term fp32 dot product, whatever the summation order (Higham,
    Accuracy and Stability of Numerical Algorithms, §3.1). A fixed tolerance would be either
    loose or flaky for long K."""
    k, u = x.shape[-1], 2.0**-24
    gamma = k * u / (1 - k * u)
    exact = x.double() @ w.double().t()
    bound = gamma * (x.double().abs() @ w.double().abs().t())
    excess = (got.double() - exact).abs() - bound
    assert excess.max() <= 0, f"error exceeds the fp32 bound by {excess.max():.3g}"


@pytest.mark.parametrize("tokens", [*range(1, 17), 130])
def test_native_linear_large_odd_shape(tokens):
    """Every micro-kernel height: 1-8 tokens run near-equal blocks of at most 4 rows (heights
    1-4), more tokens blocks of at most 8 with AVX-512 (heights 1-8), a partial last panel,
    long odd K."""
    x, w = torch.randn(tokens, 1539), torch.randn(577, 1539)
    got = _linear("native", x, w, None)
    assert_within_dot_error_bound(got, x, w)
    assert (got.double() - x.double() @ w.double().t()).abs().max() < 1e-3  # not vacuous


@pytest.mark.parametrize("out_features", [48, 64, 130, 577])
def test_native_linear_rows_do_not_depend_on_the_batch(out_features):
    """Every block height and panel grouping (AVX-512 past 8 tokens: panels two at a time, an
    odd or partial last one alone; one token: the 1-row kernel) sums the same FMAs in the same
    k order: a row of a batch is bitwise that row computed alone."""
    x, w, b = torch.randn(40, 100), torch.randn(out_features, 100), torch.randn(out_features)
    row = linear.LINEAR_BACKENDS.get("native")
    panels = row.prepare(w)
    alone = torch.cat([row.apply(x[i : i + 1], panels, b, out_features) for i in range(40)])
    for tokens in (2, 5, 7, 9, 13, 16, 17, 40):  # (5: blocks of 3 + 2; 9: 3 + 3 + 3)
        assert torch.equal(row.apply(x[:tokens], panels, b, out_features), alone[:tokens])


def test_native_linear_strided_input():
    x = torch.randn(6, 40)[:, :24]  # rows 40 floats apart
    w, b = torch.randn(10, 24), torch.randn(10)
    torch.testing.assert_close(_linear("native", x, w, b), linear.reference(x, w, b))


def test_pack_panels_layout():
    w = torch.randn(50, 7)
    panels = linear.pack_panels(w)
    assert panels.shape == (3, 7, 24)
    for n in (0, 23, 24, 49):
        torch.testing.assert_close(panels[n // 24, :, n % 24], w[n], rtol=0, atol=0)
    assert panels[2, :, 2:].abs().sum() == 0  # padding rows 50..71 are zero


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_rows_read_the_prepared_weight(backend):
    row = linear.LINEAR_BACKENDS.get(backend)
    w = torch.randn(70, 9)
    ids = torch.tensor([0, 69, 24, 5, 5, 48])
    torch.testing.assert_close(row.rows(row.prepare(w), ids), w[ids], rtol=0, atol=0)


def test_native_linear_bf16_falls_back_to_torch():
    row = linear.LINEAR_BACKENDS.get("native")
    w, x = torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(3, 16, dtype=torch.bfloat16)
    prepared = row.prepare(w)
    assert prepared.dim() == 2
    torch.testing.assert_close(row.apply(x, prepared, None, 8), x @ w.t())


def _rope_cache(head_dim: int, positions: int = 100) -> torch.Tensor:
    inv = rope.inv_frequencies(head_dim, 10000.0, RopeScaling()).float()
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), inv)
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("head_dim", [2, 8, 64])
@pytest.mark.parametrize("tokens", [1, 13])
def test_rope_matches_reference(backend, head_dim, tokens):
    fn = rope.ROPE_BACKENDS.get(backend)
    cache = _rope_cache(head_dim)
    positions = torch.randint(0, 100, (tokens,))
    inputs = rope.RopeInputs(positions, cache)
    q, k = torch.randn(tokens, 3, head_dim), torch.randn(tokens, 1, head_dim)
    torch.testing.assert_close(fn(q.clone(), inputs), rope.reference(q, positions, cache))
    # q and k as one strided view of a fused QKV row (how the attention layer calls it)
    qkv = torch.cat([q, k, torch.randn(tokens, 1, head_dim)], dim=1).view(tokens, -1)
    qk = qkv[:, : 4 * head_dim].view(tokens, 4, head_dim)
    rotated = fn(qk, inputs)
    torch.testing.assert_close(rotated[:, 3:], rope.reference(k, positions, cache))
    torch.testing.assert_close(rotated[:, :3], rope.reference(q, positions, cache))


@pytest.mark.parametrize(
    "rope_parameters",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ],
)
def test_inv_frequencies_match_transformers(rope_parameters):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(hidden_size=512, num_attention_heads=4, rope_parameters=rope_parameters)
    kind = rope_parameters["rope_type"]
    if kind == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        want, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        want, _ = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    scaling = RopeScaling(**{k: v for k, v in rope_parameters.items() if k != "rope_theta"})
    got = rope.inv_frequencies(128, rope_parameters["rope_theta"], scaling).float()
    torch.testing.assert_close(got, want.float(), rtol=1e-6, atol=0)


def _without_rows_kernel(monkeypatch, native: bool) -> None:
    if not native:  # the path without a C compiler (rows_packed_<fmt> unavailable)
        monkeypatch.setattr(linear_quantized, "kernel", lambda *args, **kwargs: None)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("fmt", sorted(CODE_FORMATS))
def test_code_format_rows_are_the_dequantized_weight_rows(fmt, native, monkeypatch):
    """A tied LM head's embedding lookup on one-byte codes (int8 / FP8 panels) reads its rows'
    codes and their panels' scales: the rows of formats.dequantize's weight, bit for bit, in
    any order, repeated, across panels and in a partial last panel."""
    _without_rows_kernel(monkeypatch, native)
    row = linear.LINEAR_BACKENDS.get(fmt)
    w = torch.randn(70, 9)
    ids = torch.tensor([0, 69, 24, 5, 5, 48, 23, 47])
    assert torch.equal(row.rows(row.prepare(w), ids), dequantized(w, fmt)[ids])
    assert torch.equal(row.rows(row.prepare(w), ids[:1]), dequantized(w, fmt)[ids[:1]])


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("fmt", sorted(CODE_FORMATS))
def test_code_format_rows_outside_the_weight_raise(fmt, native, monkeypatch):
    _without_rows_kernel(monkeypatch, native)
    row = linear.LINEAR_BACKENDS.get(fmt)
    prepared = row.prepare(torch.randn(30, 9))  # two panels: 48 (padded) rows
    with pytest.raises(IndexError):
        row.rows(prepared, torch.tensor([3, 48]))
    with pytest.raises(IndexError):
        row.rows(prepared, torch.tensor([-1]))
