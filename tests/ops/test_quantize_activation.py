"""Activation quantization (ops/quantize_activation.py, quant/activations.py).

Oracles: the fast path equals the reference (formats' element codecs) bit for bit for every
activation scheme, static scales saturating included; the reference's FP8 and int8 per-token
paths equal ml_dtypes' float8_e4m3fn cast and numpy's rounding; every scheme is row-local (a
batch quantizes as its rows one at a time)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from infergen.ops.quantize_activation import ActivationFormat, fake_quantize, reference
from infergen.quant.activations import ACTIVATION_SCHEMES

SCHEMES = ACTIVATION_SCHEMES.names()


def _x(tokens: int, features: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, features, generator=gen)
    x[0, :3] = torch.tensor([40.0, -1e-5, 0.0])  # an outlier, a tiny value and a zero
    if tokens > 2:
        x[2] = 0.0  # an all-zero token
    return x


def _scale(act: ActivationFormat, x: torch.Tensor, ratio: float) -> torch.Tensor | None:
    """A static scale clipping at ratio · amax (ratio < 1: the outliers saturate)."""
    return torch.tensor([ratio * float(x.abs().max()) / act.max_code]) if act.static else None


@pytest.mark.parametrize("shape", [(1, 32), (5, 96), (130, 576), (3, 64)])
@pytest.mark.parametrize("ratio", [1.0, 0.1])
@pytest.mark.parametrize("name", SCHEMES)
def test_fast_path_equals_reference(name, shape, ratio):
    act = ACTIVATION_SCHEMES.get(name).act
    x = _x(*shape)
    scale = _scale(act, x, ratio)
    got = fake_quantize(x.clone(), act, scale)
    assert torch.equal(got, reference(x, act, scale)), name
    assert got.shape == x.shape and torch.isfinite(got).all()
    if scale is not None and ratio < 1 and act.granularity == "tensor":
        assert got.abs().max() <= ratio * x.abs().max() * (1 + 1e-6)  # saturated, not wrapped


@pytest.mark.parametrize("name", SCHEMES)
def test_row_local(name):
    act = ACTIVATION_SCHEMES.get(name).act
    x = _x(9, 64, seed=1)
    scale = _scale(act, x, 0.5)
    whole = fake_quantize(x, act, scale)
    for i in range(x.shape[0]):
        assert torch.equal(whole[i : i + 1], fake_quantize(x[i : i + 1], act, scale)), (name, i)


def test_per_token_fp8_and_int8_against_ml_dtypes_and_numpy():
    x = _x(7, 80, seed=2)
    xn = x.numpy()
    for fmt, max_code in (("fp8_e4m3", 448.0), ("int8", 127.0)):
        scale = np.abs(xn).max(axis=1, keepdims=True) / np.float32(max_code)
        scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
        y = xn / scale
        if fmt == "int8":
            codes = np.clip(np.rint(y), -127, 127)
        else:
            codes = y.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
        expected = torch.from_numpy((codes * scale).astype(np.float32))
        act = ActivationFormat(fmt, "token", 8.0)
        assert torch.equal(reference(x, act), expected), fmt


def test_static_fp8_saturates_like_a_clamped_ml_dtypes_cast():
    x = _x(4, 64, seed=3)
    act = ACTIVATION_SCHEMES.get("fp8_e4m3_static").act
    scale = torch.tensor([0.01])
    y = np.clip(x.numpy() / np.float32(0.01), -448, 448).astype(ml_dtypes.float8_e4m3fn)
    expected = torch.from_numpy(y.astype(np.float32) * np.float32(0.01))
    assert torch.equal(fake_quantize(x, act, scale), expected)


def test_errors():
    act = ACTIVATION_SCHEMES.get("int8_static").act
    with pytest.raises(ValueError, match="calibrated scale"):
        fake_quantize(torch.randn(2, 8), act, None)
    with pytest.raises(TypeError, match="fp32"):
        fake_quantize(torch.randn(2, 8, dtype=torch.bfloat16), ACTIVATION_SCHEMES.get("int8").act)
