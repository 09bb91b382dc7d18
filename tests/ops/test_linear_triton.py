"""Weight-only quantized linear in Triton (ops/linear_triton.py).

Oracles: the GPU layout stands for exactly the weight the CPU backends compute with
(linear_quantized.dequantized / linear_grouped.dequantized, bit for bit); the kernel, run on
identity rows, reads that weight back bit for bit; on a grid of shapes (one token, odd token
counts, N not a multiple of the tile, K of 1..3 tiles, with and without bias) its product is
the float64 product within fp32 rounding. Kernels run in the interpreter on the CPU
(TRITON_INTERPRET=1, set by tests/conftest.py) or on a GPU with TRITON_INTERPRET=0
(benchmarks/device_check.sh); the kernel tests skip when Triton is not installed, the GGUF
formats when the gguf package is not (the GPU machine's image has none).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest
import torch

from infergen.errors import ConfigError
from infergen.ops import linear_triton as lt
from infergen.ops.linear_grouped import dequantized as grouped_dequantized
from infergen.ops.linear_quantized import CODE_FORMATS
from infergen.ops.linear_quantized import dequantized as code_dequantized
from tests.triton_env import DEVICE, INTERPRETED, runnable

FORMATS = list(lt.TRITON_FORMATS)
GGUF_FORMATS = ("q4_0", "q4_1", "q8_0")  # quantized by the gguf package
TILE = (16, 16, 32)  # small tiles: several programs along M and N, masked edges, K steps
SHAPES = [(1, 40, 32), (3, 50, 64), (17, 40, 96)]  # (tokens M, out N, in K)


def _weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """N(0, 0.1) weights with an all-zero row, a row of tiny values and a row of large ones."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.1
    w[1] = 0.0
    w[2] *= 1e-4
    w[3] *= 300.0
    w[4, :16] = 0.0  # an all-zero NVFP4 block in an otherwise normal group
    return w


@functools.cache
def _prepared(fmt: str, n: int, k: int) -> dict[str, torch.Tensor]:
    if fmt in GGUF_FORMATS:
        pytest.importorskip("gguf")
    return lt.prepare_triton(_weight(n, k), fmt)


def _on_device(prepared: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.to(DEVICE) for name, t in prepared.items()}


def _cpu_backend_weight(fmt: str, n: int, k: int) -> torch.Tensor:
    w = _weight(n, k)
    return code_dequantized(w, fmt) if fmt in CODE_FORMATS else grouped_dequantized(w, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_layout_stands_for_the_cpu_backends_weight(fmt):
    n, k = 40, 96
    prepared = _prepared(fmt, n, k)
    want = _cpu_backend_weight(fmt, n, k)
    assert torch.equal(lt.dequantize_prepared(prepared, fmt), want)
    layout = lt.TRITON_FORMATS.get(fmt)
    codes = prepared["codes"]
    assert codes.shape == (n, k // 2 if layout.packed else k) and codes.element_size() == 1
    assert all(t.is_contiguous() for t in prepared.values())
    expected_scales = {"tensor": (1,), "channel": (n,), "group": (n, k // layout.group)}
    assert prepared["scales"].shape == expected_scales[layout.scales]


@runnable
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tile", [TILE, (16, 32, 64)])  # (16, 32, 64): a half-masked K step
def test_kernel_reads_back_the_cpu_backends_weight_bit_for_bit(fmt, tile):
    """x = identity rows: y = Wᵀ exactly (products with 1 and 0 are exact in fp32)."""
    n, k = 40, 96
    prepared = _on_device(_prepared(fmt, n, k))
    eye = torch.eye(k, device=DEVICE)
    got = lt.linear_triton(eye, prepared, None, fmt, tile=tile)
    assert got.dtype == torch.float32 and got.shape == (k, n)
    assert torch.equal(got.t().cpu(), _cpu_backend_weight(fmt, n, k))


def _assert_within_fp32_rounding(got, x, weight, bias):
    """|got − y| <= (K + 2)·2^-24·(|x|·|W|ᵀ + |b|) + tiny, y the float64 product: the bound of
    any fp32 summation order (Higham, Accuracy and Stability, §3.1)."""
    k = x.shape[-1]
    want = x.double() @ weight.double().t()
    magnitude = x.double().abs() @ weight.double().abs().t()
    if bias is not None:
        want, magnitude = want + bias.double(), magnitude + bias.double().abs()
    bound = (k + 2) * 2.0**-24 * magnitude + 1e-30
    err = (got.cpu().double() - want).abs()
    assert bool((err <= bound).all()), f"max error {err.max():.3g}, bound there {bound.max():.3g}"


@runnable
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_kernel_equals_reference_on_a_grid(fmt, m, n, k, with_bias):
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=gen)
    bias = torch.randn(n, generator=gen) if with_bias else None
    prepared = _prepared(fmt, n, k)
    got = lt.linear_triton(
        x.to(DEVICE), _on_device(prepared), bias.to(DEVICE) if with_bias else None, fmt, tile=TILE
    )
    assert got.shape == (m, n) and got.dtype == torch.float32 and got.device.type == DEVICE
    _assert_within_fp32_rounding(got, x, lt.dequantize_prepared(prepared, fmt), bias)
    want = lt.reference(x, prepared, bias, fmt)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5 * (1 + want.abs().max()))


@runnable
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [1, 17, 70])  # one row of lt.TILES each
def test_default_tiles(fmt, m):
    """The launcher's own tiles (BLOCK_K 128 / 64 over K = 96: a partly masked K step)."""
    n, k = 50, 96
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n))
    prepared = _prepared(fmt, n, k)
    got = lt.linear_triton(x.to(DEVICE), _on_device(prepared), bias.to(DEVICE), fmt)
    _assert_within_fp32_rounding(got, x, lt.dequantize_prepared(prepared, fmt), bias)


