"""RMSNorm, SiLU·mul, RoPE and linear against their plain-torch references / transformers."""

from __future__ import annotations

import pytest
import torch

from infergen.config import RopeScaling
from infergen.ops import linear, rms_norm, rope, silu_mul


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (17, 576)])
def test_rms_norm(shape):
    x = torch.randn(shape) * 3
    w = torch.randn(shape[-1])
    torch.testing.assert_close(rms_norm.rms_norm(x, w, 1e-5), rms_norm.reference(x, w, 1e-5))


@pytest.mark.parametrize("shape", [(1, 2), (5, 10), (33, 3072)])
def test_silu_mul(shape):
    x = torch.randn(shape)
    torch.testing.assert_close(silu_mul.silu_mul(x.clone()), silu_mul.reference(x))


@pytest.mark.parametrize("tokens,out_features", [(1, 1), (3, 7), (16, 130)])
def test_linear(tokens, out_features):
    x, w, b = torch.randn(tokens, 24), torch.randn(out_features, 24), torch.randn(out_features)
    torch.testing.assert_close(linear.linear(x, w, b), linear.reference(x, w, b))
    torch.testing.assert_close(linear.linear(x, w, None), linear.reference(x, w, None))


@pytest.mark.parametrize("head_dim", [2, 8, 64])
@pytest.mark.parametrize("tokens", [1, 13])
def test_rope_matches_reference(head_dim, tokens):
    scaling = RopeScaling()
    inv = rope.inv_frequencies(head_dim, 10000.0, scaling).float()
    angles = torch.outer(torch.arange(100, dtype=torch.float32), inv)
    cache = torch.cat([angles.cos(), angles.sin()], dim=-1)
    q, k = torch.randn(tokens, 3, head_dim), torch.randn(tokens, 1, head_dim)
    positions = torch.randint(0, 100, (tokens,))
    tables = rope.rope_tables(cache, positions)
    torch.testing.assert_close(rope.apply_rope(q, tables), rope.reference(q, positions, cache))
    # q and k rotated as one tensor (how the attention layer calls it)
    qk = rope.apply_rope(torch.cat([q, k], dim=1), tables)
    torch.testing.assert_close(qk[:, 3:], rope.reference(k, positions, cache))


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


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 7), (5, 8), (130, 24), (577, 1536)])
@pytest.mark.parametrize("bias", [False, True])
def test_native_matvec_matches_reference(rows, cols, bias):
    from infergen.ops.linear import _matvec

    assert _matvec() is not None, "the C kernel must compile on this machine (gcc is present)"
    x, w = torch.randn(1, cols), torch.randn(rows, cols)
    b = torch.randn(rows) if bias else None
    got = linear.linear(x, w, b, backend="native")
    want = linear.reference(x.double(), w.double(), b.double() if bias else None)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * cols**0.5)
    # several tokens go to torch; result identical to the torch backend
    xs = torch.randn(4, cols)
    assert torch.equal(linear.linear(xs, w, b, "native"), linear.linear(xs, w, b, "torch"))
