"""Weight-only quantized projections: y = x · (decode(q) · scale)ᵀ + b with one-byte codes q
and an fp32 scale per output channel, fp32 activations. One LINEAR_BACKENDS row per code
format (CODE_FORMATS):
  "int8"      formats "int8": symmetric, scale = amax / 127 per output channel;
  "fp8_e4m3"  formats "fp8_e4m3": E4M3FN codes, one per-tensor scale (amax / 448).

`prepare` quantizes the fp32 weight with infergen.formats and lays it out for
kernels/gemm_packed_q_f32.c: the 24-column panels of the fp32 "native" backend with a byte per
weight, each followed by its 24 scales as bytes, in one tensor [panels, in + 4, 24] whose dtype
names the code format (int8 / float8_e4m3fn). A decode step streams one byte per weight
instead of four. Every weight is used as the fp32 value `formats.dequantize` gives it and
accumulated as the fp32 kernel accumulates, so the product equals the "native" backend on the
dequantized weight bit for bit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from infergen.formats import dequantize, quantize
from infergen.formats.quant_weight import QuantWeight
from infergen.kernels.build import I, L, P, kernel
from infergen.ops import linear_w8a8
from infergen.ops.linear import LINEAR_BACKENDS, PANEL, LinearBackend, run_packed
from infergen.ops.linear import reference as fp32_reference

SCALE_ROWS = 4  # a panel's 24 fp32 scales: 96 bytes = 4 rows of 24 bytes
SOURCE = "gemm_packed_q_f32"


@dataclass(frozen=True)
class CodeFormat:
    fmt: str  # the infergen.formats format the codes are in
    dtype: torch.dtype  # what a code is (its torch view) and the prepared panels' dtype
    kernel: str  # the function in kernels/gemm_packed_q_f32.c
    decode_format: int  # kernels/decode_layers_f32.c weight_format
    rows_kernel: str  # its dequantized rows (an embedding lookup)


CODE_FORMATS = {
    "int8": CodeFormat("int8", torch.int8, "gemm_packed_i8_f32", 1, "rows_packed_i8"),
    "fp8_e4m3": CodeFormat(
        "fp8_e4m3", torch.float8_e4m3fn, "gemm_packed_e4m3_f32", 2, "rows_packed_e4m3"
    ),
}


def quantize_weight(weight: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """W [out, in] fp32 → (codes uint8 [out, in], scales fp32 [out]) by formats' rule."""
    q = quantize(weight.float(), fmt, axis=-1)
    return q.codes, q.scales.reshape(-1).expand(weight.shape[0]).contiguous()


def dequantized(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """The fp32 weight a backend computes with (the oracle of its tests)."""
    return dequantize(quantize(weight.float(), fmt, axis=-1))


def pack(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(uint8 codes [out, in], fp32 [out]) → panels [ceil(out/24), in + 4, 24] of `dtype`."""
    out_features, in_features = codes.shape
    panels = -(-out_features // PANEL)
    padded = torch.zeros(panels * PANEL, in_features, dtype=torch.uint8)
    padded[:out_features] = codes
    s = torch.zeros(panels * PANEL, dtype=torch.float32)
    s[:out_features] = scales
    body = padded.view(panels, PANEL, in_features).transpose(1, 2)
    tail = s.view(panels, PANEL).view(torch.uint8).view(panels, SCALE_ROWS, PANEL)
    return torch.cat([body, tail], dim=1).contiguous().view(dtype)


def unpack(prepared: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of `pack` up to the padding: uint8 codes [panels·24, in], scales."""
    raw = prepared.view(torch.uint8)
    panels, rows, _ = raw.shape
    in_features = rows - SCALE_ROWS
    codes = raw[:, :in_features].transpose(1, 2).reshape(panels * PANEL, in_features)
    scales = raw[:, in_features:].contiguous().view(torch.float32).reshape(-1)
    return codes, scales


def outside_rows(row: int, total: int) -> IndexError:
    """The error of a row lookup (an embedding's) past the weight's rows."""
    return IndexError(f"row {row} is outside the weight's {total} (padded) rows")


def _decode(codes: torch.Tensor, scales: torch.Tensor, code: CodeFormat) -> torch.Tensor:
    """uint8 codes of rows with their scales → fp32, as formats.dequantize computes them."""
    return codes.view(code.dtype).float() * scales[:, None]


def _backend(name: str, code: CodeFormat) -> LinearBackend:
    def prepare(weight: torch.Tensor | QuantWeight) -> torch.Tensor:
        if isinstance(weight, QuantWeight):  # codes and scales as a checkpoint stores them
            return pack(weight.codes, weight.fields[0], code.dtype)
        if weight.dtype != torch.float32:
            raise TypeError(f"{name} weights are quantized from float32, got {weight.dtype}")
        return pack(*quantize_weight(weight, code.fmt), code.dtype)

    def apply(x, prepared, bias, out_features):
        if x.dtype != torch.float32:
            raise TypeError(f"{name} linear expects float32 activations, got {x.dtype}")
        fn = kernel(code.kernel, P, P, P, P, L, L, L, I, source=SOURCE)
        if fn is None:  # no C compiler: the same values through torch
            codes, scales = unpack(prepared)
            weight = _decode(codes, scales, code)[:out_features]
            return fp32_reference(x, weight, bias)
        return run_packed(fn, x, prepared, bias, out_features)

    def rows(prepared: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Dequantized rows (a tied LM head's embedding lookup reads the quantized weight):
        one C call per step; without a C compiler, the unpacked weight's rows."""
        raw = prepared.view(torch.uint8)
        in_features, total = raw.shape[1] - SCALE_ROWS, raw.shape[0] * PANEL  # (padded rows)
        fn = kernel(code.rows_kernel, P, L, L, P, L, P, source=SOURCE, restype=L)
        if fn is not None and raw.is_contiguous() and ids.device.type == "cpu":
            ids = ids.to(torch.int64).contiguous()
            out = torch.empty(len(ids), in_features, dtype=torch.float32)
            bad = fn(raw.data_ptr(), in_features, total, ids.data_ptr(), len(ids), out.data_ptr())
            if bad >= 0:
                raise outside_rows(int(ids[bad]), total)
            return out
        bad = next((i for i in ids.tolist() if not 0 <= i < total), None)
        if bad is not None:  # (a negative index would wrap around)
            raise outside_rows(bad, total)
        codes, scales = unpack(prepared)
        return _decode(codes[ids], scales[ids], code)

    # int8 weights take int8 activations per token with integer sums (ops/linear_w8a8.py)
    integer = {("int8", "token"): functools.partial(linear_w8a8.apply, unpack=unpack)}
    fused = {("int8", "token"): linear_w8a8.DECODE_FORMAT}
    is_int8 = code.fmt == "int8"
    return LinearBackend(prepare, apply, rows, decode_format=code.decode_format,
                         quantized_inputs=integer if is_int8 else {},
                         quantized_decode_formats=fused if is_int8 else {})  # fmt: skip


for _name, _code in CODE_FORMATS.items():
    LINEAR_BACKENDS.register(_name, _backend(_name, _code))
