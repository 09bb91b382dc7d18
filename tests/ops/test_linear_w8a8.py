"""W8A8 int8 with integer compute (ops/linear_w8a8.py, kernels/gemm_w8a8_i8.c): int8 weights
times int8 activations quantized per token, summed exactly, scaled once. The oracle is plain
torch: the activation codes and scales by the "token" rule (round half to even, clamp ±127,
amax / 127), the weight codes and scales as the "int8" backend stores them, the sums in
float64 (exact for these integers). Every ISA build this machine runs is checked — the
default (AMX-INT8 tiles from 5 tokens where the CPU has them, else AVX-512 VNNI's vpdpbusd
where it has that, VBMI's byte permutes regrouping the weights, or up to 4 tokens permuting
them in registers), VNNI without VBMI, every AVX-512 extension without tiles, AVX2 and the
portable scalar build — and so is the path without a C compiler."""

from __future__ import annotations

import os

import pytest
import torch

from infergen.ops import linear_grouped, linear_w8a8  # noqa: F401 (registers the W4A8 rows)
from infergen.ops.linear import LINEAR_BACKENDS
from infergen.ops.linear_quantized import unpack
from infergen.ops.quantize_activation import ActivationFormat, fake_quantize
from tests.kernel_isa import assert_ok_with_isa
from tests.ops.batch_rows import assert_rows_batch_invariant

# up to 4 tokens the VBMI build reads the panels directly (K past a quad: 70, 7), past 4 it
# regroups them; AMX tiles (from 5 tokens where the CPU has AMX-INT8): partial token blocks
# (5, 16, 21 and 33 of 32), partial 16-quad k-steps (70, 200)
SHAPES = [(1, 24, 64), (5, 40, 70), (4, 48, 576), (16, 100, 576), (33, 1536, 576), (7, 9, 3),
          (3, 30, 70), (2, 25, 7), (1, 1536, 576), (21, 50, 200), (64, 48, 96)]  # fmt: skip


def _oracle(x: torch.Tensor, prepared: torch.Tensor, bias, n: int) -> torch.Tensor:
    amax = x.abs().amax(dim=1, keepdim=True)
    scales = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    codes = torch.round(x / scales).clamp(-127, 127)
    w_codes, w_scales = unpack(prepared)
    sums = codes.double() @ w_codes[:n].view(torch.int8).double().T
    y = sums * scales.double() * w_scales[:n].double()
    return y + bias.double() if bias is not None else y


def _inputs(m: int, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 3
    x[0, : min(k, 4)] = torch.tensor([0.5, 1.5, -2.5, 2.5])[: min(k, 4)] * x[0].abs().max() / 127
    if m > 2:
        x[2] = 0.0  # a zero row: scale 1, codes 0
    return x, torch.randn(n, k, generator=g), torch.randn(n, generator=g)


def _check(apply) -> None:
    backend = LINEAR_BACKENDS.get("int8")
    for seed, (m, n, k) in enumerate(SHAPES):
        x, w, bias = _inputs(m, n, k, seed)
        prepared = backend.prepare(w)
        for b in (bias, None):
            want = _oracle(x, prepared, b, n)
            got = apply(x, prepared, b, n)
            assert got.shape == (m, n) and got.dtype == torch.float32
            torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6 * want.abs().max())


def test_integer_w8a8_equals_the_integer_oracle():
    _check(LINEAR_BACKENDS.get("int8").quantized_inputs[("int8", "token")])


def test_a_token_gets_the_same_bits_in_any_batch():
    """Up to 4 tokens the AVX-512 VBMI build reads the panels directly, past 4 it regroups
    them with their column sums first: each token's row is the same either way."""
    backend = LINEAR_BACKENDS.get("int8")
    apply = backend.quantized_inputs[("int8", "token")]
    x, w, bias = _inputs(9, 50, 70, 3)
    assert_rows_batch_invariant(apply, x, backend.prepare(w), bias, 50)


