"""Linear layer: weight [out, in], optional bias; the product is an ops.linear backend."""

from __future__ import annotations

import torch
from torch import nn

from infergen.ops.linear import LINEAR_BACKENDS


class Linear(nn.Module):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        dtype: torch.dtype,
        backend: str = "torch",
    ):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), False)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype), False) if bias else None
        self.fn = LINEAR_BACKENDS.get(backend, where="kernels")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [tokens, in] → [tokens, out]
        return self.fn(x, self.weight, self.bias)

    @staticmethod
    def fused(weights: list[torch.Tensor]) -> torch.Tensor:
        """Concatenate projections that share an input (q/k/v, gate/up) along `out`."""
        return torch.cat(weights, dim=0)
