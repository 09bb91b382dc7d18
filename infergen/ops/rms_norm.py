"""RMSNorm with an optional fused residual add:

    h ← h + delta            (in place: h is the residual stream; skipped when delta is None)
    y = h / sqrt(mean(h², last dim) + eps) · weight

Bytes moved: read h (and delta) and weight, write h and y. Statistics in fp32.

Backends (RMS_NORM_BACKENDS): "torch" (F.rms_norm), "native" (kernels/rms_norm_f32.c: one
pass adds and sums squares, one scales; contiguous fp32 rows, else torch).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from infergen import profiling
from infergen.kernels.build import F as CF
from infergen.kernels.build import I, L, P, kernel
from infergen.profiling import Cost
from infergen.registry import Registry

AddRMSNormFn = Callable[[torch.Tensor, "torch.Tensor | None", torch.Tensor, float], torch.Tensor]
RMS_NORM_BACKENDS: Registry[AddRMSNormFn] = Registry("rms_norm backend")


def cost(rows: int, cols: int, residual: bool, element_bytes: int) -> Cost:
    """FLOPs: square-and-sum, scale and weight per element (4), the residual add (1); bytes:
    h read and y written, the weight, and with the residual delta read and h written back."""
    flops = (4 + residual) * rows * cols
    return Cost(flops, ((2 + 2 * residual) * rows * cols + cols) * element_bytes)


def region(h: torch.Tensor, delta: torch.Tensor | None):
    """The profiler's region of one call on h [..., cols] (infergen/profiling.py)."""
    cols = h.shape[-1]
    work = cost(h.numel() // cols, cols, delta is not None, h.element_size())
    return profiling.region("rms_norm", f"{cols}{' +add' if delta is not None else ''}", work)


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Plain-torch oracle (the Hugging Face Llama rule: normalise in fp32, then scale)."""
    x32 = x.to(torch.float32)
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


@RMS_NORM_BACKENDS.decorator("torch")
def add_rms_norm_torch(
    h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    if delta is not None:
        h.add_(delta)
    if h.dtype == torch.float32:
        return F.rms_norm(h, (h.shape[-1],), weight, eps)
    return reference(h, weight, eps)


def _contiguous_f32(*tensors: torch.Tensor | None) -> bool:
    return all(
        t is None or (t.dtype == torch.float32 and t.is_contiguous() and t.device.type == "cpu")
        for t in tensors
    )


@RMS_NORM_BACKENDS.decorator("native")
def add_rms_norm_native(
    h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    fn = kernel("rms_norm_f32", P, P, P, P, L, L, CF, I)
    if fn is None or not _contiguous_f32(h, delta, weight):
        return add_rms_norm_torch(h, delta, weight, eps)
    out = torch.empty_like(h)
    cols = h.shape[-1]
    fn(
        h.data_ptr(),
        delta.data_ptr() if delta is not None else None,
        weight.data_ptr(),
        out.data_ptr(),
        h.numel() // cols,
        cols,
        eps,
        torch.get_num_threads(),
    )
    return out
