"""Weights stored quantized in a checkpoint (formats/block_weight.py: GGUF blocks;
formats/quant_weight.py: compressed-tensors codes and scales) as values: `dense` decodes one
with the backend that computes on it (so the values are exactly what the projection uses),
`fuse` concatenates projections that share an input."""

from __future__ import annotations

import torch

from infergen.formats.block_weight import BlockWeight
from infergen.formats.quant_weight import QuantWeight
from infergen.ops import linear_grouped, linear_quantized  # noqa: F401  (register their rows)
from infergen.ops.linear import LINEAR_BACKENDS


def dense(weight) -> torch.Tensor:
    """The weight's values as a tensor (a stored-quantized weight dequantized to fp32)."""
    if isinstance(weight, torch.Tensor):
        return weight
    if isinstance(weight, BlockWeight):
        return weight.dequantize()
    backend = LINEAR_BACKENDS.get(weight.fmt)
    rows = torch.arange(weight.shape[0])
    return backend.rows(backend.prepare(weight), rows)


def fuse(parts: list):
    """Concatenate projections sharing an input along `out`: GGUF blocks stay blocks when
    every part has the same block type, compressed-tensors weights stay quantized when they
    share a format (and NVFP4 global scale); else every part is dequantized."""
    kinds = {p.ggml_type if isinstance(p, BlockWeight) else None for p in parts}
    if len(kinds) == 1 and None not in kinds:
        return BlockWeight.cat(parts)
    if all(isinstance(p, QuantWeight) for p in parts):
        fused = QuantWeight.cat(parts)
        if fused is not None:
            return fused
    return torch.cat([dense(p) for p in parts], dim=0)
