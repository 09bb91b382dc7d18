"""W8A8 FP8 through torch._scaled_mm (ops/linear_fp8.py).

Oracles: the per-token FP8 codes are ops/quantize_activation.fake_quantize's x̂ bit for bit;
the product equals the float64 product of the dequantized operands within fp32 rounding (bf16
output: within bf16 rounding), per-tensor and per-channel weight scales, with and without
bias, on shapes with one and odd token counts. Runs on the CPU where this torch has the op
(torch 2.13's CPU build has it) and on a GPU of compute capability >= 8.9
(benchmarks/device_check.sh); each device skips where `supported` says no.
"""

from __future__ import annotations

import pytest
import torch

from infergen.ops import linear_fp8 as lf
from infergen.ops.quantize_activation import ActivationFormat, fake_quantize, fp8_token_codes

TOKEN_FP8 = ActivationFormat("fp8_e4m3", "token", 8.0)
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(
        not lf.supported(torch.device("cpu")), reason="this torch has no CPU _scaled_mm")),
    pytest.param("cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available() or not lf.supported(torch.device("cuda")),
        reason="needs a GPU of compute capability >= 8.9")),
]  # fmt: skip
SHAPES = [(1, 16, 16), (5, 48, 32), (17, 32, 80)]  # (tokens, in, out)
# relative rounding of one addition of the fp32 sums: IEEE fp32 on the CPU; FP8 tensor cores
# keep fewer accumulator bits within a chunk of K (~14, DeepSeek-V3 report §3.3.2)
ADD_ROUNDING = {"cpu": 2**-23, "cuda": 2**-13}


def _inputs(tokens: int, k: int, n: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, k, generator=gen) * 2
    x[0, :3] = torch.tensor([30.0, -1e-3, 0.0])  # a large value that sets the row's scale
    if tokens > 2:
        x[2] = 0.0  # an all-zero token (scale 1)
    w = torch.randn(n, k, generator=gen) * 0.1
    return x, w, torch.randn(n, generator=gen)


def _weight_codes(w: torch.Tensor, per_channel: bool):
    amax = w.abs().amax(dim=1) if per_channel else w.abs().amax().reshape(1)
    scales = amax / 448.0
    codes = (w / scales.reshape(-1, 1)).to(torch.float8_e4m3fn)
    return codes, scales


def test_token_codes_are_fake_quantize_bit_for_bit():
    for tokens, k, _ in SHAPES:
        x, _, _ = _inputs(tokens, k, 16)
        codes, scales = fp8_token_codes(x)
        assert codes.dtype == torch.float8_e4m3fn and scales.shape == (tokens, 1)
        assert torch.equal(codes.float() * scales, fake_quantize(x, TOKEN_FP8))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tokens,k,n", SHAPES)
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_scaled_mm_equals_the_dequantized_product(device, tokens, k, n, per_channel, with_bias):
    x, w, bias = _inputs(tokens, k, n)
    x_codes, x_scales = fp8_token_codes(x)
    w_codes, w_scales = _weight_codes(w, per_channel)
    bias = bias if with_bias else None
    want = lf.reference(x_codes, x_scales, w_codes, w_scales, bias)
    # rounding of the sums: |Σ| ≤ |x̂|·|Ŵ|ᵀ, K roundings each
    magnitude = lf.reference(x_codes.abs(), x_scales, w_codes.abs(), w_scales, None)
    bound = magnitude * k * ADD_ROUNDING[device]
    on = {"device": device}
    args = (x_codes.to(**on), x_scales.to(**on), w_codes.to(**on), w_scales.to(**on))
    got = lf.scaled_mm(*args, bias.to(**on) if bias is not None else None, torch.float32)
    assert got.dtype == torch.float32 and got.shape == (tokens, n)
    assert ((got.cpu().double() - want).abs() <= bound + 1e-6).all()
    got16 = lf.scaled_mm(*args, bias.to(**on) if bias is not None else None, torch.bfloat16)
    assert got16.dtype == torch.bfloat16
    # bf16: the sum rounded to 8 significant bits (and again with the bias added)
    bound16 = (want.abs() + magnitude) * 2**-7 + 1e-3
    assert ((got16.cpu().double() - want).abs() <= bound16).all()


@pytest.mark.parametrize("device", DEVICES)
def test_linear_fp8_quantizes_tokens_and_keeps_leading_dims(device):
    x, w, bias = _inputs(6, 32, 48, seed=1)
    w_codes, w_scales = _weight_codes(w, per_channel=False)
    want = fake_quantize(x, TOKEN_FP8).double() @ (w_codes.double() * w_scales.double()).t()
    want = want + bias.double()
    on = {"device": device}
    got = lf.linear_fp8(x.to(**on).reshape(2, 3, 32), w_codes.to(**on), w_scales.to(**on),
                        bias.to(**on))  # fmt: skip
    assert got.shape == (2, 3, 48)
    tol = 1e-5 if device == "cpu" else 2e-3  # FP8 tensor cores: fewer accumulator bits
    torch.testing.assert_close(got.cpu().reshape(6, 48).double(), want, rtol=tol, atol=tol)
    empty = lf.linear_fp8(x[:0].to(**on), w_codes.to(**on), w_scales.to(**on), None)
    assert empty.shape == (0, 48)


def test_fits_and_support_rules(monkeypatch):
    assert lf.fits(64, 128) and not lf.fits(64, 211) and not lf.fits(40, 64)
    assert lf.supported(torch.device("cpu")) in (True, False)  # probed, never raises
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    assert not lf.supported.__wrapped__(torch.device("cuda"))  # an Ampere GPU: no FP8 GEMM
