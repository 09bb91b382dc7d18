"""The C fast path (formats/fast.py, kernels/quantize_f32.c) equals the torch reference bit
for bit, on random data of several scales and on adversarial values."""

from __future__ import annotations

import math

import pytest
import torch

from infergen.formats import ELEMENT_TYPES, FORMATS, dequantize, quantize
from infergen.kernels.build import try_load

FLOAT_FORMATS = [n for n in FORMATS if FORMATS.get(n).scaling != "int"]
INT_CASES = [
    ("int8", -1),
    ("int8", 0),
    ("int8", 32),
    ("int4", 32),
    ("int4", 64),
    ("int4_asym", 32),
    ("int4_asym", 64),
    ("int2", 32),
]


def test_fast_path_builds_here():
    assert try_load("quantize_f32") is not None


def _adversarial(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    parts = [torch.randn(64 * 32, generator=gen) * 10.0 ** float(k) for k in (-30, -3, 0, 3, 30)]
    for name in ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1"):  # every value and tie of each type
        pos = ELEMENT_TYPES.get(name).positive_values()
        mids = (pos[1:] + pos[:-1]) / 2
        vals = torch.cat([pos, mids, torch.nextafter(mids, torch.tensor(math.inf))])
        parts.append(torch.cat([vals, -vals]))
    x = torch.cat(parts)
    x = torch.cat([x, torch.zeros(-len(x) % 64)])
    x = x[torch.randperm(len(x), generator=gen)].view(-1, 64)
    x[0] = 0.0  # zero blocks
    x[1, 3] = math.nan
    x[2, 40] = math.inf
    x[3, :] = 1e-42  # fp32 subnormals
    x[4, 0] = -0.0
    x[5, 17] = 3e38
    return x


@pytest.mark.parametrize("fmt", FLOAT_FORMATS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fast_equals_reference(fmt, seed):
    x = _adversarial(seed)
    if seed == 2:  # 13 rows of 96: block counts that are no multiple of 8 (vector tails)
        x = x.reshape(-1)[: 13 * 96].reshape(13, 96)
        x[12, 90] = math.nan  # a bad block in the tail
    rules = FORMATS.get(fmt).scale_rules or (None,)
    for rule in rules:
        fast = quantize(x, fmt, scale_rule=rule)
        ref = quantize(x, fmt, scale_rule=rule, native=False)
        assert torch.equal(fast.codes, ref.codes), (fmt, rule)
        if fast.scales.dtype == torch.uint8:
            assert torch.equal(fast.scales, ref.scales), (fmt, rule)
        else:
            torch.testing.assert_close(fast.scales, ref.scales, rtol=0, atol=0)
        if ref.global_scale is not None:
            assert fast.global_scale.item() == ref.global_scale.item()


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_fast_dequantize_equals_reference(fmt):
    for x in (_adversarial(2), _adversarial(0)):
        q = quantize(x, fmt)
        fast, ref = dequantize(q), dequantize(q, native=False)
        torch.testing.assert_close(fast, ref, rtol=0, atol=0, equal_nan=True)
        finite = ~ref.isnan()  # bit for bit, the sign of zero included
        assert torch.equal(fast[finite].view(torch.int32), ref[finite].view(torch.int32)), fmt


@pytest.mark.parametrize("fmt,block", INT_CASES)
def test_fast_int_quantize_equals_reference(fmt, block):
    x = _adversarial(3)
    x[6, :32] = 5.0  # constant group (asymmetric: range widened to 0)
    x[7, :32] = -2.0
    fast, ref = quantize(x, fmt, block_size=block), quantize(x, fmt, block_size=block, native=False)
    assert torch.equal(fast.codes, ref.codes)
    torch.testing.assert_close(fast.scales, ref.scales, rtol=0, atol=0, equal_nan=True)
    if ref.zero_points is not None:
        torch.testing.assert_close(
            fast.zero_points, ref.zero_points, rtol=0, atol=0, equal_nan=True
        )


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("shape", [(3, 5, 64), (3, 7, 4000)])  # tails only; vectors + chunks
def test_c_pack_equals_reference(bits, shape):
    from infergen.formats import fast
    from infergen.formats.pack import pack_bits, unpack_bits

    codes = torch.randint(0, 1 << bits, shape, dtype=torch.uint8)
    packed = fast.pack_bits(codes, bits)
    assert torch.equal(packed, pack_bits(codes, bits))
    assert torch.equal(fast.unpack_bits(packed, bits), unpack_bits(packed, bits))
