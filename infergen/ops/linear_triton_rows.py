"""The kernels="triton" rows of LINEAR_BACKENDS (issue 22), registered as this module is
imported (ops/triton_modules.py): a weight scheme's projections then run
`ops.linear.backend_for(format, "triton")`, these rows.

- "<format>:triton" for every format of ops/linear_triton.TRITON_FORMATS (int8, fp8_e4m3,
  q8_0, q4_0, q4_1, int4, int4_asym, mxfp4, nvfp4): `prepare` quantizes the fp32 weight with
  the CPU backends' quantizers into linear_triton's GPU layout (GGUF Q4_0 / Q4_1 / Q8_0 blocks
  of the "gguf" scheme are re-laid out as loaded, nothing re-quantized); `apply` is the
  weight-only Triton kernel `linear_triton` (fp32 products of the same dequantized weights as
  the CPU rows); `rows` dequantizes the selected rows (a tied embedding's lookup). None of
  them has a `decode_format`: the fused CPU decode step never takes them.
- "fp8_e4m3:triton" also takes FP8 inputs quantized per token (`activations="fp8_e4m3"`:
  W8A8 FP8) in one product, torch._scaled_mm (ops/linear_fp8.py), where the device runs it
  (CUDA compute capability >= 8.9, or torch's CPU op) and the shape fits (in and out multiples
  of 16); elsewhere x̂ (the same per-token rule) goes through the weight-only kernel.
- "native:triton": the full-precision row of the Triton kernel set (F.linear: a projection
  the load-time check keeps at full precision, the unquantized projections of the "gguf"
  scheme), device-agnostic where "native" is the CPU's C kernel.
"""

from __future__ import annotations

import torch

from infergen.formats.block_weight import BlockWeight
from infergen.ops.linear import LINEAR_BACKENDS, ApplyFn, LinearBackend, PreparedTensors
from infergen.ops.linear_fp8 import fits, linear_fp8, supported
from infergen.ops.linear_grouped import from_blocks
from infergen.ops.linear_triton import (
    TRITON_FORMATS,
    dequantize_prepared,
    grouped_layout,
    linear_triton,
    prepare_triton,
)
from infergen.ops.quantize_activation import fp8_token_codes


def _row_tensors(fmt: str) -> tuple[str, ...]:
    """The layout's tensors with a row per output channel (the rest hold one value)."""
    per_tensor = TRITON_FORMATS.get(fmt).scales == "tensor"
    return ("codes", "zeros", "mins") + (() if per_tensor else ("scales",))


def _backend(fmt: str, quantized_inputs: dict[tuple[str, str], ApplyFn]) -> LinearBackend:
    per_row = _row_tensors(fmt)

    def prepare(weight: torch.Tensor | BlockWeight) -> PreparedTensors:
        if isinstance(weight, BlockWeight):  # the "gguf" scheme: the file's blocks as loaded
            if weight.fmt != fmt:
                raise TypeError(f"{fmt}:triton backend got {weight.ggml_type} blocks")
            device = weight.blocks.device
            layout = grouped_layout(from_blocks(weight), fmt)
            return PreparedTensors({name: t.to(device) for name, t in layout.items()})
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"{fmt}:triton quantizes float32 weights, got {type(weight).__name__}")
        return PreparedTensors(prepare_triton(weight, fmt))

    def apply(x, prepared: PreparedTensors, bias, out_features: int) -> torch.Tensor:
        return linear_triton(x, prepared, bias, fmt)

    def rows(prepared: PreparedTensors, ids: torch.Tensor) -> torch.Tensor:
        """Dequantized rows [len(ids), in] fp32, on the layout's device."""
        ids = ids.to(prepared["codes"].device)
        picked = {n: t.index_select(0, ids) if n in per_row else t for n, t in prepared.items()}
        return dequantize_prepared(picked, fmt, device=None)

    return LinearBackend(prepare, apply, rows, quantized_inputs=quantized_inputs)


def _w8a8_fp8(x: torch.Tensor, prepared: PreparedTensors, bias, out_features: int) -> torch.Tensor:
    """x quantized per token to E4M3 and multiplied with the E4M3 weight: torch._scaled_mm
    where it runs, else x̂ through the weight-only kernel (the same values)."""
    codes = prepared["codes"]  # uint8 E4M3FN bytes [out, in]
    if supported(x.device) and fits(codes.shape[1], codes.shape[0]):
        return linear_fp8(x, codes.view(torch.float8_e4m3fn), prepared["scales"], bias)
    x_codes, x_scales = fp8_token_codes(x.reshape(-1, x.shape[-1]))
    x_hat = (x_codes.float() * x_scales).to(x.dtype).reshape(x.shape)
    return linear_triton(x_hat, prepared, bias, "fp8_e4m3")


# format → the W·A products of its row: (activation format, granularity) → apply
QUANTIZED_INPUTS = {"fp8_e4m3": {("fp8_e4m3", "token"): _w8a8_fp8}}

for _fmt in TRITON_FORMATS:
    LINEAR_BACKENDS.register(f"{_fmt}:triton", _backend(_fmt, QUANTIZED_INPUTS.get(_fmt, {})))
_dense = LINEAR_BACKENDS.get("torch")  # a distinct row: the "gguf" scheme's marker (layers/linear)
LINEAR_BACKENDS.register("native:triton", LinearBackend(_dense.prepare, _dense.apply, _dense.rows))
