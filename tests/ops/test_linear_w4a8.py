"""W4A8 with integer compute (ops/linear_w4a8.py, kernels/gemm_w4a8_i8.c): 4-bit
group-quantized weights (Q4_0, Q4_1, int4, int4_asym) times int8 activations quantized per
token. The oracle is plain torch: the activation codes and scales by the "token" rule (round
half to even, clamp ±127, amax / 127), the weights as the backend's reference dequantization
gives them (ops/linear_grouped.py's `dequantized`, itself checked against gguf and formats),
the sums in float64. Every ISA build this machine runs is checked — the default (AVX-512
VNNI's vpdpbusd where the CPU has it), AVX2 and the portable scalar build — and so is the path
without a C compiler. (Integer sums against the emulation, for every integer row:
tests/ops/test_linear_w8a8.py.)"""

from __future__ import annotations

import pytest
import torch

from infergen.kernels.build import I, L, P, kernel
from infergen.ops import linear_w4a8
from infergen.ops.linear import LINEAR_BACKENDS
from infergen.ops.linear_grouped import dequantized
from infergen.ops.linear_w4a8 import SOURCE
from tests.kernel_isa import assert_ok_with_isa
from tests.ops.batch_rows import assert_rows_batch_invariant

FORMATS = sorted(linear_w4a8.FORMATS)
# (tokens, out, in): 1..4 tokens (a partial micro-step), odd column counts (a partial panel)
SHAPES = [(1, 24, 32), (5, 40, 64), (4, 48, 576), (16, 100, 576), (33, 77, 1536), (7, 9, 96)]


def _oracle(x: torch.Tensor, w: torch.Tensor, bias) -> torch.Tensor:
    amax = x.abs().amax(dim=1, keepdim=True)
    scales = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    codes = torch.round(x / scales).clamp(-127, 127)
    y = (codes.double() @ w.double().T) * scales.double()
    return y + bias.double() if bias is not None else y


def _inputs(m: int, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 3
    x[0, :4] = torch.tensor([0.5, 1.5, -2.5, 2.5]) * x[0].abs().max() / 127  # ties
    if m > 2:
        x[2] = 0.0  # a zero row: scale 1, codes 0
    return x, torch.randn(n, k, generator=g), torch.randn(n, generator=g)


def _check(name: str) -> None:
    backend = LINEAR_BACKENDS.get(name)
    apply = backend.quantized_inputs[("int8", "token")]
    for seed, (m, n, k) in enumerate(SHAPES):
        x, w, bias = _inputs(m, n, k, seed)
        prepared, w_hat = backend.prepare(w), dequantized(w, name)
        for b in (bias, None):
            want = _oracle(x, w_hat, b)
            got = apply(x, prepared, b, n)
            assert got.shape == (m, n) and got.dtype == torch.float32
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max())


@pytest.mark.parametrize("name", FORMATS)
def test_integer_w4a8_equals_the_oracle(name):
    _check(name)


@pytest.mark.parametrize("name", FORMATS)
def test_a_token_gets_the_same_bits_in_any_batch(name):
    """Up to 4 tokens the AVX-512 VBMI build reads the panels directly, past 4 it regroups
    them into a buffer first: each token's row is the same either way."""
    backend = LINEAR_BACKENDS.get(name)
    apply = backend.quantized_inputs[("int8", "token")]
    x, w, bias = _inputs(9, 50, 576, 3)
    assert_rows_batch_invariant(apply, x, backend.prepare(w), bias, 50)


@pytest.mark.parametrize("name", FORMATS)
def test_without_a_c_compiler_the_same_values(name, monkeypatch):
    monkeypatch.setattr(linear_w4a8, "kernel", lambda *args, **kwargs: None)
    _check(name)


def test_only_s_u_plus_o_formats_take_integer_activations():
    """(Q8_0 and the FP4 formats keep the emulation: their codes are signed.)"""
    for name in ("q8_0", "mxfp4", "nvfp4"):
        assert ("int8", "token") not in LINEAR_BACKENDS.get(name).quantized_inputs


_OTHER_ISA = """
from tests.ops.test_linear_w4a8 import FORMATS, _check
for name in FORMATS:
    _check(name)
print("ok")
"""


@pytest.mark.parametrize("isa", ["generic", "avx2"])
def test_other_isa_builds(isa, tmp_path):
    """The scalar build (generic: scalar regroup and dot products) and the AVX2 build
    (vpmaddubsw + vpmaddwd, the SSE2 regroup)."""
    assert_ok_with_isa(isa, _OTHER_ISA, tmp_path)


def test_the_kernels_build_where_a_compiler_exists():
    """(The checks above would pass on the torch path too: the kernels must build here.)"""
    for name in FORMATS:
        assert kernel(f"gemm_w4a8_{name}", P, P, P, P, L, L, L, I, source=SOURCE) is not None
