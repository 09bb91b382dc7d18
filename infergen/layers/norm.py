"""RMSNorm layer (weight [hidden]); the math is ops.rms_norm."""

from __future__ import annotations

import torch
from torch import nn

from infergen.ops.rms_norm import rms_norm


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype), False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)
