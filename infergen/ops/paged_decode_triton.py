"""Paged decode attention in Triton: one query token per sequence reads its keys and values
through the block table (MHA / GQA / MQA, optional sliding window with sink tokens), the
`triton` row of ops/paged_attention.DECODE_BACKENDS (issue 22's first kernel).

Work split (flash-decoding): a program per (sequence, KV head, context split). It loads the
queries of every query head of its KV group once — [GROUP rows, d], padded to 16 rows for
`tl.dot` — and walks its split of the context in tiles of BLOCK_N positions; each K / V tile is
loaded once for the whole group (the GQA saving: K/V bytes read once per KV head, not once per
query head). A tile's positions are mapped to cache slots through the block table
(slot = block_tables[b, p // block_size] · block_size + p % block_size), so blocks need not be
contiguous. Softmax is online (running max and sum, base 2 with log2(e) folded into the
scale). Each split writes its normalized partial output and its log-sum-exp; `_combine` merges
the splits (weights exp(lse_s − max)): long contexts use many programs even at batch 1.

Positions read by the query at p = seq_len − 1: all k ≤ p, or with a window w only
p − w < k ≤ p plus the first `sinks` positions (StreamingLLM). Head dims that are not powers
of two are padded and masked. K/V are the cache's values (fp32 / fp16 / bf16); a KV format
that encodes them (FP8 codes, KIVI, NVFP4) is read by the torch row for now.

Triton is optional: without it this module imports and `paged_decode_triton` raises.
"""

from __future__ import annotations

import torch

from infergen.kvcache.kv_protocol import ENGINE_DTYPE, KVLayer, layer_of
from infergen.ops.paged_attention import DECODE_BACKENDS, AttentionPlan, decode_attention
from infergen.ops.triton_lang import jit, tl, triton

LOG2E = 1.4426950408889634
VALUE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@jit
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, out_ptr, lse_ptr,
    max_blocks, scale_log2, window, sinks,
    HEADS: tl.constexpr, KV_HEADS: tl.constexpr, GROUP: tl.constexpr, DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, SPLITS: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + seq)
    q_pos = seq_len - 1
    # each sequence splits its own context evenly (whole tiles): no host-side maximum
    split_len = tl.cdiv(tl.cdiv(seq_len, SPLITS), BLOCK_N) * BLOCK_N
    lo = split * split_len
    hi = tl.minimum(lo + split_len, seq_len)
    rows = tl.arange(0, BLOCK_G)  # the query heads of this KV head's group
    dims = tl.arange(0, BLOCK_D)
    head = kv_head * GROUP + rows
    row_ok = rows < GROUP
    dim_ok = dims < DIM
    q = tl.load(
        q_ptr + (seq * HEADS + head)[:, None] * DIM + dims[None, :],
        mask=row_ok[:, None] & dim_ok[None, :],
        other=0.0,
    ).to(tl.float32)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < hi
        if window > 0:
            valid = valid & ((pos > q_pos - window) | (pos < sinks))
        block = tl.load(tables_ptr + seq * max_blocks + pos // BLOCK_SIZE, mask=valid, other=0)
        slot = block.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
        offsets = (slot * KV_HEADS + kv_head)[:, None] * DIM + dims[None, :]
        kv_mask = valid[:, None] & dim_ok[None, :]
        k = tl.load(k_ptr + offsets, mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + offsets, mask=kv_mask, other=0.0).to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale_log2  # [G, N]
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        # a tile with nothing visible (a window's gap) leaves the running state as it was
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(scores - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    lse = tl.where(l_i > 0.0, m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
    where = (seq * HEADS + head) * SPLITS + split
    tl.store(out_ptr + where[:, None] * DIM + dims[None, :], out,
             mask=row_ok[:, None] & dim_ok[None, :])  # fmt: skip
    tl.store(lse_ptr + where, lse, mask=row_ok)


def _combine(partial: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Merge the splits: partial [batch, heads, splits, d] (each normalized), lse (base 2)
    [batch, heads, splits] → [batch, heads, d]."""
    if partial.shape[2] == 1:
        return partial[:, :, 0]
    weights = torch.exp2(lse - lse.amax(dim=2, keepdim=True))
    weights = weights / weights.sum(dim=2, keepdim=True)
    return (partial * weights.unsqueeze(-1)).sum(dim=2)


def num_splits(max_context: int, programs: int, split_min: int = 256) -> int:
    """Context splits: enough programs to fill ~128 at once (a GPU's SMs), each split at
    least `split_min` positions."""
    if programs >= 128:
        return 1
    return max(1, min(-(-128 // programs), -(-max_context // split_min)))


def paged_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int = 0,
    sinks: int = 0,
    splits: int | None = None,
    block_n: int = 32,
    max_context: int | None = None,
) -> torch.Tensor:
    """q [batch, heads, d] (fp32 / fp16 / bf16); k_cache, v_cache [blocks, block_size,
    kv_heads, d]; block_tables [batch, max_blocks] int; seq_lens [batch] int (the query is
    the last position); window 0 = none; `max_context`: the longest seq_len, known on the
    host (the plan's), which picks the number of splits — None reads it from seq_lens (a
    device sync: tests only). Returns [batch, heads, d] in q's dtype."""
    if triton is None:
        raise RuntimeError("paged_decode_triton needs Triton: pip install 'infergen[triton]'")
    batch, heads, dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not split into {kv_heads} KV heads")
    if q.dtype not in VALUE_DTYPES or k_cache.dtype not in VALUE_DTYPES:
        raise TypeError(f"expects {VALUE_DTYPES}, got q {q.dtype}, cache {k_cache.dtype}")
    group = heads // kv_heads
    if max_context is None:
        max_context = int(seq_lens.max()) if batch else 0
    splits = splits or num_splits(max_context, batch * kv_heads)
    partial = torch.empty(batch, heads, splits, dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(batch, heads, splits, dtype=torch.float32, device=q.device)
    if batch:
        _decode_kernel[(batch, kv_heads, splits)](
            q.contiguous(), k_cache, v_cache, block_tables.to(torch.int32).contiguous(),
            seq_lens.to(torch.int32).contiguous(), partial, lse,
            block_tables.shape[1], scale * LOG2E, window, sinks,
            HEADS=heads, KV_HEADS=kv_heads, GROUP=group, DIM=dim, BLOCK_SIZE=block_size,
            SPLITS=splits, BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n,
            BLOCK_D=max(16, triton.next_power_of_2(dim)),
        )  # fmt: skip
    return _combine(partial, lse).to(q.dtype)


@DECODE_BACKENDS.decorator("triton")
def decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    attn_plan: AttentionPlan,
    scale: float,
    kv: KVLayer | None = None,
) -> torch.Tensor:
    """The DECODE_BACKENDS row: the kernel above over the plan's block tables; a cache whose
    format encodes its values goes to the torch row."""
    kv = layer_of(kv, k_cache, v_cache)
    if kv.fmt is not ENGINE_DTYPE or k_cache.dtype not in VALUE_DTYPES:
        return decode_attention(q, k_cache, v_cache, attn_plan, scale, kv)
    return paged_decode_triton(
        attn_plan.decode_queries(q), k_cache, v_cache, attn_plan.decode_block_tables,
        attn_plan.decode_seq_lens, scale, attn_plan.window, attn_plan.sinks,
        max_context=attn_plan.decode_max_context or None,
    )  # fmt: skip
