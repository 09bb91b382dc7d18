"""Row-wise ops in Triton, the `triton` rows of their registries (issue 22):

- add + RMSNorm (RMS_NORM_BACKENDS): h ← h + delta in place (rounded to h's dtype, as torch's
  add_ is), then y = (h / sqrt(mean(h²) + eps), in fp32, cast to h's dtype) · weight — one
  program per row, one read of h and delta, one write of h and of y (ops/rms_norm.py's rule);
- SiLU-mul (SILU_MUL_BACKENDS) and GELU-mul (GELU_MUL_BACKENDS, ops/gelu_mul.py's tanh
  approximation, as g · sigmoid(2z)): y = act(gate) · up from the fused [tokens, 2n]
  projection, in fp32, cast to the input dtype — one kernel (the activation a constexpr),
  one program per row and GATED_BLOCK columns;
- RoPE (ROPE_BACKENDS): x [tokens, heads, d] rotated by its token's row of the cos/sin table
  (ops/rope.py: cos in the first half of a row, sin in the second), halves (x1, x2) →
  (x1·cos − x2·sin, x2·cos + x1·sin) in fp32, cast to x's dtype — one program per token, all
  its heads at once (the table row read once); x may be a strided view of the fused QKV.

Rows are padded to a power of two and masked. Triton is optional: without it this module
imports and the kernels raise when called.
"""

from __future__ import annotations

import torch

from infergen.ops.gelu_mul import GELU_MUL_BACKENDS
from infergen.ops.rms_norm import RMS_NORM_BACKENDS, add_rms_norm_torch
from infergen.ops.rope import ROPE_BACKENDS, RopeInputs, apply_rope
from infergen.ops.silu_mul import SILU_MUL_BACKENDS
from infergen.ops.triton_lang import jit, tl, triton

GATED_BLOCK = 1024  # columns per program of the gated activations


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
def _gated_act_kernel(x_ptr, out_ptr, n, GELU: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    gate = tl.load(x_ptr + row * 2 * n + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * n + n + offs, mask=mask, other=0.0).to(tl.float32)
    if GELU:  # 0.5·g·(1 + tanh(z)) = g · sigmoid(2z), z = √(2/π)·(g + 0.044715·g³)
        z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)  # √(2/π) · (...)
        y = gate / (1.0 + tl.exp(-2.0 * z)) * up
    else:  # silu(g) = g · sigmoid(g)
        y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * n + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@jit
def _rope_kernel(x_ptr, out_ptr, pos_ptr, cache_ptr, heads, token_stride, head_stride,
                 HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < HALF
    cos = tl.load(cache_ptr + pos * 2 * HALF + cols, mask=col_ok, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * 2 * HALF + HALF + cols, mask=col_ok, other=0.0)
    sin = sin.to(tl.float32)
    hs = tl.arange(0, BLOCK_H)
    mask = (hs < heads)[:, None] & col_ok[None, :]
    src = x_ptr + token * token_stride + hs[:, None] * head_stride + cols[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = out_ptr + (token * heads + hs[:, None]) * 2 * HALF + cols[None, :]
    kind = out_ptr.dtype.element_ty
    tl.store(dst, (x1 * cos[None, :] - x2 * sin[None, :]).to(kind), mask=mask)
    tl.store(dst + HALF, (x2 * cos[None, :] + x1 * sin[None, :]).to(kind), mask=mask)


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


def _gated_act(gate_up: torch.Tensor, gelu: bool) -> torch.Tensor:
    """gate_up [..., 2n] → act(gate) · up [..., n] in gate_up's dtype."""
    gate_up = gate_up.contiguous()
    n = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], n, dtype=gate_up.dtype, device=gate_up.device)
    rows = gate_up.numel() // (2 * n) if n else 0
    if rows:
        block = min(GATED_BLOCK, triton.next_power_of_2(n))
        _gated_act_kernel[(rows, triton.cdiv(n, block))](gate_up, out, n, GELU=gelu, BLOCK=block)
    return out


@SILU_MUL_BACKENDS.decorator("triton")
def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2n] → silu(gate) · up [..., n] in gate_up's dtype."""
    _need_triton("silu_mul_triton")
    return _gated_act(gate_up, gelu=False)


@GELU_MUL_BACKENDS.decorator("triton")
def gelu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2n] → gelu_tanh(gate) · up [..., n] in gate_up's dtype."""
    _need_triton("gelu_mul_triton")
    return _gated_act(gate_up, gelu=True)


@ROPE_BACKENDS.decorator("triton")
def apply_rope_triton(x: torch.Tensor, rope: RopeInputs) -> torch.Tensor:
    """x [tokens, heads, d] (rows of d contiguous; tokens and heads at any stride) → a rotated
    copy [tokens, heads, d]. A table narrower than d (partial rotary) takes the torch row."""
    _need_triton("apply_rope_triton")
    tokens, heads, dim = x.shape
    if rope.cache.shape[-1] != dim or x.stride(2) != 1 or dim % 2:
        return apply_rope(x, rope)
    out = torch.empty(tokens, heads, dim, dtype=x.dtype, device=x.device)
    if tokens:
        half = dim // 2
        _rope_kernel[(tokens,)](
            x, out, rope.positions.contiguous(), rope.cache.contiguous(), heads, x.stride(0),
            x.stride(1), HALF=half, BLOCK_H=triton.next_power_of_2(heads),
            BLOCK_D=triton.next_power_of_2(half),
        )  # fmt: skip
    return out
