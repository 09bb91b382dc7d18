"""Write new keys/values into the paged KV cache.

k_cache / v_cache: [num_blocks, block_size, kv_heads, head_dim]; slot s = block·block_size +
offset. k, v: [tokens, kv_heads, head_dim]; slot_mapping: [tokens] int64.
Bytes moved: 2·tokens·kv_heads·head_dim elements written.
"""

from __future__ import annotations

import torch

from infergen import profiling
from infergen.kvcache.kv_protocol import KVLayer, layer_of
from infergen.profiling import Cost, nbytes


def slot_bytes(k_cache: torch.Tensor, v_cache: torch.Tensor) -> float:
    """Bytes one position takes in a layer's K and V caches as stored ([blocks, block_size,
    ...]: codes included, per-block scales not)."""
    return nbytes(k_cache, v_cache) / max(1, k_cache.shape[0] * k_cache.shape[1])


def cost(tokens: int, kv_heads: int, dim: int, element_bytes: int, position_bytes: float) -> Cost:
    """No FLOPs counted (an encoding format's scaling is not); bytes: k and v [tokens, kv_heads,
    dim] read, their positions written in the cache's format (`position_bytes` each)."""
    return Cost(0, 2 * tokens * kv_heads * dim * element_bytes + round(tokens * position_bytes))


def region(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor):
    """The profiler's region of one store of k, v [tokens, kv_heads, dim]."""
    key = f"h{k.shape[1]} d{k.shape[2]} {str(k_cache.dtype).removeprefix('torch.')}"
    tokens, kv_heads, dim = k.shape
    work = cost(tokens, kv_heads, dim, k.element_size(), slot_bytes(k_cache, v_cache))
    return profiling.region("kv_store", key, work)


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
