"""Dense projection: y = x · Wᵀ + b.  x [tokens, in], W [out, in], b [out] or None.

Bytes moved: W dominates at small token counts (decode is memory-bound: out·in·4 bytes per
step in fp32); FLOPs 2·tokens·in·out.

Backends (LINEAR_BACKENDS):
- "torch": F.linear (MKL sgemm/sgemv).
- "native": C kernels for decode-sized products: one token (batch-1 decode) streams W at close
  to memory bandwidth (kernels/matvec_f32.c, ~1.8x MKL's sgemv here); 2..24 tokens use
  kernels/matmul_small_f32.c; larger products go to torch (compute-bound, MKL is better).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from infergen.kernels.build import I, L, P, kernel
from infergen.registry import Registry

LinearFn = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]
LINEAR_BACKENDS: Registry[LinearFn] = Registry("linear backend")


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = x @ weight.t()
    return y + bias if bias is not None else y


@LINEAR_BACKENDS.decorator("torch")
def linear_torch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, weight, bias)


# Up to this many tokens the native kernels beat MKL here (measured: M=8 2.5x, M=16 1.6x,
# M=32 even, M=64 MKL 1.3x faster); larger products are compute-bound and go to torch.
NATIVE_MAX_TOKENS = 24


@LINEAR_BACKENDS.decorator("native")
def linear_native(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """One token: kernels/matvec_f32.c; 2..NATIVE_MAX_TOKENS: kernels/matmul_small_f32.c
    (each weight row streamed once per 8 tokens); otherwise torch."""
    tokens = x.shape[0]
    if (
        tokens > NATIVE_MAX_TOKENS
        or x.dim() != 2
        or x.dtype != torch.float32
        or weight.dtype != torch.float32
        or not weight.is_contiguous()
    ):
        return F.linear(x, weight, bias)
    rows, cols = weight.shape
    bias_ptr = bias.contiguous().data_ptr() if bias is not None else None
    threads = torch.get_num_threads()
    out = torch.empty(tokens, rows, dtype=torch.float32)
    if tokens == 1:
        matvec = kernel("matvec_f32", P, P, P, P, L, L, I)
        if matvec is None:
            return F.linear(x, weight, bias)
        x = x.contiguous()
        matvec(weight.data_ptr(), x.data_ptr(), bias_ptr, out.data_ptr(), rows, cols, threads)
        return out
    matmul = kernel("matmul_small_f32", P, P, P, P, L, L, L, L, I)
    if matmul is None:
        return F.linear(x, weight, bias)
    padded = -(-tokens // 8) * 8
    if padded != tokens or not x.is_contiguous():
        x_padded = torch.zeros(padded, cols, dtype=torch.float32)
        x_padded[:tokens] = x
        x = x_padded
    matmul(
        weight.data_ptr(),
        x.data_ptr(),
        bias_ptr,
        out.data_ptr(),
        rows,
        cols,
        tokens,
        padded,
        threads,
    )
    return out
