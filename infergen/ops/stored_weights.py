"""Weights stored quantized in a checkpoint (formats/block_weight.py: GGUF blocks;
formats/quant_weight.py: compressed-tensors codes and scales) as values: `dense` decodes one
with the backend that computes on it (so the values are exactly what the projection uses),
`fuse` concatenates projections that share an input, `cut` slices one as stored where it can."""

from __future__ import annotations

import torch

from infergen.formats.block_weight import BLOCK, BLOCK_TYPES, BlockWeight
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


def cut(weight, rows: tuple[int, int] | None = None, columns: tuple[int, int] | None = None):
    """weight[rows, columns] (spans [first, end); None: all), kept in its stored encoding
    where the encoding allows the cut — any rows (each row's blocks, codes and scales are its
    own); columns at whole blocks of 32 inputs (GGUF blocks, a group format's fields), any
    columns of a per-row format (int8 / FP8: one scale a row) — else dequantized first
    (tensor parallelism's splits: models/sharding.py)."""
    r0, r1 = rows if rows is not None else (0, weight.shape[0])
    c0, c1 = columns if columns is not None else (0, weight.shape[1])
    whole_blocks = c0 % BLOCK == 0 and (c1 % BLOCK == 0 or c1 == weight.shape[1])
    if isinstance(weight, BlockWeight) and whole_blocks:
        size = BLOCK_TYPES[weight.ggml_type][1]  # bytes a block
        blocks = weight.blocks[r0:r1, c0 // BLOCK * size : -(-c1 // BLOCK) * size]
        return BlockWeight(weight.ggml_type, blocks.contiguous(), (r1 - r0, c1 - c0))
    quantized = isinstance(weight, QuantWeight)
    per_row = quantized and weight.fmt in linear_quantized.CODE_FORMATS
    if quantized and (per_row or whole_blocks):
        fields = tuple(
            (
                f[r0:r1] if per_row or f.dim() == 1 else f[r0:r1, c0 // BLOCK : -(-c1 // BLOCK)]
            ).contiguous()
            for f in weight.fields
        )
        codes = weight.codes[r0:r1, c0:c1].contiguous()
        return QuantWeight(weight.fmt, codes, fields, weight.scalar, (r1 - r0, c1 - c0))
    return dense(weight)[r0:r1, c0:c1]
