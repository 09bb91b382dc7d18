"""bf16 projections: y = bf16(x) · Wbᵀ + b with the weight held in bf16 (rounded to nearest
even from the fp32 checkpoint weight, or a bf16 checkpoint's as stored) and each token's
activations rounded to bf16 inside the product; products exact, sums in fp32 — the numerics of
a bf16 GEMM with fp32 accumulation, on half the weight bytes of fp32 (LINEAR_BACKENDS row
"bf16"; the engine around the projections stays fp32).

`prepare` lays the weight out for kernels/gemm_bf16.c: 24-column panels of input pairs, uint32
[panels, ceil(in / 2), 24], lane j of row i holding column 24p + j's bf16 weights at inputs 2i
(low half) and 2i + 1 (high half): AVX-512 BF16's vdpbf16ps operand (where the CPU has it;
elsewhere the kernel widens each pair and adds the same two products in the same order).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infergen.kernels.build import I, L, P, kernel
from infergen.ops.linear import LINEAR_BACKENDS, PANEL, LinearBackend, run_packed

SOURCE = "gemm_bf16"


def pack(weight: torch.Tensor) -> torch.Tensor:
    """W [out, in] (fp32 or bf16) → uint32 panels [ceil(out / 24), ceil(in / 2), 24]."""
    out_features, in_features = weight.shape
    panels, pairs = -(-out_features // PANEL), -(-in_features // 2)
    w = torch.zeros(panels * PANEL, 2 * pairs, dtype=torch.bfloat16)
    w[:out_features, :in_features] = weight.to(torch.bfloat16)  # (round to nearest even)
    lanes = w.view(panels, PANEL, pairs, 2).permute(0, 2, 1, 3).contiguous()
    return lanes.view(torch.int32).view(panels, pairs, PANEL)


def unpack(prepared: torch.Tensor) -> torch.Tensor:
    """The bf16 weight [panels · 24, 2 · pairs] (`pack`'s, padding included)."""
    panels, pairs, _ = prepared.shape
    w = prepared.contiguous().view(torch.bfloat16).view(panels, pairs, PANEL, 2)
    return w.permute(0, 2, 1, 3).reshape(panels * PANEL, 2 * pairs)


def dequantized(weight: torch.Tensor) -> torch.Tensor:
    """The fp32 values a weight (or an input) takes in the product: rounded to bf16, nearest
    even."""
    return weight.to(torch.bfloat16).float()


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The product's values, in plain torch: bf16 operands, fp32 sums (the order may differ)."""
    return F.linear(dequantized(x), dequantized(weight), bias)


def _prepare(weight: torch.Tensor) -> torch.Tensor:
    if weight.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"bf16 weights are rounded from float32 or bfloat16, got {weight.dtype}")
    return pack(weight)


def _apply(x, prepared, bias, out_features):
    if x.dtype != torch.float32:
        raise TypeError(f"bf16 linear expects float32 activations, got {x.dtype}")
    fn = kernel(SOURCE, P, P, P, P, L, L, L, I)
    if fn is None:  # no C compiler: the same operands through torch
        weight = unpack(prepared)[:out_features, : x.shape[1]]
        return reference(x, weight, bias)
    return run_packed(fn, x, prepared, bias, out_features)


def _rows(prepared: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` in fp32 (a tied LM head's embedding lookup), all `2 · pairs` inputs (an odd
    input count's zero pad too: Linear.rows cuts it)."""
    panels, pairs, _ = prepared.shape
    lanes = prepared[ids // PANEL, :, ids % PANEL]  # [len(ids), pairs]
    return lanes.contiguous().view(torch.bfloat16).float()


# decode_format 10: kernels/decode_layers_f32.c runs the panels in the fused decode step
LINEAR_BACKENDS.register("bf16", LinearBackend(_prepare, _apply, _rows, decode_format=10))
