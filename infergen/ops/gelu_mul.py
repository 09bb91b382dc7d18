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

from infergen.registry import Registry

GELU_MUL_BACKENDS: Registry[Callable[[torch.Tensor], torch.Tensor]] = Registry("gelu_mul backend")


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
