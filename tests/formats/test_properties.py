"""Property tests: the dequantized value is within half a quantum (of the element's binade,
times the block scale) of the input, for every value that did not saturate."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from infergen.formats import ELEMENT_TYPES, FORMATS, dequantize, quantize

FLOAT_FORMATS = [
    "mxfp8_e4m3",
    "mxfp8_e5m2",
    "mxfp6_e2m3",
    "mxfp6_e3m2",
    "mxfp4",
    "nvfp4",
    "fp8_e4m3",
    "fp8_e5m2",
]


def _half_quantum(a: np.ndarray, element: str) -> np.ndarray:
    et = ELEMENT_TYPES.get(element)
    binade = np.floor(np.log2(np.maximum(a, 1e-300)))
    return 0.5 * np.exp2(np.maximum(binade, et.emin) - et.mbits)


def _block_divisor(q, fmt: str) -> np.ndarray:
    """Per element: the value one element unit stands for (the block's scale)."""
    spec = FORMATS.get(fmt)
    if spec.scaling == "e8m0":
        d = np.exp2(q.scales.numpy().astype(np.float64) - 127)
        return np.repeat(d, 32, axis=-1)
    if spec.scaling == "nvfp4":
        s = ELEMENT_TYPES.get("e4m3").decode(q.scales).double().numpy()
        return np.repeat(s * q.global_scale.double().item(), 16, axis=-1)
    return np.full(q.shape, q.scales.double().item())


arrays = st.integers(0, 2**31 - 1).flatmap(
    lambda seed: st.tuples(
        st.just(seed), st.integers(-30, 30), st.sampled_from(["normal", "heavy"])
    )
)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(FLOAT_FORMATS), arrays)
def test_float_formats_error_within_half_quantum(fmt, args):
    seed, log_scale, kind = args
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 64, generator=gen)
    if kind == "heavy":
        x = x**5
    x = x * 2.0**log_scale
    q = quantize(x, fmt)
    y = dequantize(q).double().numpy()
    xs = x.double().numpy()
    divisor = _block_divisor(q, fmt).reshape(xs.shape)
    et = FORMATS.get(fmt).element_type
    scaled = np.abs(xs) / np.where(divisor == 0, 1, divisor)
    ok = (divisor > 0) & (scaled <= et.max)  # not saturated, not a zero-scale block
    bound = _half_quantum(scaled, et.name) * divisor * (1 + 1e-6) + 1e-300
    assert (np.abs(xs - y)[ok] <= bound[ok]).all()
    assert (np.abs(y[~ok]) <= np.abs(xs[~ok]) + 1e-300).all()  # saturated: never overshoots


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["int8", "int4", "int4_asym", "int2"]),
    st.integers(0, 2**31 - 1),
    st.integers(-20, 20),
)
def test_int_formats_error_within_half_a_step(fmt, seed, log_scale):
    x = torch.randn(4, 128, generator=torch.Generator().manual_seed(seed)) * 2.0**log_scale
    q = quantize(x, fmt)
    err = (dequantize(q) - x).abs().double()
    spec = FORMATS.get(fmt)
    group = x.shape[-1] if spec.block_size < 0 else spec.block_size
    step = q.scales.double().reshape(4, -1).repeat_interleave(group, dim=-1)
    assert bool((err <= step / 2 * (1 + 1e-5) + 1e-30).all()), fmt
    assert math.isfinite(float(err.max()))
