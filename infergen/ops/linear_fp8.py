"""W8A8 FP8 projections through torch._scaled_mm: y = (x̂ · Ŵᵀ) + b with both operands in
E4M3FN and fp32 accumulation on the FP8 tensor cores (CUDA compute capability >= 8.9; torch's
CPU backend runs the same op).

x [tokens, in] (fp32 / bf16 / fp16) is quantized per token, dynamically, by the "token" rule
of ops/quantize_activation.py (scale amax / 448, `fp8_token_codes`): x̂ = codes_x · s_x. The
weight is E4M3FN codes [out, in] (row-major: the second operand is passed as its transpose,
column-major, as cuBLASLt wants) with an fp32 scale per tensor [1] or per output channel
[out]: Ŵ = codes_w · s_w. torch._scaled_mm needs `in` and `out` multiples of 16 (`fits`).

Two ways through the op, by the output dtype:
  bf16  row-wise scales in the GEMM's epilogue (s_x [tokens, 1], s_w [1, out]) and the bias
        added there (CUTLASS / cuBLASLt row-wise kernels: bf16 output only on most GPUs);
  else  unit tensor-wise scales with an fp32 output (Σ codes_x · codes_w: every product of two
        E4M3 values is exact in fp32), then y = acc · s_x · s_w + b in fp32 and cast.
Bytes moved: 1 byte a weight and an activation (+ the scales); FLOPs 2·tokens·in·out.

`reference` is the float64 product of the dequantized operands (the oracle); `supported`
says whether a device runs the op (probed once per device).
"""

from __future__ import annotations

import functools

import torch

from infergen.ops.quantize_activation import fp8_token_codes

MIN_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (8.9), Hopper (9.0) and later
ALIGN = 16  # torch._scaled_mm: `in` and `out` multiples of 16


def fits(in_features: int, out_features: int) -> bool:
    """Whether torch._scaled_mm takes a weight [out, in] of this shape."""
    return in_features % ALIGN == 0 and out_features % ALIGN == 0


@functools.cache
def supported(device: torch.device) -> bool:
    """Whether torch._scaled_mm runs on `device`: CUDA of compute capability >= 8.9, or a CPU
    build of torch that has the op (probed with one small product)."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < MIN_CAPABILITY:
        return False
    try:
        a = torch.ones(1, ALIGN, device=device).to(torch.float8_e4m3fn)
        b = torch.ones(ALIGN, ALIGN, device=device).to(torch.float8_e4m3fn)
        one = torch.ones((), device=device)
        y = torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    except (RuntimeError, NotImplementedError, AttributeError):
        return False
    return bool((y == ALIGN).all())


def reference(
    x_codes: torch.Tensor,
    x_scales: torch.Tensor,
    w_codes: torch.Tensor,
    w_scales: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """The oracle: (codes_x · s_x) · (codes_w · s_w)ᵀ + b in float64 [tokens, out]."""
    x = x_codes.double() * x_scales.double()  # [tokens, in]
    w = w_codes.double() * w_scales.double().reshape(-1, 1)  # [out, in]
    y = x @ w.t()
    return y + bias.double() if bias is not None else y


def scaled_mm(
    x_codes: torch.Tensor,
    x_scales: torch.Tensor,
    w_codes: torch.Tensor,
    w_scales: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """codes_x E4M3FN [tokens, in] with s_x fp32 [tokens, 1]; codes_w E4M3FN [out, in]
    row-major with s_w fp32 [1] or [out]; bias [out] or None → y [tokens, out] in out_dtype."""
    tokens, in_features = x_codes.shape
    out_features = w_codes.shape[0]
    assert w_codes.shape == (out_features, in_features) and w_codes.is_contiguous()
    assert x_codes.dtype == w_codes.dtype == torch.float8_e4m3fn, (x_codes.dtype, w_codes.dtype)
    assert x_scales.shape == (tokens, 1) and x_scales.dtype == torch.float32
    assert fits(in_features, out_features), (in_features, out_features)
    w_row = w_scales.float().reshape(1, -1).expand(1, out_features).contiguous()  # [1, out]
    if out_dtype == torch.bfloat16:
        return torch._scaled_mm(
            x_codes.contiguous(),
            w_codes.t(),
            scale_a=x_scales.contiguous(),
            scale_b=w_row,
            bias=bias.to(torch.bfloat16) if bias is not None else None,
            out_dtype=torch.bfloat16,
        )
    one = torch.ones((), device=x_codes.device)
    acc = torch._scaled_mm(  # Σ codes_x · codes_w, fp32 [tokens, out]
        x_codes.contiguous(), w_codes.t(), scale_a=one, scale_b=one, out_dtype=torch.float32
    )
    y = acc.mul_(x_scales).mul_(w_row)
    if bias is not None:
        y = y.add_(bias.float())
    return y.to(out_dtype)


def linear_fp8(
    x: torch.Tensor, w_codes: torch.Tensor, w_scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """y = x̂ · Ŵᵀ + b: x [..., in] quantized per token (`fp8_token_codes`), y [..., out] in
    x's dtype. The device must be `supported` and the shape `fits`."""
    lead = x.shape[:-1]
    if x.numel() == 0:
        return x.new_empty(*lead, w_codes.shape[0])
    x_codes, x_scales = fp8_token_codes(x.reshape(-1, x.shape[-1]))
    y = scaled_mm(x_codes, x_scales, w_codes, w_scales, bias, x.dtype)
    return y.reshape(*lead, w_codes.shape[0])