# the interpreter's bf16 is not torch's (its fp32 → bf16 cast truncates): bf16 on a GPU only
HALF = [torch.float16] if INTERPRETED else [torch.float16, torch.bfloat16]


@runnable
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", HALF)
def test_half_activations_multiply_the_weight_rounded_to_their_dtype(fmt, dtype):
    """fp16 / bf16 x: the dequantized tile is rounded to x's dtype, the dot accumulates in fp32
    and y is rounded once to x's dtype."""
    m, n, k = 3, 40, 64
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(m, k, generator=gen).to(dtype)
    bias = torch.randn(n, generator=gen)
    prepared = _prepared(fmt, n, k)
    got = lt.linear_triton(x.to(DEVICE), _on_device(prepared), bias.to(DEVICE), fmt, tile=TILE)
    assert got.dtype == dtype and got.shape == (m, n)
    weight = lt.dequantize_prepared(prepared, fmt).to(dtype).double()
    want = x.double() @ weight.t() + bias.double()
    magnitude = x.double().abs() @ weight.abs().t() + bias.double().abs()
    # the fp32 accumulation's rounding, then one rounding to the dtype (subnormals included)
    finfo = torch.finfo(dtype)
    bound = (k + 2) * 2.0**-24 * magnitude + finfo.eps * (want.abs() + finfo.tiny)
    assert bool(((got.cpu().double() - want).abs() <= bound).all())


@runnable
def test_leading_dimensions_and_strided_rows():
    fmt, n, k = "int4", 40, 64
    prepared = _on_device(_prepared(fmt, n, k))
    x = torch.randn(2, 3, 2 * k)[..., :k].to(DEVICE)  # rows 2K apart
    got = lt.linear_triton(x, prepared, None, fmt, tile=TILE)
    assert got.shape == (2, 3, n)
    want = lt.reference(x.cpu(), prepared, None, fmt)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert lt.linear_triton(x[:, :0], prepared, None, fmt).shape == (2, 0, n)


@runnable
def test_bad_inputs_are_refused():
    prepared = _on_device(_prepared("int8", 40, 64))
    with pytest.raises(ValueError, match="input features"):
        lt.linear_triton(torch.zeros(2, 32, device=DEVICE), prepared, None, "int8")
    with pytest.raises(TypeError, match="float32"):
        x = torch.zeros(2, 64, dtype=torch.float64, device=DEVICE)
        lt.linear_triton(x, prepared, None, "int8")
    with pytest.raises(ConfigError, match="unknown Triton linear format"):
        lt.linear_triton(torch.zeros(2, 64, device=DEVICE), prepared, None, "int3")


def test_group_formats_need_whole_groups():
    with pytest.raises(ConfigError, match="multiple of 32"):
        lt.prepare_triton(torch.randn(8, 48), "mxfp4")


def test_module_imports_without_triton_and_the_cpu_engine_never_imports_it():
    code = """
import sys
import infergen, infergen.llm, infergen.engine.engine, infergen.engine.runner
import infergen.models.transformer, infergen.layers.linear
import infergen.ops.linear_quantized, infergen.ops.linear_grouped
assert "infergen.ops.linear_triton" not in sys.modules, "the CPU engine imported it"
sys.modules["triton"] = sys.modules["triton.language"] = None  # as if not installed
import torch
from infergen.ops import linear_triton as lt
p = lt.prepare_triton(torch.randn(16, 32), "int4")
assert lt.reference(torch.randn(2, 32), p, None, "int4").shape == (2, 16)
try:
    lt.linear_triton(torch.randn(2, 32), p, None, "int4")
except RuntimeError as e:
    assert "pip install" in str(e)
else:
    raise AssertionError("linear_triton ran without Triton")
"""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
