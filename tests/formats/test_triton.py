"""Triton MX kernels equal the torch reference bit for bit: in the interpreter on the CPU
(TRITON_INTERPRET=1, set by tests/conftest.py before triton is first imported), or on
a GPU when run with TRITON_INTERPRET=0 (benchmarks/device_check.sh). Skips when Triton is not
installed (an optional extra; `make test` installs it)."""

from __future__ import annotations

import math
import os

import pytest
import torch

triton = pytest.importorskip("triton")

from infergen.formats import FORMATS, PER_CHANNEL, PER_TENSOR, codec, quantize  # noqa: E402
from infergen.formats import triton_kernels as tk  # noqa: E402
from infergen.formats.codec import _blocks, dequantize  # noqa: E402
from infergen.formats.pack import unpack_bits  # noqa: E402

from .test_fast import _adversarial  # noqa: E402

MX = [n for n in FORMATS if FORMATS.get(n).scaling == "e8m0"]
# the interpreter runs numpy, which warns on the Inf / Inf the kernels then map to code 0
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED else "cuda"
runnable = pytest.mark.skipif(
    not INTERPRETED and not torch.cuda.is_available(), reason="no GPU and no interpreter"
)


@runnable
@pytest.mark.parametrize("fmt", MX)
@pytest.mark.parametrize("rule", ["floor", "rceil"])
def test_triton_mx_quantize_equals_reference(fmt, rule):
    x = _adversarial(4)
    spec = FORMATS.get(fmt)
    ref = quantize(x, fmt, scale_rule=rule, native=False)
    blocks = _blocks(x, 1, 32)
    codes, scales = tk.mx_quantize(blocks.to(DEVICE), spec.element_type, rule)
    codes, scales = codes.cpu(), scales.cpu()  # FP4: packed two a byte by the kernel
    assert torch.equal(codes.reshape(ref.codes.shape), ref.codes)
    assert torch.equal(scales.reshape(ref.scales.shape), ref.scales)


@runnable
@pytest.mark.parametrize("fmt", MX)
def test_triton_mx_dequantize_equals_reference(fmt):
    q = quantize(_adversarial(5), fmt)
    spec = FORMATS.get(fmt)
    codes = unpack_bits(q.codes, 4) if spec.packed else q.codes
    got = tk.mx_dequantize(
        codes.reshape(-1, 32).to(DEVICE), q.scales.reshape(-1).to(DEVICE), spec.element_type
    ).cpu()
    want = dequantize(q, native=False)
    torch.testing.assert_close(got.reshape(want.shape), want, rtol=0, atol=0, equal_nan=True)


@runnable
def test_triton_nvfp4_equals_reference():
    x = _adversarial(6)
    ref = quantize(x, "nvfp4", native=False)
    blocks = _blocks(x, 1, 16)
    codes, scales = tk.nvfp4_quantize(blocks.to(DEVICE), ref.global_scale)
    assert torch.equal(codes.cpu().reshape(-1), ref.codes.reshape(-1))  # packed two a byte
    assert torch.equal(scales.cpu().reshape(-1), ref.scales.reshape(-1))
    e2m1 = FORMATS.get("nvfp4").element_type
    want = dequantize(ref, native=False)
    got = tk.fp4_dequantize(codes, scales, 16, e2m1, ref.global_scale.to(DEVICE)).cpu()
    torch.testing.assert_close(got.reshape(want.shape), want, rtol=0, atol=0, equal_nan=True)
    e4m3 = FORMATS.get("fp8_e4m3").element_type
    got = tk.scaled_dequantize(  # the unpacked path: E4M3 scales decoded first
        unpack_bits(codes.cpu(), 4).reshape(-1, 16).to(DEVICE),
        e4m3.decode(scales.cpu()).reshape(-1).to(DEVICE),
        ref.global_scale,
        e2m1,
    ).cpu()
    torch.testing.assert_close(got.reshape(want.shape), want, rtol=0, atol=0, equal_nan=True)


@runnable
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_triton_fp8_equals_reference(fmt):
    x = _adversarial(7)
    ref = quantize(x, fmt, native=False)
    et = FORMATS.get(fmt).element_type
    codes = tk.scaled_quantize(x.to(DEVICE), ref.scales, et).cpu()
    assert torch.equal(codes, ref.codes)
    got = tk.scaled_dequantize(
        codes.reshape(1, -1).to(DEVICE), ref.scales.to(DEVICE), torch.ones(1), et
    ).cpu()
    want = dequantize(ref, native=False)
    torch.testing.assert_close(got.reshape(want.shape), want, rtol=0, atol=0, equal_nan=True)


@runnable
@pytest.mark.parametrize("fmt,block", [("int8", 32), ("int4", 32), ("int4_asym", 64), ("int2", 32)])
def test_triton_int_quantize_equals_reference(fmt, block):
    x = _adversarial(8)
    x[6, :32] = 5.0  # constant groups
    x[7, :32] = -2.0
    spec = FORMATS.get(fmt)
    ref = quantize(x, fmt, block_size=block, native=False)
    blocks = _blocks(x, 1, block)
    mode = 0 if spec.symmetric else 2 if spec.float_offset else 1
    codes, scales, zeros = tk.int_quantize(blocks.to(DEVICE), spec.int_bits, mode)
    assert torch.equal(codes.cpu().reshape(ref.codes.shape), ref.codes)  # packed as stored
    torch.testing.assert_close(
        scales.cpu().reshape(ref.scales.shape), ref.scales, rtol=0, atol=0, equal_nan=True
    )
    if ref.zero_points is not None:
        torch.testing.assert_close(
            zeros.cpu().reshape(ref.zero_points.shape),
            ref.zero_points,
            rtol=0,
            atol=0,
            equal_nan=True,
        )


