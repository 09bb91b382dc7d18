"""Our MX and NVFP4 codecs against torchao's CPU implementations (torchao 0.18,
torchao.prototype.mx_formats).

Documented differences, kept out of the compared data:
- MX: torchao clamps a 2^-127 block scale to 2^-126 before dividing (its comment: subnormal
  handling in Triton), so blocks with amax < 2^-118 would differ; scales are identical.
- NVFP4: torchao clamps block scales to >= E4M3_EPS (2^-9, no zero scale) and multiplies by
  a reciprocal ((1 / global) / scale) where we divide by scale · global, so an element on an
  exact rounding tie can land one code apart; scales are identical.
- Integers (torchao.quantization.quant_primitives, the affine primitives behind its int8 /
  int4 weight-only configs): int8 and int4 symmetric with the restricted range ±(2^(b−1) − 1)
  and int4 asymmetric with an integer zero point are the same rule as ours, and codes, scales,
  zero points and dequantized values are identical (an all-zero group: torchao's scale is
  clamped to fp32's smallest normal, ours is 0; both decode to zeros). torchao's 2-bit
  asymmetric keeps an integer zero point (zero exactly representable); our int2 is KIVI's fp32
  minimum, so it is not compared here (tests/formats/test_codec.py checks it against numpy).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from infergen.formats import dequantize, quantize
from infergen.formats.pack import unpack_bits
from infergen.formats.spec import PER_CHANNEL, PER_TENSOR

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale
    from torchao.quantization.quant_primitives import (
        MappingType,
        choose_qparams_affine,
        dequantize_affine,
        quantize_affine,
    )

ELEM = {
    "mxfp8_e4m3": torch.float8_e4m3fn,
    "mxfp8_e5m2": torch.float8_e5m2,
    "mxfp6_e2m3": "fp6_e2m3",
    "mxfp6_e3m2": "fp6_e3m2",
    "mxfp4": torch.float4_e2m1fn_x2,
}
MODES = {"floor": ScaleCalculationMode.FLOOR, "rceil": ScaleCalculationMode.RCEIL}


def _their_codes(fmt: str, data: torch.Tensor) -> torch.Tensor:
    """torchao's element payload as one uint8 code per element."""
    if fmt == "mxfp4":
        return unpack_bits(data.view(torch.uint8), 4)
    if fmt.startswith("mxfp6"):
        return data.view(torch.uint8)  # unpacked fp6: one code per byte, low 6 bits
    return data.view(torch.uint8)


@pytest.mark.parametrize("fmt", list(ELEM))
@pytest.mark.parametrize("rule", list(MODES))
@pytest.mark.parametrize("scale", [1e-20, 1.0, 3e4])
def test_mx_matches_torchao(fmt, rule, scale):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(64, 256, generator=gen) * scale
    x[3, 32:64] = 0.0
    x[5, 7] = 5000 * scale
    their_scales, their_data = to_mx(x, ELEM[fmt], 32, MODES[rule])
    q = quantize(x, fmt, scale_rule=rule)
    assert torch.equal(q.scales.reshape(-1), their_scales.view(torch.uint8).reshape(-1))
    ours = unpack_bits(q.codes, 4) if fmt == "mxfp4" else q.codes
    assert torch.equal(ours.reshape(-1), _their_codes(fmt, their_data).reshape(-1))


def test_nvfp4_matches_torchao():
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(128, 256, generator=gen) * 3
    amax = x.abs().max()
    their_scales, their_data = nvfp4_quantize(x, 16, per_tensor_amax_to_scale(amax))
    q = quantize(x, "nvfp4")
    torch.testing.assert_close(q.global_scale, per_tensor_amax_to_scale(amax), rtol=0, atol=0)
    assert torch.equal(q.scales.reshape(-1), their_scales.view(torch.uint8).reshape(-1))
    ours = unpack_bits(q.codes, 4).reshape(-1).long()
    theirs = unpack_bits(their_data.view(torch.uint8), 4).reshape(-1).long()
    differ = ours != theirs
    assert differ.float().mean() < 1e-3  # reciprocal-vs-division ties only
    print(f"nvfp4 vs torchao: {int(differ.sum())} of {differ.numel()} codes differ")
    if differ.any():
        assert ((ours[differ] & 7) - (theirs[differ] & 7)).abs().max() <= 1


# format -> (torchao mapping, storage dtype, quant_min, quant_max)
AFFINE = {
    "int8": (MappingType.SYMMETRIC, torch.int8, -127, 127),
    "int4": (MappingType.SYMMETRIC, torch.int8, -7, 7),
    "int4_asym": (MappingType.ASYMMETRIC, torch.uint8, 0, 15),
}


def _signed_codes(q) -> torch.Tensor:
    """Our codes as integers: unpacked, two's complement sign-extended for symmetric formats."""
    bits = 8 if q.format == "int8" else 4
    codes = (q.codes if bits == 8 else unpack_bits(q.codes, bits)).to(torch.int32)
    if q.format == "int4_asym":
        return codes
    return torch.where(codes >= (1 << (bits - 1)), codes - (1 << bits), codes)


@pytest.mark.parametrize(
    "fmt,block",
    [
        ("int8", PER_CHANNEL),
        ("int8", PER_TENSOR),
        ("int8", 32),
        ("int4", 32),
        ("int4", 128),
        ("int4_asym", 32),
        ("int4_asym", 64),
    ],
)
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e4])
def test_int_matches_torchao(fmt, block, scale):
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(32, 256, generator=gen) * scale
    x[2] = 0.0  # all-zero rows / groups
    x[4, :8] = torch.tensor([3.5, -3.5, 0.5, -0.5, 1e6, -1e6, 1e-30, -0.0]) * scale
    x[6] = x[6].abs()  # one-signed groups (asymmetric zero point at the edge)
    mapping, dtype, lo, hi = AFFINE[fmt]
    group = {PER_CHANNEL: (1, 256), PER_TENSOR: (32, 256)}.get(block, (1, block))
    their_scale, their_zero = choose_qparams_affine(x, mapping, group, dtype, lo, hi)
    their_codes = quantize_affine(x, group, their_scale, their_zero, dtype, lo, hi)
    their_values = dequantize_affine(
        their_codes, group, their_scale, their_zero, dtype, lo, hi, output_dtype=torch.float32
    )
    q = quantize(x, fmt, block_size=block)
    assert torch.equal(_signed_codes(q).reshape(-1), their_codes.to(torch.int32).reshape(-1))
    # torchao clamps the scale of an all-zero group to fp32's smallest normal; ours is 0
    ours_scale, their_scale = q.scales.reshape(-1), their_scale.reshape(-1)
    nonzero = ours_scale != 0
    assert torch.equal(ours_scale[nonzero], their_scale[nonzero])
    assert (their_scale[~nonzero] == torch.finfo(torch.float32).tiny).all()
    if q.zero_points is not None:
        assert torch.equal(q.zero_points.to(torch.int32).reshape(-1), their_zero.reshape(-1))
    assert torch.equal(dequantize(q), their_values)
