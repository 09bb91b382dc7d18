"""Activation quantization before a projection: x [tokens, in] fp32 → x̂ [tokens, in] fp32, the
values x's codes stand for. The projection then runs on x̂: the numerics of a W·A kernel that
multiplies codes and applies both scales in its epilogue with fp32 accumulation.

Granularities (an ActivationFormat's `granularity`):
  "token"  a scale per token (row): amax / the format's largest code, computed every step;
  "tensor" one static fp32 scale from calibration; values beyond it saturate;
  "block"  the format's own blocks along the row: MXFP4 / MXFP8 (32 values, E8M0 scale) dynamic;
           NVFP4 (16 values, E4M3 scale) under a static fp32 global scale from calibration.
Every granularity is row-local: a request's activations never depend on the other requests in
its batch.

Bytes moved: x read and x̂ written once (8 bytes a value). These CPUs have no FP8 / FP4 matrix
units, so the product stays fp32 on x̂: a scheme here shows its accuracy, and its speed cost is
this pass (benchmarks/bench_quant.py). W8A8 int8 per token is the exception: the "int8"
backend takes x itself and sums integer codes (ops/linear_w8a8.py, `int8_token_codes`).
`reference` computes x̂ through infergen.formats' element codecs; `fake_quantize` through
torch's float8 cast and the formats' C fast paths, bit-identical
(tests/ops/test_quantize_activation.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infergen.formats import ELEMENT_TYPES, dequantize, quantize
from infergen.formats.spec import FORMATS, FormatSpec


@dataclass(frozen=True)
class ActivationFormat:
    fmt: str  # an infergen.formats row ("fp8_e4m3", "int8", "mxfp4", "nvfp4", ...)
    granularity: str  # "token" | "tensor" | "block"
    bits: float  # bits per activation value, scales included (for reports)

    @property
    def key(self) -> tuple[str, str]:
        """(format, granularity): what a W·A product taking these inputs is registered under
        (ops/linear.LinearBackend.quantized_inputs)."""
        return (self.fmt, self.granularity)

    @property
    def spec(self) -> FormatSpec:
        return FORMATS.get(self.fmt, where="activation format")

    @property
    def static(self) -> bool:
        """Takes a scale from calibration (per-tensor scale, or NVFP4's global scale)."""
        return self.granularity == "tensor" or self.spec.global_scale

    @property
    def max_code(self) -> float:
        """The largest value a static scale maps the clipping range onto."""
        return self.spec.scaled_max


_TORCH_FP8 = {"fp8_e4m3": torch.float8_e4m3fn}
FP8_E4M3_MAX = 448.0  # the largest E4M3FN value (formats "fp8_e4m3": its scaled_max)


def _row_scales(x: torch.Tensor, max_code: float) -> torch.Tensor:
    """amax of each row / max_code, [tokens, 1]; an all-zero row gets 1."""
    scale = x.abs().amax(dim=-1, keepdim=True) / max_code
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def _check(x: torch.Tensor, act: ActivationFormat, scale: torch.Tensor | None) -> None:
    if x.dtype != torch.float32 or x.dim() != 2:
        raise TypeError(f"activation quantization expects fp32 [tokens, in], got {x.dtype} "
                        f"{tuple(x.shape)}")  # fmt: skip
    if act.static and scale is None:
        raise ValueError(f"{act.fmt} {act.granularity} activations need a calibrated scale")


def reference(
    x: torch.Tensor, act: ActivationFormat, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """x̂ through the formats' reference codecs (the oracle)."""
    _check(x, act, scale)
    if act.granularity == "block":
        extra = {"global_scale": scale} if act.spec.global_scale else {}
        q = quantize(x, act.fmt, axis=-1, native=False, **extra)
        return dequantize(q, native=False)
    s = _row_scales(x, act.max_code) if act.granularity == "token" else scale.reshape(1, 1)
    if act.spec.integer:
        return torch.round(x / s).clamp(-127, 127) * s
    et = ELEMENT_TYPES.get(act.fmt.removeprefix("fp8_"))
    return et.decode(et.encode(x / s)) * s  # encode saturates at the format's max


def fp8_token_codes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [tokens, in] (any float dtype) → (E4M3FN codes [tokens, in], fp32 scales [tokens, 1])
    by the "token" rule of `fake_quantize`: codes.float() · scales is its x̂ for fp32 x."""
    x = x.float()
    scales = _row_scales(x, FP8_E4M3_MAX)
    codes = (x / scales).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return codes, scales


def int8_token_codes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [tokens, in] fp32 → (int8 codes [tokens, in], fp32 scales [tokens, 1]) by the "token"
    rule of `fake_quantize` for "int8": codes.float() · scales is its x̂."""
    scales = _row_scales(x, 127.0)
    return (x / scales).round_().clamp_(-127, 127).to(torch.int8), scales


def fake_quantize(
    x: torch.Tensor, act: ActivationFormat, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """x̂, as `reference` computes it, by the fast paths."""
    _check(x, act, scale)
    if act.granularity == "block":
        extra = {"global_scale": scale} if act.spec.global_scale else {}
        return dequantize(quantize(x, act.fmt, axis=-1, **extra))
    s = _row_scales(x, act.max_code) if act.granularity == "token" else scale.reshape(1, 1)
    y = x / s
    if act.spec.integer:
        return y.round_().clamp_(-127, 127).mul_(s)
    m = act.max_code
    return y.clamp_(-m, m).to(_TORCH_FP8[act.fmt]).float().mul_(s)
