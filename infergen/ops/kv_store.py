"""Write new keys/values into the paged KV cache.

k_cache / v_cache: [num_blocks, block_size, kv_heads, head_dim]; slot s = block·block_size +
offset. k, v: [tokens, kv_heads, head_dim]; slot_mapping: [tokens] int64.
Bytes moved: 2·tokens·kv_heads·head_dim elements written.
"""

from __future__ import annotations

import torch

from infergen.kvcache.kv_protocol import KVLayer, layer_of


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
    """`kv` (the layer's KVLayer; None: k_cache / v_cache hold values as they are): its KV
    format stores K / V (kvcache/kv_protocol.py: codes, or a block-quantized format's own
    store at the slots of the step it planned)."""
    kv = layer_of(kv, k_cache, v_cache)
    kv.fmt.store(kv, k, v, slot_mapping)
