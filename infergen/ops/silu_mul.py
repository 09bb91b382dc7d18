"""Gated activation of the SwiGLU MLP: y = silu(x[..., :n]) * x[..., n:].

Input is the fused gate/up projection [tokens, 2n]; output [tokens, n].
Bytes moved: read 2·T·n, write T·n elements.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return gate * torch.sigmoid(gate) * up


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    n = gate_up.shape[-1] // 2
    out = F.silu(gate_up[..., :n])
    return out.mul_(gate_up[..., n:])
