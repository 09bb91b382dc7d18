"""W4A8 with integer compute on the CPU: 4-bit group-quantized weights (GGUF Q4_0 / Q4_1,
formats int4 / int4_asym) times int8 activations quantized per token — the ("int8", "token")
entry of those backends' `quantized_inputs`, as llama.cpp multiplies Q4 weights by Q8
activations.

Each weight is S·u + O per group of 32 inputs (u the 4-bit code, S and O the group's
constants: d and −8d for Q4_0, d and m for Q4_1, …), so a token's product is
sa · Σ_groups (S · Σ u·a + O · Σ a) with a its int8 codes and sa its scale: the code products
are summed exactly in int32 (kernels/gemm_w4a8_i8.c: AVX-512 VNNI's u8 × s8 dot products
where the CPU has them, AVX2's byte multiplies, else a scalar loop), the rest in fp32. Against
the emulation (x̂ · ŵ accumulated in fp32) results differ by fp32 rounding only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from infergen.kernels.build import I, L, P, kernel
from infergen.ops.linear import run_packed
from infergen.ops.quantize_activation import int8_token_codes

SOURCE = "gemm_w4a8_i8"
# the group formats whose weights are S·u + O with 4-bit u (a kernel gemm_w4a8_<name> each) →
# kernels/decode_layers_f32.c's weight_format of the product
DECODE_FORMATS = {"q4_0": 12, "q4_1": 13, "int4": 14, "int4_asym": 15}
FORMATS = frozenset(DECODE_FORMATS)


def apply(
    x: torch.Tensor,
    prepared: torch.Tensor,
    bias: torch.Tensor | None,
    out_features: int,
    *,
    name: str,
    weight: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """y = x · Wᵀ (+ b) with x quantized to int8 per token; `name` the group format,
    `weight` the panels' dequantized fp32 weight [rows, in] for the path without a C
    compiler."""
    if x.dtype != torch.float32:
        raise TypeError(f"{name} W4A8 expects float32 activations, got {x.dtype}")
    fn = kernel(f"gemm_w4a8_{name}", P, P, P, P, L, L, L, I, source=SOURCE)
    if fn is not None:
        return run_packed(fn, x, prepared, bias, out_features)
    codes, scales = int8_token_codes(x)  # no C compiler: the same values (sums in float64)
    sums = codes.double() @ weight(prepared)[:out_features].double().T
    y = sums.float() * scales
    return y + bias if bias is not None else y
