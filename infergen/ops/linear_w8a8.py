"""W8A8 int8 with integer compute on the CPU: the "int8" backend's product on int8 activations
quantized per token (the ("int8", "token") entry of its `quantized_inputs`).

Where the "int8" weight-only backend multiplies fp32 activations by dequantized codes, this
one quantizes each token to int8 codes (ops/quantize_activation.py's "token" rule: the same
codes and scales the emulated scheme uses), sums code products exactly in int32
(kernels/gemm_w8a8_i8.c: AVX-512 VNNI's u8 x s8 dot products where the CPU has them, else a
scalar loop), and scales each sum once by the token's and the channel's scales. Against the
emulation (x̂ · ŵ accumulated in fp32) the results differ by fp32 rounding only.

The kernel quantizes the fp32 activations itself (one pass, the same fp32 operations as
`int8_token_codes`), so a product takes the fp32 input like every other backend.
"""

from __future__ import annotations

import torch

from infergen.kernels.build import I, L, P, kernel  # noqa: E741
from infergen.ops.linear import run_packed
from infergen.ops.quantize_activation import int8_token_codes

SOURCE = "gemm_w8a8_i8"
DECODE_FORMAT = 11  # kernels/decode_layers_f32.c's weight_format of this product


def apply(x: torch.Tensor, prepared: torch.Tensor, bias, out_features: int, unpack) -> torch.Tensor:
    """y = x · Wᵀ (+ b) with x quantized to int8 per token and integer sums; `unpack` gives the
    panels' (codes, scales) for the path without a C compiler."""
    if x.dtype != torch.float32:
        raise TypeError(f"int8 W8A8 expects float32 activations, got {x.dtype}")
    fn = kernel(SOURCE, P, P, P, P, L, L, L, I)
    if fn is not None:
        return run_packed(fn, x, prepared, bias, out_features)
    codes, scales = int8_token_codes(x)  # no C compiler: the same sums (exact in float64)
    w_codes, w_scales = unpack(prepared)
    sums = codes.double() @ w_codes[:out_features].view(torch.int8).double().T
    y = (sums.float() * scales) * w_scales[:out_features]
    return y + bias if bias is not None else y
