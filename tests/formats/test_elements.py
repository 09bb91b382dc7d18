"""Element types against ml_dtypes and torch's float8 dtypes, bit for bit."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from infergen.formats import ELEMENT_TYPES

ML_DTYPES = {
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e2m1": ml_dtypes.float4_e2m1fn,
}
TORCH_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
NAMES = list(ML_DTYPES)


def _ml_decode(name: str, codes: np.ndarray) -> np.ndarray:
    return codes.astype(np.uint8).view(ML_DTYPES[name]).astype(np.float32)


def _ml_encode(name: str, values: np.ndarray) -> np.ndarray:
    """ml_dtypes' cast after the explicit saturating clamp (ml_dtypes itself does not saturate)."""
    et = ELEMENT_TYPES.get(name)
    clipped = np.clip(values.astype(np.float32), -et.max, et.max)  # NaN stays NaN
    return clipped.astype(ML_DTYPES[name]).view(np.uint8)


def adversarial(name: str) -> torch.Tensor:
    """Every representable value, every midpoint (a tie) and its fp32 neighbours, ±max and
    beyond, subnormals of fp32, ±0, ±Inf, NaN."""
    et = ELEMENT_TYPES.get(name)
    pos = et.positive_values().double()
    mids = (pos[1:] + pos[:-1]) / 2
    beyond = torch.tensor([et.max * 1.0625, et.max * 2, 3.0e38, et.max + (pos[-1] - pos[-2]) / 2])
    core = torch.cat([pos, mids, beyond]).float()
    near = torch.cat(
        [
            torch.nextafter(core, torch.tensor(math.inf)),
            core,
            torch.nextafter(core, torch.tensor(0.0)),
        ]
    )
    specials = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1e-40, -1e-45, 1e-30])
    both = torch.cat([near, -near])
    return torch.cat([both, specials, torch.randn(4096) * et.max / 3]).float()


@pytest.mark.parametrize("name", NAMES)
def test_every_code_decodes_like_ml_dtypes(name):
    et = ELEMENT_TYPES.get(name)
    codes = np.arange(1 << et.bits)
    want = torch.from_numpy(_ml_decode(name, codes))
    got = et.decode(torch.from_numpy(codes.astype(np.uint8)))
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(torch.signbit(got[~got.isnan()]), torch.signbit(want[~want.isnan()]))


@pytest.mark.parametrize("name", NAMES)
def test_encode_decode_round_trips_every_code(name):
    et = ELEMENT_TYPES.get(name)
    codes = torch.arange(1 << et.bits, dtype=torch.uint8)
    values = et.decode(codes)
    finite = ~values.isnan() & ~values.isinf()
    assert torch.equal(et.encode(values)[finite], codes[finite])


@pytest.mark.parametrize("name", NAMES)
def test_encode_matches_ml_dtypes_bit_exact(name):
    et = ELEMENT_TYPES.get(name)
    x = adversarial(name)
    got = et.encode(x).numpy()
    want = _ml_encode(name, x.numpy())
    nan = np.isnan(x.numpy())
    if et.nan_code is None:  # FP6/FP4 have no NaN: we write +0 (the MX scale carries NaN)
        assert (got[nan] == 0).all()
    else:
        assert np.isnan(_ml_decode(name, got[nan])).all()
    np.testing.assert_array_equal(got[~nan], want[~nan])


@pytest.mark.parametrize("name", list(TORCH_FP8))
def test_encode_matches_torch_float8(name):
    et = ELEMENT_TYPES.get(name)
    x = adversarial(name)
    want = x.clamp(-et.max, et.max).to(TORCH_FP8[name]).view(torch.uint8)
    got = et.encode(x)
    nan = x.isnan()
    assert torch.equal(got[~nan], want[~nan])
    assert et.decode(got[nan]).isnan().all()


def test_documented_fp4_rounding():
    """REFERENCES §3: 0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4; saturate to ±6."""
    e2m1 = ELEMENT_TYPES.get("e2m1")
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -100.0])
    want = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -6.0])
    assert torch.equal(e2m1.decode(e2m1.encode(x)), want)


@pytest.mark.parametrize(
    "name,max_value,subnormal",
    [
        ("e4m3", 448, 2**-9),
        ("e5m2", 57344, 2**-16),
        ("e2m3", 7.5, 0.125),
        ("e3m2", 28, 0.0625),
        ("e2m1", 6, 0.5),
    ],
)
def test_limits(name, max_value, subnormal):
    et = ELEMENT_TYPES.get(name)
    assert et.max == max_value and et.smallest_subnormal == subnormal
    assert et.max == float(ml_dtypes.finfo(ML_DTYPES[name]).max)
