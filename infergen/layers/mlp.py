"""Gated MLP: down(act(gate(x)) * up(x)), gate and up fused into one matmul.

The activation is the config's `hidden_act`: SwiGLU ("silu", ops/silu_mul.py) or GeGLU
("gelu_pytorch_tanh", ops/gelu_mul.py) — a row of GATED_ACTIVATIONS.
"""

from __future__ import annotations

import torch
from torch import nn

from infergen import profiling
from infergen.config import ModelConfig
from infergen.layers.linear import Linear
from infergen.ops import gelu_mul, silu_mul
from infergen.ops.gelu_mul import GELU_MUL_BACKENDS
from infergen.ops.silu_mul import SILU_MUL_BACKENDS

# hidden_act → the registry of its gated-activation backends
GATED_ACTIVATIONS = {"silu": SILU_MUL_BACKENDS, "gelu_pytorch_tanh": GELU_MUL_BACKENDS}
# hidden_act → the profiler's region of its op (infergen/profiling.py), and its work
GATED_REGIONS = {"silu": silu_mul.region, "gelu_pytorch_tanh": gelu_mul.region}
GATED_COSTS = {"silu": silu_mul.cost, "gelu_pytorch_tanh": gelu_mul.cost}


class GatedMLP(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        backend: str = "torch",
        intermediate_size: int | None = None,  # default: the config's (MoE shared experts)
    ):
        super().__init__()
        h, i = config.hidden_size, intermediate_size or config.intermediate_size
        self.gate_up = Linear(h, 2 * i, config.mlp_bias, dtype, backend)  # rows: [gate; up]
        self.down = Linear(i, h, config.mlp_bias, dtype, backend)
        self.act = GATED_ACTIVATIONS[config.hidden_act].get(
            backend, where="kernels", fallback="torch"
        )
        self.hidden_act = config.hidden_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [tokens, hidden]
        gate_up = self.gate_up(x)
        if profiling.enabled():
            with GATED_REGIONS[self.hidden_act](gate_up):
                act = self.act(gate_up)
            return self.down(act)
        return self.down(self.act(gate_up))

    def load(self, get: callable, prefix: str) -> None:
        """`get(name)` returns a checkpoint tensor by Hugging Face name."""

        def fused(kind: str) -> torch.Tensor:
            return Linear.fused([get(f"{prefix}gate_proj.{kind}"), get(f"{prefix}up_proj.{kind}")])

        has_bias = self.gate_up.has_bias
        self.gate_up.load(fused("weight"), fused("bias") if has_bias else None)
        self.down.load(
            get(prefix + "down_proj.weight"), get(prefix + "down_proj.bias") if has_bias else None
        )
