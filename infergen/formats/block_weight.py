"""A checkpoint weight kept in its GGUF block encoding instead of being dequantized at load.

`load_checkpoint(..., keep_blocks=True)` returns Q4_0 / Q4_1 / Q8_0 matrices as `BlockWeight`s
(the "gguf" weight scheme): the projections then compute on the blocks directly
(ops/linear_grouped.py) and the model holds 4.5-8.5 bits a weight instead of 32. Everything
else that needs the values calls `ops.stored_weights.dense(w)` (the fp32 values
gguf.quants.dequantize gives).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# ggml type name → (our format name, bytes per block of 32)
BLOCK_TYPES = {"Q4_0": ("q4_0", 18), "Q4_1": ("q4_1", 20), "Q8_0": ("q8_0", 34)}
BLOCK = 32


@dataclass(frozen=True)
class BlockWeight:
    ggml_type: str  # a BLOCK_TYPES key
    blocks: torch.Tensor  # uint8 [out, in / 32 * block bytes]: each row's blocks in order
    shape: tuple[int, int]  # [out, in] of the weight it encodes

    @property
    def fmt(self) -> str:
        return BLOCK_TYPES[self.ggml_type][0]

    def dequantize(self) -> torch.Tensor:
        from gguf import GGMLQuantizationType, quants

        qtype = GGMLQuantizationType[self.ggml_type]
        values = quants.dequantize(self.blocks.numpy(), qtype)
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(self.shape)

    def nonfinite_scales(self) -> tuple[int, int]:
        """(how many, of how many) of the blocks' fp16 scales (and Q4_1 minimums) are NaN or
        ±Inf."""
        size = BLOCK_TYPES[self.ggml_type][1]
        raw = self.blocks.reshape(-1, size)
        heads = raw[:, : 4 if self.ggml_type == "Q4_1" else 2].contiguous().view(torch.float16)
        return int((~torch.isfinite(heads)).sum()), heads.numel()

    @staticmethod
    def cat(parts: list[BlockWeight]) -> BlockWeight:
        """Concatenate along `out` (fused q/k/v, gate/up); all parts of one type and width."""
        first = parts[0]
        rows = sum(p.shape[0] for p in parts)
        return BlockWeight(
            first.ggml_type, torch.cat([p.blocks for p in parts]), (rows, first.shape[1])
        )
