"""Write new keys/values into the paged KV cache.

k_cache / v_cache: [num_blocks, block_size, kv_heads, head_dim]; slot s = block·block_size +
offset. k, v: [tokens, kv_heads, head_dim]; slot_mapping: [tokens] int64.
Bytes moved: 2·tokens·kv_heads·head_dim elements written.
"""

from __future__ import annotations

import torch


def reference(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    block_size = k_cache.shape[1]
    for token, slot in enumerate(slot_mapping.tolist()):
        k_cache[slot // block_size, slot % block_size] = k[token]
        v_cache[slot // block_size, slot % block_size] = v[token]


def kv_store(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    flat_shape = (-1, *k_cache.shape[2:])
    k_cache.view(flat_shape).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(flat_shape).index_copy_(0, slot_mapping, v.to(v_cache.dtype))
