"""Element types: the minifloats of FP8 / MX / NVFP4 and the E8M0 scale, as data.

A minifloat is sign-magnitude with `ebits` exponent bits (bias `bias`) and `mbits` mantissa
bits. Its value table is computed from the bit fields (`decode_table`); encoding is exact
arithmetic on fp32, so no float conversion library sits between a value and its code:

- Round to nearest, ties to even (IEEE 754 default; OCP MX v1.0 §5.3 and the OCP 8-bit FP
  spec prescribe it for conversions; NVIDIA hardware does the same).
- Saturating ("satfinite", CUDA `__NV_SATFINITE`): finite values beyond ±max and ±Inf become
  ±max. NaN stays NaN where the type has a NaN code (E4M3FN 0x7F, E5M2 0x7F); the FP6/FP4
  types have no NaN (OCP MX §5.3.3) and encode NaN as +0 — MX and NVFP4 carry a NaN block
  in its scale instead.
- Subnormals are kept: below the smallest normal the quantum stays 2^(emin - mbits).
- The sign of zero is kept (-0.0 → the negative-zero code), as ml_dtypes and torch do.

E8M0 (OCP MX §5.4.1): an unsigned biased exponent, bias 127, 0x00 = 2^-127, 0xFE = 2^127,
0xFF = NaN; no sign, no zero.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from infergen.registry import Registry


@dataclass(frozen=True)
class Minifloat:
    name: str
    ebits: int
    mbits: int
    bias: int
    has_inf: bool  # all-ones exponent, zero mantissa = Inf (IEEE-like: E5M2)
    nan_codes: tuple[int, ...]  # magnitude codes (sign bit clear) that mean NaN

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal (and of the subnormal quantum's scale)."""
        return 1 - self.bias

    @property
    def max_code(self) -> int:
        """Largest finite magnitude code."""
        finite = [c for c in range(1 << (self.bits - 1)) if math.isfinite(self.magnitude(c))]
        return max(finite)

    @property
    def max(self) -> float:
        return self.magnitude(self.max_code)

    @property
    def emax(self) -> int:
        """Exponent of the largest normal: the `emax_elem` of the MX scale rule."""
        return math.floor(math.log2(self.max))

    @property
    def smallest_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.mbits)

    def magnitude(self, code: int) -> float:
        """Value of a magnitude code (sign bit clear), from the bit fields."""
        if code in self.nan_codes:
            return math.nan
        exp_field, mant = code >> self.mbits, code & ((1 << self.mbits) - 1)
        if self.has_inf and exp_field == (1 << self.ebits) - 1:
            return math.inf if mant == 0 else math.nan
        if exp_field == 0:  # subnormal: 0.m · 2^emin
            return mant * 2.0 ** (self.emin - self.mbits)
        return (1 + mant / (1 << self.mbits)) * 2.0 ** (exp_field - self.bias)

    def decode_table(self) -> torch.Tensor:
        """fp32 value of every code 0 .. 2^bits - 1 (sign bit = the top bit)."""
        return _decode_table(self)

    def positive_values(self) -> torch.Tensor:
        """Finite magnitudes, code 0 .. max_code, ascending (code order = value order)."""
        return self.decode_table()[: self.max_code + 1]

    @property
    def nan_code(self) -> int | None:
        """The code written for NaN (positive sign), or None where the type has none."""
        return max(self.nan_codes) if self.nan_codes else None

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """fp32 values → uint8 codes: round to nearest even, saturating, NaN kept (see module)."""
        x = x.float()
        sign = torch.signbit(x)
        a = x.abs()
        nan = torch.isnan(a)
        a = torch.where(nan, torch.zeros_like(a), a.clamp(max=self.max))  # ±Inf → ±max
        _, exp = torch.frexp(a)  # a = m · 2^exp, m in [0.5, 1): floor(log2 a) = exp - 1
        scale_exp = (exp - 1).clamp(min=self.emin) - self.mbits  # quantum of a's binade
        rounded = torch.ldexp(torch.round(torch.ldexp(a, -scale_exp)), scale_exp)  # RNE
        rounded = rounded.clamp(max=self.max).contiguous()  # rounding past max saturates
        codes = torch.searchsorted(self.positive_values().to(a.device), rounded).to(torch.int32)
        codes = codes | (sign.to(torch.int32) << (self.bits - 1))
        if self.nan_code is not None:
            codes = torch.where(
                nan, (sign.to(torch.int32) << (self.bits - 1)) | self.nan_code, codes
            )
        else:
            codes = torch.where(nan, torch.zeros_like(codes), codes)
        return codes.to(torch.uint8)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """uint8 codes → fp32 values."""
        return self.decode_table().to(codes.device)[codes.long()]


@functools.cache
def _decode_table(et: Minifloat) -> torch.Tensor:
    half = 1 << (et.bits - 1)
    mags = [et.magnitude(c) for c in range(half)]
    return torch.tensor(mags + [-m for m in mags], dtype=torch.float32)


ELEMENT_TYPES: Registry[Minifloat] = Registry("element type")
for _row in (
    # name, ebits, mbits, bias, has_inf, NaN magnitude codes (OCP 8-bit FP spec; OCP MX v1.0)
    Minifloat("e4m3", 4, 3, 7, False, (0x7F,)),  # E4M3FN: max 448, no Inf
    Minifloat("e5m2", 5, 2, 15, True, (0x7D, 0x7E, 0x7F)),  # IEEE-like: max 57344, Inf 0x7C
    Minifloat("e2m3", 2, 3, 1, False, ()),  # FP6: max 7.5
    Minifloat("e3m2", 3, 2, 3, False, ()),  # FP6: max 28
    Minifloat("e2m1", 2, 1, 1, False, ()),  # FP4: 0, .5, 1, 1.5, 2, 3, 4, 6
):
    ELEMENT_TYPES.register(_row.name, _row)


# ---- E8M0: the MX block scale --------------------------------------------------------------
E8M0_BIAS = 127
E8M0_NAN = 0xFF
