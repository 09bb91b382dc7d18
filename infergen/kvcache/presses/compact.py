"""Compaction: after a press chose each KV head's kept tokens, one layer's kept K and V move
to consecutive slots of the sequence's new blocks, in position order, each KV head its own
tokens. Keys are stored after RoPE, so a kept key keeps its position's rotation wherever it
lands; the slots only say where it is stored. The codes move as they are (the engine dtype's
values, or a scaled format's codes: its scales are per layer and head, unchanged)."""

from __future__ import annotations

import torch

from infergen.kvcache.kv_protocol import KVLayer


def _flat(page: torch.Tensor) -> torch.Tensor:
    """[slots, kv_heads, head_dim] view of a page [num_blocks, block_size, kv_heads, d]
    (one-byte codes as bytes: no fp8 indexing on the CPU)."""
    if page.element_size() == 1 and page.dtype != torch.uint8:
        page = page.view(torch.uint8)
    return page.view(-1, *page.shape[2:])


def cache_slots(blocks: list[int], count: int, block_size: int,
                device: torch.device) -> torch.Tensor:  # fmt: skip
    """[count] int64 cache slots of a sequence's cache indices 0 .. count-1 through its
    block list `blocks` (a slot: block · block_size + offset), on `device`."""
    index = torch.arange(count)
    table = torch.tensor(blocks, dtype=torch.int64)
    return (table[index // block_size] * block_size + index % block_size).to(device)


def compact_layer(kv: KVLayer, old_slots: torch.Tensor, new_slots: torch.Tensor) -> None:
    """Move each KV head h's tokens at `old_slots[h]` [kv_heads, keep] int64 to `new_slots`
    [keep] int64, for K and V (the new slots must not overlap the old ones being read: all
    are read before any is written)."""
    heads = torch.arange(old_slots.shape[0], device=old_slots.device)[:, None]
    for page in (kv.k, kv.v):
        flat = _flat(page)
        kept = flat[old_slots, heads]  # [kv_heads, keep, head_dim]
        flat.index_copy_(0, new_slots, kept.transpose(0, 1).contiguous())
