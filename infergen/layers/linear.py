"""Linear layer: weight [out, in], optional bias; the product is an ops.linear backend.

The weight is stored in the backend's prepared form (`load`), which may not be [out, in]:
read it back with `rows`, never through `.weight` directly.
"""

from __future__ import annotations

import torch
from torch import nn

from infergen.ops import linear_quantized  # noqa: F401  (registers "int8", "fp8_e4m3")
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
        self.in_features, self.out_features, self.dtype = in_features, out_features, dtype
        self.backend = LINEAR_BACKENDS.get(backend, where="kernels")
        self.register_buffer("weight", None)
        self.register_buffer("bias", None)
        self.has_bias = bias

    def load(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """Take the checkpoint weight [out, in] (and bias [out]) in the engine dtype."""
        expected = (self.out_features, self.in_features)
        if tuple(weight.shape) != expected or (bias is not None) != self.has_bias:
            raise ValueError(
                f"Linear.load: weight {tuple(weight.shape)} bias {bias is not None}, "
                f"expected {expected} bias {self.has_bias}"
            )
        self.weight = self.backend.prepare(weight.to(self.dtype).contiguous())
        self.bias = bias.to(self.dtype).contiguous() if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [tokens, in] → [tokens, out]
        return self.backend.apply(x, self.weight, self.bias, self.out_features)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of the weight [len(ids), in] (an embedding lookup for tied heads)."""
        return self.backend.rows(self.weight, ids)

    @staticmethod
    def fused(weights: list[torch.Tensor]) -> torch.Tensor:
        """Concatenate projections that share an input (q/k/v, gate/up) along `out`."""
        return torch.cat(weights, dim=0)
