"""quantize / dequantize against independent numpy + ml_dtypes references written from the
spec text (REFERENCES §3), the published SQNR figures, and torchao where it runs on CPU."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from infergen.formats import (
    FORMATS,
    PER_CHANNEL,
    PER_TENSOR,
    QuantizedTensor,
    dequantize,
    quantize,
    sqnr_db,
)

ML = {
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e2m1": ml_dtypes.float4_e2m1fn,
}
MX = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4"]


def _cast(values: np.ndarray, element: str) -> np.ndarray:
    mx = float(ml_dtypes.finfo(ML[element]).max)
    return np.clip(values.astype(np.float32), -mx, mx).astype(ML[element]).view(np.uint8)


def _unpack(q: QuantizedTensor) -> np.ndarray:
    codes = q.codes.numpy()
    if FORMATS.get(q.format).element_bits == 4:
        return np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(*codes.shape[:-1], -1)
    return codes


def mx_reference(x: np.ndarray, element: str, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """OCP MX v1.0, block by block in plain numpy: (E8M0 scale bytes, element codes)."""
    mx = float(ml_dtypes.finfo(ML[element]).max)
    emax = math.floor(math.log2(mx))
    blocks = x.reshape(-1, 32).astype(np.float32)
    scales, codes = [], []
    for block in blocks:
        amax = float(np.max(np.abs(block)))
        if not math.isfinite(amax):
            scales.append(0xFF)
            codes.append(np.zeros(32, np.uint8))
            continue
        if amax == 0:
            exp = -127
        elif rule == "floor":
            exp = math.frexp(amax)[1] - 1 - emax
        else:
            exp = math.ceil(math.log2(float(np.float32(amax) / np.float32(mx))))
        exp = max(-127, min(127, exp))
        scales.append(exp + 127)
        codes.append(_cast((block.astype(np.float64) * 2.0**-exp).astype(np.float32), element))
    return np.array(scales, np.uint8), np.stack(codes)


def nvfp4_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """NVFP4 two-level scaling from REFERENCES §3 in numpy: (E4M3 scale bytes, codes, global)."""
    blocks = x.reshape(-1, 16).astype(np.float32)
    g = np.float32(np.max(np.abs(blocks))) / np.float32(6 * 448)
    scales, codes = [], []
    for block in blocks:
        amax = np.float32(np.max(np.abs(block)))
        s = _cast(np.array([amax / np.float32(6) / g], np.float32), "e4m3")[0]
        sval = np.float32(np.array([s], np.uint8).view(ML["e4m3"]).astype(np.float32)[0])
        scales.append(s)
        if sval == 0:
            codes.append(np.zeros(16, np.uint8))
        else:
            codes.append(_cast(block / (sval * g), "e2m1"))
    return np.array(scales, np.uint8), np.stack(codes), float(g)


def _data(kind: str, n: int = 64 * 32, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = {
        "normal": lambda: torch.randn(n, generator=gen),
        "tiny": lambda: torch.randn(n, generator=gen) * 1e-30,
        "huge": lambda: torch.randn(n, generator=gen) * 1e30,
        "heavy": lambda: torch.randn(n, generator=gen) ** 5,
        "uniform": lambda: torch.rand(n, generator=gen) * 1000 - 500,
    }[kind]()
    return x.view(-1, 64)


@pytest.mark.parametrize("fmt", MX)
@pytest.mark.parametrize("rule", ["floor", "rceil"])
@pytest.mark.parametrize("kind", ["normal", "tiny", "huge", "heavy", "uniform"])
def test_mx_matches_spec_reference(fmt, rule, kind):
    x = _data(kind)
    x[0, :32] = 0.0  # an all-zero block
    x[1, 5] = 1e6  # a single huge value in a block
    x[2, :32] = torch.tensor([2.0**k for k in range(-16, 16)])  # powers of two: exact ties
    q = quantize(x, fmt, scale_rule=rule)
    element = FORMATS.get(fmt).element
    want_scales, want_codes = mx_reference(x.numpy(), element, rule)
    np.testing.assert_array_equal(q.scales.numpy().reshape(-1), want_scales)
    np.testing.assert_array_equal(_unpack(q).reshape(-1, 32), want_codes)


@pytest.mark.parametrize("fmt", MX)
def test_mx_nan_and_inf_blocks(fmt):
    x = torch.randn(4, 32)
    x[1, 3] = math.nan
    x[2, 7] = -math.inf
    q = quantize(x, fmt)
    assert q.scales.reshape(-1).tolist()[1:3] == [0xFF, 0xFF]
    y = dequantize(q)
    assert y[1].isnan().all() and y[2].isnan().all()
    assert y[0].isfinite().all() and y[3].isfinite().all()


@pytest.mark.parametrize("kind", ["normal", "heavy", "uniform", "tiny"])
def test_nvfp4_matches_spec_reference(kind):
    x = _data(kind, seed=1)
    x[0, :16] = 0.0
    q = quantize(x, "nvfp4")
    scales, codes, g = nvfp4_reference(x.numpy())
    assert q.global_scale.item() == g
    np.testing.assert_array_equal(q.scales.numpy().reshape(-1), scales)
    np.testing.assert_array_equal(_unpack(q).reshape(-1, 16), codes)
    assert (dequantize(q)[0, :16] == 0).all()


def test_nvfp4_nan_block_keeps_nan():
    x = torch.randn(2, 32)
    x[1, 20] = math.nan
    y = dequantize(quantize(x, "nvfp4"))
    assert y[1, 16:].isnan().all() and y[:, :16].isfinite().all() and y[0].isfinite().all()


@pytest.mark.parametrize(
    "fmt,block",
    [
        ("int8", PER_CHANNEL),
        ("int8", PER_TENSOR),
        ("int8", 32),
        ("int4", 32),
        ("int4", 128),
        ("int4_asym", 64),
        ("int2", 32),
    ],
)
def test_int_matches_numpy_reference(fmt, block):
    spec = FORMATS.get(fmt)
    x = _data("normal", n=8 * 256, seed=2).reshape(8, 256)
    x[0, :] = 0.0
    q = quantize(x, fmt, block_size=block)
    xs = x.numpy().astype(np.float32)
    g = {PER_CHANNEL: 256, PER_TENSOR: xs.size}.get(block, block)
    blocks = xs.reshape(-1, g)
    if spec.symmetric:
        qmax = 2 ** (spec.int_bits - 1) - 1
        scale = np.abs(blocks).max(axis=1) / np.float32(qmax)
        q_ref = np.clip(np.rint(blocks / np.where(scale == 0, 1, scale)[:, None]), -qmax, qmax)
        deq = q_ref * scale[:, None]
    elif spec.float_offset:
        qmax = 2**spec.int_bits - 1
        lo, hi = blocks.min(axis=1), blocks.max(axis=1)
        scale = (hi - lo) / np.float32(qmax)
        div = np.where(scale == 0, 1, scale)
        q_ref = np.clip(np.rint((blocks - lo[:, None]) / div[:, None]), 0, qmax)
        deq = q_ref * scale[:, None] + lo[:, None]
    else:
        qmax = 2**spec.int_bits - 1
        lo = np.minimum(blocks.min(axis=1), 0)
        hi = np.maximum(blocks.max(axis=1), 0)
        scale = (hi - lo) / np.float32(qmax)
        div = np.where(scale == 0, 1, scale)
        zero = np.clip(np.rint(-lo / div), 0, qmax)
        q_ref = np.clip(np.rint(blocks / div[:, None]) + zero[:, None], 0, qmax)
        deq = (q_ref - zero[:, None]) * scale[:, None]
    np.testing.assert_array_equal(q.scales.numpy().reshape(-1), scale.astype(np.float32))
    np.testing.assert_array_equal(dequantize(q).numpy().reshape(-1, g), deq.astype(np.float32))


# REFERENCES §3: SQNR (dB) on N(0,1) data, ties-to-even, saturating.
PUBLISHED_SQNR = [
    ("fp8_e4m3", None, None, 31.5),
    ("fp8_e5m2", None, None, 25.6),
    ("mxfp8_e4m3", None, "floor", 30.7),
    ("mxfp8_e4m3", None, "rceil", 31.5),
    ("mxfp6_e2m3", None, None, 30.9),
    ("mxfp6_e3m2", None, None, 25.4),
    ("mxfp4", None, None, 18.8),
    ("nvfp4", None, None, 20.4),
    ("int8", 32, None, 45.4),
    ("int4", 32, None, 20.3),
    ("int4", 128, None, 18.6),
    ("int2", 32, None, 8.1),
]


@pytest.mark.parametrize("fmt,block,rule,published", PUBLISHED_SQNR)
def test_sqnr_matches_published_figures(fmt, block, rule, published):
    x = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(3))
    got = sqnr_db(x, dequantize(quantize(x, fmt, block_size=block, scale_rule=rule)))
    assert abs(got - published) < 0.1, f"{fmt}: {got:.2f} dB, published {published}"


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_axis_is_the_blocked_axis(fmt):
    x = torch.randn(128, 64)
    a = dequantize(quantize(x, fmt, axis=0))
    b = dequantize(quantize(x.t().contiguous(), fmt, axis=-1)).t()
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert a.shape == x.shape


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_save_load_round_trip(fmt, tmp_path):
    x = torch.randn(16, 128, dtype=torch.bfloat16)
    q = quantize(x, fmt)
    q.save(tmp_path / "q.safetensors")
    back = QuantizedTensor.load(tmp_path / "q.safetensors")
    assert back.format == fmt and back.shape == q.shape and back.dtype == torch.bfloat16
    torch.testing.assert_close(dequantize(back), dequantize(q), rtol=0, atol=0)


@pytest.mark.parametrize("native", [True, False])
def test_e8m0_scales_decode_like_torch(native):
    """Every normal E8M0 byte (and 0xFF = NaN) scales an element 1.0 to torch's float8_e8m0fnu
    value (0x00 = 2^-127 is an fp32 subnormal, zero under the flush-to-zero tests run with)."""
    scales = torch.arange(1, 256, dtype=torch.uint8)
    one = FORMATS.get("mxfp8_e4m3").element_type.encode(torch.ones(1))
    q = QuantizedTensor(
        "mxfp8_e4m3",
        one.repeat(255 * 32).view(255, 32),
        scales.view(255, 1),
        None,
        None,
        (255, 32),
        torch.float32,
        1,
        32,
        "floor",
    )
    want = scales.view(torch.float8_e8m0fnu).float()
    got = dequantize(q, native=native)[:, 0]
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def test_bits_per_value():
    bpv = {name: FORMATS.get(name).bits_per_value() for name in FORMATS}
    assert bpv["mxfp4"] == 4.25 and bpv["nvfp4"] == 4.5 and bpv["mxfp8_e4m3"] == 8.25
    assert bpv["mxfp6_e2m3"] == 6.25 and bpv["fp8_e4m3"] == 8
    assert bpv["int4"] == 4 + 32 / 32 and bpv["int4_asym"] == 4 + 40 / 32
    assert bpv["int2"] == 2 + 64 / 32


def test_bad_arguments_are_named():
    x = torch.randn(4, 48)
    with pytest.raises(ValueError, match="not a multiple of the block size 32"):
        quantize(x, "mxfp4")
    with pytest.raises(ValueError, match="block_size 16 is not supported"):
        quantize(x, "int4", block_size=16)
    with pytest.raises(ValueError, match="scale_rule 'ceil'"):
        quantize(torch.randn(4, 64), "mxfp4", scale_rule="ceil")
    with pytest.raises(Exception, match="unknown format 'fp3'"):
        quantize(x, "fp3")
    with pytest.raises(TypeError, match="floating-point"):
        quantize(torch.ones(4, 64, dtype=torch.int32), "int8")
