"""RMSNorm: y = x / sqrt(mean(x², last dim) + eps) * weight.

Bytes moved: read x and weight, write y (2·N·H·4 + H·4 in fp32). Statistics in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Plain-torch oracle (the Hugging Face Llama rule: normalise in fp32, then scale)."""
    x32 = x.to(torch.float32)
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [tokens, hidden] (or [..., hidden]); weight: [hidden]."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return reference(x, weight, eps)
