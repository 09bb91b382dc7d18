"""Our MX and NVFP4 codecs against torchao's CPU implementations (torchao 0.18,
torchao.prototype.mx_formats).

Documented differences, kept out of the compared data:
- MX: torchao clamps a 2^-127 block scale to 2^-126 before dividing (its comment: subnormal
  handling in Triton), so blocks with amax < 2^-118 would differ; scales are identical.
- NVFP4: torchao clamps block scales to >= E4M3_EPS (2^-9, no zero scale) and multiplies by
  a reciprocal ((1 / global) / scale) where we divide by scale · global, so an element on an
  exact rounding tie can land one code apart; scales are identical.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from infergen.formats import quantize
from infergen.formats.pack import unpack_bits

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale

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
