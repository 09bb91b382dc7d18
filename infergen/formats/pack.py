"""Sub-byte packing along the last axis, and the Blackwell tensor-core scale layout.

Packing (REFERENCES §3): two 4-bit codes per byte, element 2i in the LOW nibble; four 2-bit
codes per byte, element 4i+j at bits 2j..2j+1. The last axis must hold a whole number of bytes.

Swizzle: cuBLAS / Blackwell block-scaled GEMMs read scales as 128x4 tiles: rows padded to a
multiple of 128 and scale columns to a multiple of 4; each tile is 512 contiguous bytes with
in-tile offset (r % 32) * 16 + (r // 32) * 4 + c; tiles are row-major over the padded matrix.
"""

from __future__ import annotations

import torch


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes (< 2^bits) [..., n] → bytes [..., n * bits / 8]."""
    per_byte = 8 // bits
    if codes.shape[-1] % per_byte:
        raise ValueError(
            f"cannot pack {codes.shape[-1]} {bits}-bit codes: the last axis must be a multiple "
            f"of {per_byte}"
        )
    grouped = codes.to(torch.uint8).reshape(*codes.shape[:-1], -1, per_byte)
    out = torch.zeros(grouped.shape[:-1], dtype=torch.uint8, device=codes.device)
    for j in range(per_byte):
        out |= grouped[..., j] << (bits * j)
    return out


def unpack_bits(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of pack_bits: bytes [..., m] → uint8 codes [..., m * 8 / bits]."""
    per_byte = 8 // bits
    mask = (1 << bits) - 1
    parts = [(packed >> (bits * j)) & mask for j in range(per_byte)]
    return torch.stack(parts, dim=-1).reshape(*packed.shape[:-1], -1)


def _tile_index(rows: int, cols: int, device: torch.device) -> tuple[torch.Tensor, int, int]:
    """For the padded [R, C] matrix: the flat swizzled position of every (r, c)."""
    padded_rows, padded_cols = -(-rows // 128) * 128, -(-cols // 4) * 4
    r = torch.arange(padded_rows, device=device).view(-1, 1)
    c = torch.arange(padded_cols, device=device).view(1, -1)
    tile = (r // 128) * (padded_cols // 4) + c // 4
    inner = (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    return tile * 512 + inner, padded_rows, padded_cols


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """Scale matrix [rows, cols] → the flat swizzled layout (padding zero-filled)."""
    rows, cols = scales.shape
    index, padded_rows, padded_cols = _tile_index(rows, cols, scales.device)
    padded = scales.new_zeros(padded_rows, padded_cols)
    padded[:rows, :cols] = scales
    out = scales.new_empty(padded_rows * padded_cols)
    out[index.reshape(-1)] = padded.reshape(-1)
    return out


def from_blocked(blocked: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of to_blocked: the flat swizzled scales → [rows, cols]."""
    index, padded_rows, padded_cols = _tile_index(rows, cols, blocked.device)
    if blocked.numel() != padded_rows * padded_cols:
        raise ValueError(
            f"swizzled scales hold {blocked.numel()} entries; [{rows}, {cols}] padded to "
            f"[{padded_rows}, {padded_cols}] needs {padded_rows * padded_cols}"
        )
    return blocked.reshape(-1)[index][:rows, :cols]
