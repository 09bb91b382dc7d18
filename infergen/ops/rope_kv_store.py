"""RoPE on q and k, then the KV store of the rotated k and of v, as one op (issue 22).

The attention layer's fused QKV projection holds q and k side by side; this op takes them as
one view `qk` [tokens, heads + kv_heads, head_dim] (the first `heads` rows of each token are
q, the rest k; any token / head stride, rows of head_dim contiguous) and v [tokens, kv_heads,
head_dim], and
    q', k' = rope(q), rope(k)                    (ops/rope.py: half-split / NeoX rotation)
    cache[slot_mapping[t]] ← format(k'[t], v[t])   (ops/kv_store.py: the layer's KV format)
returning q' [tokens, heads, head_dim] and k' [tokens, kv_heads, head_dim] (prefill attention
reads the new keys, sparse decode summarizes them).
Bytes moved: read q, k, v once; write q', k' and the cache entries of k', v once.

Backends (ROPE_STORE_BACKENDS): "torch" is the two ops one after the other, with the layer's
own rotation (`rotate`: its RoPE row, partial rotary included); "triton" (ops/
rope_kv_store_triton.py) is one kernel per call for a full-rotary table and an engine-dtype
or FP8 E4M3 cache, and the torch row otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx

from infergen import profiling
from infergen.kvcache.kv_protocol import KVLayer
from infergen.ops import rope as rope_op
from infergen.ops.kv_store import cost as store_cost
from infergen.ops.kv_store import kv_store, slot_bytes
from infergen.ops.rope import RopeFn, RopeInputs, apply_rope
from infergen.profiling import Cost
from infergen.registry import Registry

# tracing (compiler/capture.py) keeps the KV store called from this module one IR node, as it
# does for the layer's own call
torch.fx.wrap("kv_store")

RopeStoreFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
ROPE_STORE_BACKENDS: Registry[RopeStoreFn] = Registry("rope + KV store backend")


def cost(qk: torch.Tensor, v: torch.Tensor, kv: KVLayer) -> Cost:
    """RoPE on q and k (ops/rope.py's cost) plus the KV store of k and v (ops/kv_store.py's)."""
    tokens, rows, dim = qk.shape
    store = store_cost(tokens, v.shape[1], dim, qk.element_size(), slot_bytes(kv.k, kv.v))
    return rope_op.cost(tokens, rows, dim, qk.element_size()) + store


def region(qk: torch.Tensor, v: torch.Tensor, kv: KVLayer):
    """The profiler's region of one call (infergen/profiling.py)."""
    rows, kv_heads, dim = qk.shape[1], v.shape[1], qk.shape[2]
    key = f"h{rows - kv_heads}/{kv_heads} d{dim} {str(kv.k.dtype).removeprefix('torch.')}"
    return profiling.region("rope_kv_store", key, cost(qk, v, kv))


def reference(
    q: torch.Tensor,  # [tokens, heads, d]
    k: torch.Tensor,  # [tokens, kv_heads, d]
    v: torch.Tensor,  # [tokens, kv_heads, d]
    positions: torch.Tensor,  # [tokens]
    table: torch.Tensor,  # [positions, d] cos | sin
    kv: KVLayer,
    slot_mapping: torch.Tensor,  # [tokens] int64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Oracle: q and k rotated in fp32 (rope.reference), cast back to their dtype; k' and v
    written by the layer's format at the slots (its own `store`). Returns (q', k')."""
    q_rot = rope_op.reference(q.float(), positions, table).to(q.dtype)
    k_rot = rope_op.reference(k.float(), positions, table).to(k.dtype)
    kv.fmt.store(kv, k_rot, v, slot_mapping)
    return q_rot, k_rot


@ROPE_STORE_BACKENDS.decorator("torch")
def rope_kv_store(
    qk: torch.Tensor,  # [tokens, heads + kv_heads, d]
    v: torch.Tensor,  # [tokens, kv_heads, d]
    heads: int,
    rope: RopeInputs,
    kv: KVLayer,
    slot_mapping: torch.Tensor,  # [tokens] int64
    rotate: RopeFn = apply_rope,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rotate` (q and k as one tensor) then kv_store: returns (q', k') as views of the
    rotated qk."""
    qk = rotate(qk, rope)
    q, k = qk[:, :heads], qk[:, heads:]
    kv_store(k, v, kv.k, kv.v, slot_mapping, kv)
    return q, k