@runnable
@pytest.mark.parametrize("fmt,block", [("int8", 32), ("int4", 32), ("int4_asym", 64), ("int2", 32)])
def test_triton_int_dequantize_equals_reference(fmt, block):
    x = _adversarial(9)
    spec = FORMATS.get(fmt)
    q = quantize(x, fmt, block_size=block, native=False)
    codes = unpack_bits(q.codes, spec.int_bits) if spec.packed else q.codes
    zeros = q.zero_points.reshape(-1).to(DEVICE) if q.zero_points is not None else None
    got = tk.int_dequantize(
        codes.reshape(-1, block).to(DEVICE),
        q.scales.reshape(-1).to(DEVICE),
        zeros,
        spec.int_bits,
    ).cpu()
    want = dequantize(q, native=False)
    torch.testing.assert_close(got.reshape(want.shape), want, rtol=0, atol=0, equal_nan=True)


CASES = [(f, 32 if FORMATS.get(f).scaling == "int" else None, 64) for f in FORMATS] + [
    ("int8", PER_CHANNEL, 1024),  # wide rows: fewer blocks per program
    ("int8", PER_CHANNEL, 576),  # no power of two: the torch reference on the device
    ("int8", PER_TENSOR, 64),
    ("int4_asym", 128, 128),
]


@runnable
@pytest.mark.parametrize("fmt,block,width", CASES)
def test_public_api_runs_triton_for_the_device(fmt, block, width, monkeypatch):
    """quantize / dequantize of a tensor on DEVICE take the Triton path (codec.FAST_PATHS;
    in the interpreter the CPU row is pointed at it) and equal the reference bit for bit."""
    if INTERPRETED:
        monkeypatch.setitem(codec.FAST_PATHS, "cpu", lambda: tk)
    assert codec.fast_paths(torch.empty(0, device=DEVICE)) is tk
    x = _adversarial(10).reshape(-1)
    x = x[: len(x) // width * width].reshape(-1, width)
    ref = quantize(x, fmt, block_size=block, native=False)
    want = dequantize(ref, native=False)
    for native in (True, False):  # the Triton path, and the torch reference on the device
        q = quantize(x.to(DEVICE), fmt, block_size=block, native=native)
        for name in ("codes", "scales", "zero_points", "global_scale"):
            got, expected = getattr(q, name), getattr(ref, name)
            assert (got is None) == (expected is None), name
            if expected is not None:
                assert got.device.type == DEVICE, name
                torch.testing.assert_close(
                    got.cpu(), expected, rtol=0, atol=0, equal_nan=True, msg=f"{name} {native=}"
                )
        got = dequantize(q, native=native)
        assert got.device.type == DEVICE
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)


@runnable
def test_triton_finite_amax_ignores_nan_and_inf():
    x = _adversarial(11)
    want = x.abs().where(torch.isfinite(x), torch.zeros(())).amax()
    assert tk.finite_amax(x.to(DEVICE)).item() == want.item()
    assert tk.finite_amax(torch.full((5,), math.inf, device=DEVICE)).item() == 0.0


def _ragged(rows: int, cols: int, seed: int) -> torch.Tensor:
    """N(0, 1) values over a wide range of magnitudes, with a NaN, an Inf and a zero block
    near the end (the last, partial tile)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen) * 10.0 ** torch.randint(
        -3, 4, (rows, 1), generator=gen
    )
    flat = x.view(-1)
    if flat.numel() >= 64:
        flat[-5] = math.nan
        flat[-40] = -math.inf
        flat[:32] = 0.0
    return x


# Blocks per program are TILE / width (MX 128 of 32, NVFP4 256 of 16): one block, a count just
# past one tile, and a large odd count (partial last tiles); per tensor: odd value counts.
RAGGED = [(1, 32), (3, 43 * 32), (7, 143 * 32)]


@runnable
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("shape", RAGGED)
def test_partial_tiles_equal_reference(fmt, shape, monkeypatch):
    """Every format through the public API on block counts that do not fill the last tile:
    codes (packed by the kernel), scales and the dequantized values bit for bit."""
    if INTERPRETED:
        monkeypatch.setitem(codec.FAST_PATHS, "cpu", lambda: tk)
    spec = FORMATS.get(fmt)
    rows, cols = shape
    if spec.block_size == PER_TENSOR:
        cols = 1 if cols == 32 else cols + 1  # odd value counts
    block = 32 if spec.scaling == "int" else None
    x = _ragged(rows, cols, seed=cols)
    ref = quantize(x, fmt, block_size=block, native=False)
    q = quantize(x.to(DEVICE), fmt, block_size=block)
    for name in ("codes", "scales", "zero_points", "global_scale"):
        got, expected = getattr(q, name), getattr(ref, name)
        if expected is not None:
            torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0, equal_nan=True)
    want = dequantize(ref, native=False)
    got = dequantize(q).cpu()
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@runnable
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("n_bytes", [1, 3001])
def test_triton_unpack_bits_equals_pack_module(bits, n_bytes):
    gen = torch.Generator().manual_seed(n_bytes)
    packed = torch.randint(0, 256, (n_bytes,), dtype=torch.uint8, generator=gen)
    got = tk.unpack_bits(packed.to(DEVICE), bits).cpu()
    assert torch.equal(got, unpack_bits(packed, bits))


@runnable
def test_triton_finite_amax_grid_stride(monkeypatch):
    """More tiles than programs: each program loops (the maximum sits in the last tile)."""
    monkeypatch.setattr(tk, "AMAX_PROGRAMS", 3)
    x = torch.randn(5 * tk.tile_size() + 7, generator=torch.Generator().manual_seed(3))
    x[-2] = -123.5
    x[7] = math.inf
    assert tk.finite_amax(x.to(DEVICE)).item() == 123.5
