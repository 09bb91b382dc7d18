"""Row-wise Triton kernels (ops/pointwise_triton.py) against the plain-torch references:
add + RMSNorm (ops/rms_norm.reference on the updated residual; the residual updated in place
as torch's add_ does), SiLU-mul (ops/silu_mul.reference), GELU-mul (ops/gelu_mul.reference:
the tanh approximation, in float64) and RoPE (ops/rope.reference, on a strided view of a
fused QKV too), on rows of powers of two and not, one row and several, with and without the
residual add, fp32 and fp16 (bf16 on a GPU: the interpreter's bf16 casts truncate)."""

from __future__ import annotations

import pytest
import torch

from infergen.ops import gelu_mul, rms_norm, rope, silu_mul
from infergen.ops.pointwise_triton import (
    add_rms_norm_triton,
    apply_rope_triton,
    gelu_mul_triton,
    silu_mul_triton,
)
from tests.triton_env import DEVICE, INTERPRETED, runnable

pytestmark = runnable
DTYPES = [torch.float32, torch.float16] + ([] if INTERPRETED else [torch.bfloat16])
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, cols", [(1, 64), (7, 80), (3, 576)])
@pytest.mark.parametrize("with_delta", [False, True])
def test_add_rms_norm(dtype, rows, cols, with_delta):
    gen = torch.Generator().manual_seed(rows * cols)
    h = (torch.randn(rows, cols, generator=gen) * 3).to(dtype)
    delta = torch.randn(rows, cols, generator=gen).to(dtype) if with_delta else None
    weight = (1 + torch.randn(cols, generator=gen) * 0.1).to(dtype)
    want_h = h + delta if with_delta else h.clone()
    want = rms_norm.reference(want_h, weight, 1e-6)
    h_dev = h.to(DEVICE)
    got = add_rms_norm_triton(h_dev, None if delta is None else delta.to(DEVICE),
                              weight.to(DEVICE), 1e-6)  # fmt: skip
    tol = TOL[dtype]
    torch.testing.assert_close(h_dev.cpu(), want_h, rtol=tol, atol=tol)  # updated in place
    torch.testing.assert_close(got.cpu(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2 * 64), (5, 2 * 1536), (2, 3, 2 * 40)])
def test_silu_mul(dtype, shape):
    x = (torch.randn(*shape, generator=torch.Generator().manual_seed(1)) * 4).to(dtype)
    want = silu_mul.reference(x.float()).to(dtype)
    got = silu_mul_triton(x.to(DEVICE)).cpu()
    assert got.shape == (*shape[:-1], shape[-1] // 2) and got.dtype == dtype
    torch.testing.assert_close(got, want, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2 * 64), (5, 2 * 1536), (2, 3, 2 * 40)])
@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # exp(−2z) = inf: y = −0
def test_gelu_mul(dtype, shape):
    # gates out to ±12: the saturated tails of the tanh approximation too
    x = (torch.randn(*shape, generator=torch.Generator().manual_seed(2)) * 4).to(dtype)
    want = gelu_mul.reference(x)
    got = gelu_mul_triton(x.to(DEVICE)).cpu()
    assert got.shape == (*shape[:-1], shape[-1] // 2) and got.dtype == dtype
    torch.testing.assert_close(got, want, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens, heads, dim", [(1, 1, 64), (5, 3, 80), (9, 6, 128)])
def test_rope(dtype, tokens, heads, dim):
    gen = torch.Generator().manual_seed(dim)
    angles = torch.outer(torch.arange(64.0), torch.rand(dim // 2, generator=gen))
    cache = torch.cat([angles.cos(), angles.sin()], dim=-1)
    positions = torch.randint(0, 64, (tokens,), generator=gen)
    qkv = torch.randn(tokens, heads + 2, dim, generator=gen).to(dtype)  # a fused projection
    x = qkv[:, 1 : 1 + heads]  # a strided view of it, as the attention layer passes
    want = rope.reference(x.float(), positions, cache).to(dtype)
    inputs = rope.RopeInputs(positions.to(DEVICE), cache.to(DEVICE))
    got = apply_rope_triton(qkv.to(DEVICE)[:, 1 : 1 + heads], inputs).cpu()
    assert got.shape == x.shape and got.dtype == dtype
    torch.testing.assert_close(got, want, rtol=TOL[dtype], atol=TOL[dtype])
