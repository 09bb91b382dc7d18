"""A checkpoint weight kept in its GGUF block encoding instead of being dequantized at load.

`load_checkpoint(..., keep_blocks=True)` returns Q4_0 / Q4_1 / Q8_0 matrices as `BlockWeight`s
(the "gguf" weight scheme): the projections then compute on the blocks directly
(ops/linear_grouped.py) and the model holds 4.5-8.5 bits a weight instead of 32. Everything
else that needs the values calls `ops.stored_weights.dense(w)` (the fp32 values
gguf.quants.dequantize gives).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# ggml type name → (our format name, bytes per block of 32)
BLOCK_TYPES = {"Q4_0": ("q4_0", 18), "Q4_1": ("q4_1", 20), "Q8_0": ("q8_0", 34)}
BLOCK = 32


def decode_blocks(ggml_type: str, raw: torch.Tensor) -> torch.Tensor:
    """The fp32 values of GGUF blocks: `raw` uint8 [..., row bytes] → [..., row values], the
    values gguf.quants.dequantize gives, bit for bit (the same fp32 steps: d · q, then + m for
    Q4_1), each written once into the output by whole-tensor torch ops (numpy over row groups
    took 0.83 s for the default model's 210 Q4_1 matrices; this, 0.16-0.30 s). Q8_0: d (fp16),
    32 int8 q; Q4_0: d, 16 bytes whose low nibbles are q 0-15 and high nibbles q 16-31, less
    8; Q4_1: d, m (fp16), the nibbles."""
    size = BLOCK_TYPES[ggml_type][1]
    blocks = raw.reshape(-1, size)
    d = blocks[:, 0:2].contiguous().view(torch.float16).float()
    if ggml_type == "Q8_0":
        out = d * blocks[:, 2:].contiguous().view(torch.int8)
    else:
        out = torch.empty(blocks.shape[0], 2, BLOCK // 2)
        nibbles = blocks[:, size - 16 :]
        low, high = nibbles & 0x0F, nibbles >> 4
        if ggml_type == "Q4_0":
            low, high = low.to(torch.int8) - 8, high.to(torch.int8) - 8
        torch.mul(d, low, out=out[:, 0])
        torch.mul(d, high, out=out[:, 1])
        if ggml_type == "Q4_1":
            out += blocks[:, 2:4].contiguous().view(torch.float16).float().unsqueeze(1)
    return out.reshape(*raw.shape[:-1], raw.shape[-1] // size * BLOCK)


@dataclass(frozen=True)
class BlockWeight:
    ggml_type: str  # a BLOCK_TYPES key
    blocks: torch.Tensor  # uint8 [out, in / 32 * block bytes]: each row's blocks in order
    shape: tuple[int, int]  # [out, in] of the weight it encodes

    @property
    def fmt(self) -> str:
        return BLOCK_TYPES[self.ggml_type][0]

    def dequantize(self) -> torch.Tensor:
        return decode_blocks(self.ggml_type, self.blocks).reshape(self.shape)

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
