"""Gated MLP (SwiGLU): down(silu(gate(x)) * up(x)), gate and up fused into one matmul."""

from __future__ import annotations

import torch
from torch import nn

from infergen.config import ModelConfig
from infergen.layers.linear import Linear
from infergen.ops.silu_mul import SILU_MUL_BACKENDS


class GatedMLP(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, backend: str = "torch"):
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_up = Linear(h, 2 * i, config.mlp_bias, dtype, backend)  # rows: [gate; up]
        self.down = Linear(i, h, config.mlp_bias, dtype, backend)
        self.act = SILU_MUL_BACKENDS.get(backend, where="kernels")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [tokens, hidden]
        return self.down(self.act(self.gate_up(x)))

    def load(self, get: callable, prefix: str) -> None:
        """`get(name)` returns a checkpoint tensor by Hugging Face name."""
        self.gate_up.weight.copy_(
            Linear.fused([get(prefix + "gate_proj.weight"), get(prefix + "up_proj.weight")])
        )
        self.down.weight.copy_(get(prefix + "down_proj.weight"))
        if self.gate_up.bias is not None:
            self.gate_up.bias.copy_(
                Linear.fused([get(prefix + "gate_proj.bias"), get(prefix + "up_proj.bias")])
            )
            self.down.bias.copy_(get(prefix + "down_proj.bias"))
