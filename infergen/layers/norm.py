"""RMSNorm layer (weight [hidden]); the math is an ops.rms_norm backend, with an optional
fused residual add (h += delta in place, then normalise h)."""

from __future__ import annotations

import torch
from torch import nn

from infergen import profiling
from infergen.ops.rms_norm import RMS_NORM_BACKENDS, region


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype, backend: str = "torch"):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype), False)
        self.eps = eps
        self.fn = RMS_NORM_BACKENDS.get(backend, where="kernels", fallback="torch")

    def forward(self, x: torch.Tensor, residual_delta: torch.Tensor | None = None) -> torch.Tensor:
        """With `residual_delta`, x is the residual stream and is updated in place first."""
        if profiling.enabled():
            with region(x, residual_delta):
                return self.fn(x, residual_delta, self.weight, self.eps)
        return self.fn(x, residual_delta, self.weight, self.eps)
