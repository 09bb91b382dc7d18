"""Row-wise ops in Triton, the `triton` rows of their registries (issue 22):

- add + RMSNorm (RMS_NORM_BACKENDS): h ← h + delta in place (rounded to h's dtype, as torch's
  add_ is), then y = (h / sqrt(mean(h²) + eps), in fp32, cast to h's dtype) · weight — one
  program per row, one read of h and delta, one write of h and of y (ops/rms_norm.py's rule);
- SiLU-mul (SILU_MUL_BACKENDS): y = silu(gate) · up from the fused [tokens, 2n] projection,
  in fp32, cast to the input dtype — one program per row and BLOCK columns.

Rows are padded to a power of two and masked. Triton is optional: without it this module
imports and the kernels raise when called.
"""

from __future__ import annotations

import torch

from infergen.ops.rms_norm import RMS_NORM_BACKENDS, add_rms_norm_torch
from infergen.ops.silu_mul import SILU_MUL_BACKENDS

try:
    import triton
    import triton.language as tl
except ImportError:  # an optional extra: the kernels below are then plain, uncalled functions
    triton = None
    tl = None

jit = triton.jit if triton is not None else (lambda fn: fn)
SILU_BLOCK = 1024


@jit
def _add_rms_norm_kernel(h_ptr, delta_ptr, w_ptr, out_ptr, cols, eps,
                         HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    h = tl.load(h_ptr + row * cols + offs, mask=mask, other=0.0)
    if HAS_DELTA:
        h = h + tl.load(delta_ptr + row * cols + offs, mask=mask, other=0.0)
        tl.store(h_ptr + row * cols + offs, h, mask=mask)
    h32 = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(h32 * h32, 0) / cols + eps)
    normed = (h32 * rstd).to(h.dtype)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + row * cols + offs, normed * w, mask=mask)


@jit
def _silu_mul_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    gate = tl.load(x_ptr + row * 2 * n + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * n + n + offs, mask=mask, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * n + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _need_triton(name: str) -> None:
    if triton is None:
        raise RuntimeError(f"{name} needs Triton: pip install 'infergen[triton]'")


@RMS_NORM_BACKENDS.decorator("triton")
def add_rms_norm_triton(
    h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """h [..., cols] (updated in place when delta is given); weight [cols]. Returns y like h.
    Rows that are not contiguous (a view of the heads, e.g. QK-norm) take the torch row."""
    _need_triton("add_rms_norm_triton")
    if not h.is_contiguous() or (delta is not None and not delta.is_contiguous()):
        return add_rms_norm_torch(h, delta, weight, eps)
    cols = h.shape[-1]
    out = torch.empty_like(h)
    rows = h.numel() // cols
    if rows:
        _add_rms_norm_kernel[(rows,)](
            h, delta if delta is not None else h, weight.to(h.dtype).contiguous(), out, cols,
            eps, HAS_DELTA=delta is not None, BLOCK=triton.next_power_of_2(cols),
        )  # fmt: skip
    return out


@SILU_MUL_BACKENDS.decorator("triton")
def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2n] → silu(gate) · up [..., n] in gate_up's dtype."""
    _need_triton("silu_mul_triton")
    gate_up = gate_up.contiguous()
    n = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], n, dtype=gate_up.dtype, device=gate_up.device)
    rows = gate_up.numel() // (2 * n) if n else 0
    if rows:
        block = min(SILU_BLOCK, triton.next_power_of_2(n))
        _silu_mul_kernel[(rows, triton.cdiv(n, block))](gate_up, out, n, BLOCK=block)
    return out
