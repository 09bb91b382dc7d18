"""Gated activation of the GeGLU MLP (Gemma): y = gelu_tanh(x[..., :n]) * x[..., n:].

gelu_tanh(g) = 0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³))) — `gelu_pytorch_tanh` in Hugging
Face configs. Input is the fused gate/up projection [tokens, 2n]; output [tokens, n].
Bytes moved: read 2·T·n, write T·n elements.
Backends (GELU_MUL_BACKENDS): "torch"; "native" is the torch one until a C kernel exists;
"triton" (ops/pointwise_triton.py, in fp32).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from infergen import profiling
from infergen.profiling import Cost
from infergen.registry import Registry

GELU_MUL_BACKENDS: Registry[Callable[[torch.Tensor], torch.Tensor]] = Registry("gelu_mul backend")


def cost(tokens: int, n: int, element_bytes: int) -> Cost:
    """FLOPs: gelu_tanh (9, tanh counted as one) and the product per output element; bytes:
    2·T·n read, T·n written."""
    return Cost(10 * tokens * n, 3 * tokens * n * element_bytes)


def region(gate_up: torch.Tensor):
    """The profiler's region of one call on gate_up [tokens, 2n] (infergen/profiling.py)."""
    n = gate_up.shape[-1] // 2
    work = cost(gate_up.numel() // (2 * n), n, gate_up.element_size())
    return profiling.region("gelu_mul", str(n), work)


def reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.double().chunk(2, dim=-1)
    inner = math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3)
    return (0.5 * gate * (1 + torch.tanh(inner)) * up).to(gate_up.dtype)


@GELU_MUL_BACKENDS.decorator("torch")
def gelu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    n = gate_up.shape[-1] // 2
    out = F.gelu(gate_up[..., :n], approximate="tanh")
    return out.mul_(gate_up[..., n:])


GELU_MUL_BACKENDS.register("native", gelu_mul)
