"""bf16 projections (ops/linear_bf16.py, kernels/gemm_bf16.c): bf16 weights times activations
rounded to bf16, products exact, sums in fp32. Oracles, plain torch:
- the operands: torch's own fp32 → bf16 rounding (nearest even) of x and W, the products
  summed in float64 — every build agrees with it to fp32 rounding;
- the order: vdpbf16ps's definition (Intel SDM: each fp32 lane adds its pair's odd product,
  rounds, then the even one's) replayed pair by pair in fp32 torch ops — the widening builds
  (AVX2, the scalar one) and the build here, AVX-512 BF16's vdpbf16ps where the CPU has it,
  equal it bit for bit;
- AMX-BF16 tiles (where the CPU has them, from a few tokens on: `gemm_bf16_tiles`) add in the
  hardware's own order, not vdpbf16ps's: they are held to the float64 oracle alone, and the
  build without them (INFERGEN_KERNEL_ISA=avx512) to both;
and the path without a C compiler, the pack / unpack / rows round trip."""

from __future__ import annotations

import pytest
import torch

from infergen.kernels.build import I, L, _compile_flags, _cpu_flags, kernel
from infergen.layers.linear import Linear
from infergen.ops import linear_bf16
from infergen.ops.linear import LINEAR_BACKENDS
from tests.kernel_isa import assert_ok_with_isa

# (tokens, out, in): partial micro-steps (1..8 tokens and past), a partial panel, odd inputs;
# for tiles: partial token blocks (16 tokens of 32, 21, 33), k-steps past the last whole 16 pairs
# (70, 575: 288 pairs, 1536), one of 64 tokens
SHAPES = [(1, 24, 64), (5, 40, 70), (9, 48, 576), (16, 100, 575), (33, 77, 1536), (7, 9, 3),
          (21, 30, 34), (64, 48, 96)]  # fmt: skip


def tiles(m: int) -> bool:
    """Whether the kernel runs a product of m tokens on AMX tiles here."""
    fn = kernel("gemm_bf16_tiles", L, source="gemm_bf16", restype=I)
    return bool(fn is not None and fn(m))


def _inputs(m: int, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 3
    x[0, :2] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8])  # ties: round to even (down, up)
    return x, torch.randn(n, k, generator=g), torch.randn(n, generator=g)


def _float64(x, w, bias) -> torch.Tensor:
    y = x.to(torch.bfloat16).double() @ w.to(torch.bfloat16).double().T
    return y + bias.double() if bias is not None else y


def _pairwise(x, w, bias) -> torch.Tensor:
    """vdpbf16ps's order in fp32: per input pair, acc += odd product, then += even product."""
    xb, wb = x.to(torch.bfloat16).float(), w.to(torch.bfloat16).float()
    if x.shape[1] % 2:
        xb, wb = torch.nn.functional.pad(xb, (0, 1)), torch.nn.functional.pad(wb, (0, 1))
    acc = torch.zeros(x.shape[0], w.shape[0])
    for i in range(0, xb.shape[1], 2):
        acc = acc + xb[:, i + 1 : i + 2] * wb[:, i + 1]  # (bf16 products are exact in fp32)
        acc = acc + xb[:, i : i + 1] * wb[:, i]
    return acc + bias if bias is not None else acc


def _check(exact: bool) -> None:
    backend = LINEAR_BACKENDS.get("bf16")
    for seed, (m, n, k) in enumerate(SHAPES):
        x, w, bias = _inputs(m, n, k, seed)
        prepared = backend.prepare(w)
        for b in (bias, None):
            got = backend.apply(x, prepared, b, n)
            assert got.shape == (m, n) and got.dtype == torch.float32
            want = _float64(x, w, b)
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max())
            if exact and not tiles(m):
                assert torch.equal(got, _pairwise(x, w, b)), (m, n, k)


def test_bf16_products_equal_the_oracles():
    _check(exact=True)


def test_without_a_c_compiler_the_same_operands(monkeypatch):
    monkeypatch.setattr(linear_bf16, "kernel", lambda *args, **kwargs: None)
    _check(exact=False)  # (torch's own summation order)


def test_pack_unpack_and_rows_round_trip():
    w = torch.randn(50, 70)
    prepared = linear_bf16.pack(w)
    assert prepared.shape == (3, 35, 24)
    torch.testing.assert_close(linear_bf16.unpack(prepared)[:50, :70], w.to(torch.bfloat16),
                               rtol=0, atol=0)  # fmt: skip
    ids = torch.tensor([0, 23, 24, 49])
    rows = LINEAR_BACKENDS.get("bf16").rows(prepared, ids)
    assert torch.equal(rows, w[ids].to(torch.bfloat16).float())


_OTHER_ISA = """
from tests.ops.test_linear_bf16 import _check
_check(exact=True)
print("ok")
"""


_NO_TILES = """
from tests.ops.test_linear_bf16 import _check, tiles
assert not any(tiles(m) for m in (1, 8, 64, 512))
_check(exact=True)
print("ok")
"""


@pytest.mark.parametrize("isa", ["generic", "avx2"])
def test_other_isa_builds(isa, tmp_path):
    """The scalar build and the AVX2 build (pairs widened to fp32, FMAs in vdpbf16ps's
    order): bit for bit the same values."""
    assert_ok_with_isa(isa, _OTHER_ISA, tmp_path)


@pytest.mark.skipif("avx512_bf16" not in _cpu_flags(), reason="the CPU has no AVX-512 BF16")
def test_the_build_without_tiles_is_vdpbf16ps_at_every_size(tmp_path):
    """INFERGEN_KERNEL_ISA=avx512 (no AMX): every size on vdpbf16ps, bit for bit its order."""
    assert_ok_with_isa("avx512", _NO_TILES, tmp_path)


def test_tiles_run_where_the_cpu_has_amx_bf16():
    """(A check of the dispatch: on a CPU with AMX-BF16 the kernel is built for tiles and runs
    prefill-sized products on them, not a single token's.)"""
    import os

    amx = {"amx_tile", "amx_bf16"} <= _cpu_flags() and os.environ.get("INFERGEN_KERNEL_ISA") is None
    assert ("-mamx-bf16" in _compile_flags("gemm_bf16")) == amx
    assert tiles(512) == amx and not tiles(1)


def test_the_build_here_uses_avx512_bf16_where_the_cpu_has_it():
    """(A check of the dispatch: on a CPU with AVX-512 BF16 the kernel is built for it.)"""
    import os

    want = "avx512_bf16" in _cpu_flags() and os.environ.get("INFERGEN_KERNEL_ISA") is None
    assert ("-mavx512bf16" in _compile_flags("gemm_bf16")) == want
    assert "-mavx512bf16" not in _compile_flags("gemm_packed_f32")  # (others unchanged)


def test_a_projections_rows_and_dense_weight_have_its_width():
    """(An odd input count pads the panels' pairs; Linear.rows cuts the pad.)"""
    w = torch.randn(30, 7)
    linear = Linear(7, 30, False, torch.float32, "native")
    linear.backend = LINEAR_BACKENDS.get("bf16")
    linear.load(w)
    assert torch.equal(linear.dense_weight(), linear_bf16.dequantized(w))
    assert torch.equal(linear.rows(torch.tensor([3, 29])), linear_bf16.dequantized(w[[3, 29]]))
