"""Dense projection: y = x · Wᵀ + b.  x [tokens, in], W [out, in], b [out] or None.

Bytes moved: W dominates at small token counts (decode is memory-bound: out·in·4 bytes per
step in fp32); FLOPs 2·tokens·in·out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = x @ weight.t()
    return y + bias if bias is not None else y


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, weight, bias)