def test_without_a_c_compiler_the_same_sums(monkeypatch):
    monkeypatch.setattr(linear_w8a8, "kernel", lambda *args, **kwargs: None)
    _check(LINEAR_BACKENDS.get("int8").quantized_inputs[("int8", "token")])


# every CPU row with an integer product on int8 token inputs (W8A8 here, W4A8's group formats)
INTEGER_ROWS = sorted(name for name, row in LINEAR_BACKENDS.items()
                      if ("int8", "token") in row.quantized_inputs and ":" not in name)  # fmt: skip


@pytest.mark.parametrize("name", INTEGER_ROWS)
def test_integer_sums_agree_with_the_emulation_to_fp32_rounding(name):
    """The emulated scheme (x̂ = the same codes times their scales, then the weight-only
    product accumulated in fp32) computes the same values, rounded differently."""
    backend = LINEAR_BACKENDS.get(name)
    x, w, bias = _inputs(16, 100, 576, 7)
    prepared = backend.prepare(w)
    x_hat = fake_quantize(x, ActivationFormat("int8", "token", 8.0))
    emulated = backend.apply(x_hat, prepared, bias, 100)
    integer = backend.quantized_inputs[("int8", "token")](x, prepared, bias, 100)
    torch.testing.assert_close(integer, emulated, rtol=1e-5, atol=1e-5 * emulated.abs().max())


def test_the_integer_rows():
    assert {"int8", "q4_0", "q4_1", "int4", "int4_asym"} <= set(INTEGER_ROWS)


_OTHER_ISA = """
from tests.ops.test_linear_w8a8 import _check
from infergen.ops.linear import LINEAR_BACKENDS
_check(LINEAR_BACKENDS.get("int8").quantized_inputs[("int8", "token")])
print("ok")
"""


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512vnni", "avx512"])
def test_other_isa_builds(isa, tmp_path):
    """The scalar build (generic), the AVX2 build (no VNNI: the scalar dot products; the
    regroup by SSE2 interleaves), where the CPU has VNNI, VNNI without VBMI's byte
    permutes (the SSE2 regroup under vpdpbusd), and every AVX-512 extension without AMX
    tiles (vpdpbusd at every size)."""
    assert_ok_with_isa(isa, _OTHER_ISA, tmp_path)


def test_tiles_run_where_the_cpu_has_amx_int8():
    """(A check of the dispatch: on a CPU with AMX-INT8 the kernel is built for tiles and runs
    prefill-sized products on them, not a decode step's.)"""
    from infergen.kernels.build import I, L, _compile_flags, _cpu_flags, kernel

    amx = {"amx_tile", "amx_int8", "avx512_vnni"} <= _cpu_flags()
    amx = amx and os.environ.get("INFERGEN_KERNEL_ISA") is None
    assert ("-mamx-int8" in _compile_flags("gemm_w8a8_i8")) == amx
    tiles = kernel("gemm_w8a8_tiles", L, source="gemm_w8a8_i8", restype=I)
    assert tiles is not None and bool(tiles(512)) == amx and not tiles(1)


def test_the_build_here_uses_vnni_where_the_cpu_has_it():
    """(A check of the dispatch, not of numbers: on a CPU with AVX-512 VNNI the compiled
    kernel holds vpdpbusd; elsewhere it must not.)"""
    from infergen.kernels.build import _compile_flags, _cpu_flags

    vnni = {"avx512bw", "avx512_vnni", "avx512f", "avx512vl", "avx2", "fma", "f16c"}
    flags = _compile_flags("gemm_w8a8_i8")
    assert ("-mavx512vnni" in flags) == (
        vnni <= _cpu_flags() and os.environ.get("INFERGEN_KERNEL_ISA") is None
    )
    assert "-mavx512vnni" not in _compile_flags("gemm_packed_f32")  # (others unchanged)
