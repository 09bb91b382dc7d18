"""Weight-only int8 projection (W8A32): y = x · (q · scale)ᵀ + b, q int8 and one fp32 scale
per output channel (formats "int8", per channel, symmetric: scale = amax / 127).

The LINEAR_BACKENDS row "int8". `prepare` quantizes the fp32 weight with infergen.formats and
lays it out for kernels/gemm_packed_i8.c: the 24-column panels of the fp32 "native" backend
in int8, each followed by its 24 scales as bytes, in one int8 tensor [panels, in + 4, 24].
A decode step then streams one byte per weight instead of four. Every weight is used as the
fp32 value `formats.dequantize` gives it, and accumulated as the fp32 kernel accumulates, so
the product equals the "native" backend on the dequantized weight bit for bit.
"""

from __future__ import annotations

import torch

from infergen.formats import dequantize, quantize
from infergen.kernels.build import I, L, P, kernel
from infergen.ops.linear import LINEAR_BACKENDS, PANEL, LinearBackend, run_packed
from infergen.ops.linear import reference as fp32_reference

SCALE_ROWS = 4  # a panel's 24 fp32 scales: 96 bytes = 4 rows of 24 int8


def _kernel():
    return kernel("gemm_packed_i8_f32", P, P, P, P, L, L, L, I)


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [out, in] fp32 → (codes int8 [out, in], scales fp32 [out]), formats' int8 rule."""
    q = quantize(weight.float(), "int8", axis=-1)
    return q.codes.view(torch.int8), q.scales.reshape(-1)


def dequantized(weight: torch.Tensor) -> torch.Tensor:
    """The fp32 weight the int8 backend computes with (the oracle of its tests)."""
    return dequantize(quantize(weight.float(), "int8", axis=-1))


def pack(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(int8 [out, in], fp32 [out]) → int8 panels [ceil(out/24), in + 4, 24]."""
    out_features, in_features = codes.shape
    panels = -(-out_features // PANEL)
    padded = torch.zeros(panels * PANEL, in_features, dtype=torch.int8)
    padded[:out_features] = codes
    s = torch.zeros(panels * PANEL, dtype=torch.float32)
    s[:out_features] = scales
    body = padded.view(panels, PANEL, in_features).transpose(1, 2)
    tail = s.view(panels, PANEL).contiguous().view(torch.int8).view(panels, SCALE_ROWS, PANEL)
    return torch.cat([body, tail], dim=1).contiguous()


def unpack(prepared: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of `pack` up to the padding: codes [panels·24, in], scales [panels·24]."""
    panels, rows, _ = prepared.shape
    in_features = rows - SCALE_ROWS
    codes = prepared[:, :in_features].transpose(1, 2).reshape(panels * PANEL, in_features)
    scales = prepared[:, in_features:].contiguous().view(torch.float32).reshape(-1)
    return codes, scales


def _prepare(weight: torch.Tensor) -> torch.Tensor:
    if weight.dtype != torch.float32:
        raise TypeError(f"int8 weights are quantized from float32 weights, got {weight.dtype}")
    return pack(*quantize_weight(weight))


def _apply(
    x: torch.Tensor, prepared: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    if x.dtype != torch.float32:
        raise TypeError(f"int8 linear expects float32 activations, got {x.dtype}")
    fn = _kernel()
    if fn is None:  # no C compiler: the same values through torch
        return fp32_reference(x, _rows_all(prepared)[:out_features], bias)
    return run_packed(fn, x, prepared, bias, out_features)


def _rows_all(prepared: torch.Tensor) -> torch.Tensor:
    codes, scales = unpack(prepared)
    return codes.float() * scales[:, None]


def _rows(prepared: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Dequantized rows (a tied LM head's embedding lookup reads the quantized weight)."""
    panels, rows, _ = prepared.shape
    in_features = rows - SCALE_ROWS
    p, j = ids // PANEL, ids % PANEL
    codes = prepared[p, :in_features, j]  # [len(ids), in]
    scales = prepared[:, in_features:].contiguous().view(torch.float32).reshape(panels, PANEL)
    return codes.float() * scales[p, j][:, None]


LINEAR_BACKENDS.register("int8", LinearBackend(_prepare, _apply, _rows))
