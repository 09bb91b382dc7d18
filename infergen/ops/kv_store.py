"""Write new keys/values into the paged KV cache.

k_cache / v_cache: [num_blocks, block_size, kv_heads, head_dim]; slot s = block·block_size +
offset. k, v: [tokens, kv_heads, head_dim]; slot_mapping: [tokens] int64.
Bytes moved: 2·tokens·kv_heads·head_dim elements written.
"""

from __future__ import annotations

import torch

from infergen.kvcache.kv_format import encode
from infergen.kvcache.paged_cache import KVLayer


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
    kv: KVLayer | None = None,
) -> None:
    """`kv` (the layer's KVLayer) with a KV format: K / V are stored as its codes (a
    block-quantized format: through its own store, at the slots of the step it planned)."""
    if kv is not None and kv.blocked is not None:
        kv.blocked.store(k, v)
        return
    flat_shape = (-1, *k_cache.shape[2:])
    if kv is not None and kv.fmt is not None:
        k, v = encode(k, kv.k_scale, kv.fmt, kv.k_shift), encode(v, kv.v_scale, kv.fmt)
    if k_cache.element_size() == 1:  # one-byte codes are copied as bytes (no fp8 index_copy)
        k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
        k_cache, v_cache, k, v = (t.view(torch.uint8) for t in (k_cache, v_cache, k, v))
    k_cache.view(flat_shape).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(flat_shape).index_copy_(0, slot_mapping, v.to(v_cache.dtype))
