"""Gated activation of the SwiGLU MLP: y = silu(x[..., :n]) * x[..., n:].

Input is the fused gate/up projection [tokens, 2n]; output [tokens, n].
Bytes moved: read 2·T·n, write T·n elements.
Backends (SILU_MUL_BACKENDS): "torch" (3 ops), "native" (kernels/silu_mul_f32.c, one pass).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from infergen import profiling
from infergen.kernels.build import I, L, P, kernel
from infergen.profiling import Cost
from infergen.registry import Registry

SILU_MUL_BACKENDS: Registry[Callable[[torch.Tensor], torch.Tensor]] = Registry("silu_mul backend")


def cost(tokens: int, n: int, element_bytes: int) -> Cost:
    """FLOPs: silu (exp, add, divide, multiply: 4, exp counted as one) and the product per
    output element; bytes: 2·T·n read, T·n written."""
    return Cost(5 * tokens * n, 3 * tokens * n * element_bytes)


def region(gate_up: torch.Tensor):
    """The profiler's region of one call on gate_up [tokens, 2n] (infergen/profiling.py)."""
    n = gate_up.shape[-1] // 2
    work = cost(gate_up.numel() // (2 * n), n, gate_up.element_size())
    return profiling.region("silu_mul", str(n), work)


def reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return gate * torch.sigmoid(gate) * up


@SILU_MUL_BACKENDS.decorator("torch")
def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    n = gate_up.shape[-1] // 2
    out = F.silu(gate_up[..., :n])
    return out.mul_(gate_up[..., n:])


@SILU_MUL_BACKENDS.decorator("native")
def silu_mul_native(gate_up: torch.Tensor) -> torch.Tensor:
    fn = kernel("silu_mul_f32", P, P, L, L, I)
    if fn is None or gate_up.dtype != torch.float32 or not gate_up.is_contiguous():
        return silu_mul(gate_up)
    n = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], n, dtype=torch.float32)
    fn(gate_up.data_ptr(), out.data_ptr(), gate_up.numel() // (2 * n), n, torch.get_num_threads())
    return out
