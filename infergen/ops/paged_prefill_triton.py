"""Varlen causal prefill attention over the paged KV cache in Triton: every sequence of a step
with several query tokens (a cold prompt, a chunk of a chunked prefill, the tail after a
prefix-cache hit) in ONE launch (MHA / GQA / MQA, sliding window with StreamingLLM sinks,
optional logit soft-capping), the `triton` row of ops/paged_attention.PREFILL_BACKENDS.

Sequence i's queries are the last query_len positions of a context of seq_len tokens; their
K/V, like the earlier positions', are already in the cache (layers/attention.py stores them
with kv_store before attention), so the kernel reads every key through the block table
(slot = block_tables[i, p // block_size] · block_size + p % block_size) and never from k_new.

Work split (flash-attention 2, varlen): a program per (query tile, KV head). A tile is up to
TILE_Q consecutive queries of one sequence times the GROUP query heads of the KV head, folded
into ROWS = TILE_Q · GROUP (padded to a power of two) rows of one `tl.dot`: each K / V tile is
loaded once for the whole GQA group. The step's tiles are listed once per step
(PrefillBatch.tiles: (sequence, first query), the longest first), so short and long sequences
share one grid without idle programs. Softmax is online in fp32 (running max and sum, base 2).

Query at p reads k ≤ p, and with a window w only p − w < k ≤ p plus the first `sinks`
positions. A tile walks only the keys some of its queries read: [first window start, last
query] and the sinks before it; tiles wholly before the window or after the causal edge are
never loaded (what makes windowed and chunked prefill cheap). Soft-capping (scores =
softcap · tanh(scores / softcap)) is a constexpr branch: without it the kernel has no tanh.

Operands stay in the cache's dtype (fp32 / fp16 / bf16: tensor cores for the half types,
fp32 products for fp32 — input_precision="ieee"), the probabilities go to V's dtype for the
second product, accumulation is fp32. Head dims that are not powers of two are padded and
masked. A KV format that encodes values (FP8 codes, KIVI, NVFP4), another attention core
(FP8 operands, learned sink logits) or a q dtype other than the cache's go to the torch row.

Triton is optional: without it this module imports and `paged_prefill_triton` raises.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from infergen.kvcache.kv_protocol import ENGINE_DTYPE, KVLayer, layer_of
from infergen.ops.paged_attention import (
    PREFILL_BACKENDS,
    AttentionPlan,
    PrefillBatch,
    prefill_attention,
)
from infergen.ops.triton_lang import jit, tl, triton

LOG2E = 1.4426950408889634
VALUE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@jit
def _attend(
    q, m_i, l_i, acc, start, limit, q_pos, seq, kv_head, k_ptr, v_ptr, tables_ptr, max_blocks,
    scale, softcap, window, sinks,
    KV_HEADS: tl.constexpr, DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SOFTCAP: tl.constexpr, DOT_F32: tl.constexpr,
):  # fmt: skip
    """One K/V tile (positions start .. start + BLOCK_N − 1, those < limit) into the online
    softmax of the tile's ROWS queries (q [ROWS, BLOCK_D], positions q_pos [ROWS])."""
    pos = start + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    valid = pos < limit
    block = tl.load(tables_ptr + seq * max_blocks + pos // BLOCK_SIZE, mask=valid, other=0)
    slot = block.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
    offsets = (slot * KV_HEADS + kv_head)[:, None] * DIM + dims[None, :]
    kv_mask = valid[:, None] & (dims < DIM)[None, :]
    k = tl.load(k_ptr + offsets, mask=kv_mask, other=0.0)  # [N, D]
    v = tl.load(v_ptr + offsets, mask=kv_mask, other=0.0)
    if DOT_F32:
        k, v = k.to(tl.float32), v.to(tl.float32)
    # [ROWS, N] fp32 scores in base 2 (`scale` holds log2(e) unless soft-capped)
    scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    if SOFTCAP:  # softcap · tanh(s / softcap) · log2(e), tanh(x) = 2·sigmoid(2x) − 1
        tanh = 2.0 * tl.sigmoid(scores * (2.0 / softcap)) - 1.0
        scores = tanh * (softcap * 1.4426950408889634)
    visible = valid[None, :] & (pos[None, :] <= q_pos[:, None])
    if window > 0:
        visible = visible & ((pos[None, :] > q_pos[:, None] - window) | (pos[None, :] < sinks))
    scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    # a row with nothing visible yet (a window's gap) keeps its running state
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(scores - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    p = p.to(v_ptr.dtype.element_ty)  # V's dtype (the tensor cores' operand for half types)
    if DOT_F32:
        p = p.to(tl.float32)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
    return m_new, l_i, acc


@jit
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, tiles_ptr, q_start_ptr, q_lens_ptr, seq_lens_ptr,
    tables_ptr, max_blocks, q_stride_t, q_stride_h, out_stride_t, out_stride_h,
    scale, softcap, window, sinks,
    KV_HEADS: tl.constexpr, GROUP: tl.constexpr, DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_Q: tl.constexpr, ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SOFTCAP: tl.constexpr, DOT_F32: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(tiles_ptr + 2 * tile)
    first = tl.load(tiles_ptr + 2 * tile + 1)  # the tile's first query (of its sequence's)
    q_start = tl.load(q_start_ptr + seq)
    q_len = tl.load(q_lens_ptr + seq)
    offset = tl.load(seq_lens_ptr + seq) - q_len  # context positions before the queries
    rows = tl.arange(0, ROWS)  # row r: query first + r // GROUP, head r % GROUP of the group
    dims = tl.arange(0, BLOCK_D)
    token = first + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = (rows < TILE_Q * GROUP) & (token < q_len)
    io_mask = row_ok[:, None] & (dims < DIM)[None, :]
    q_row = (q_start + token).to(tl.int64)
    q = tl.load(q_ptr + (q_row * q_stride_t + head * q_stride_h)[:, None] + dims[None, :],
                mask=io_mask, other=0.0)  # fmt: skip
    if DOT_F32:
        q = q.to(tl.float32)
    q_pos = offset + token
    last = offset + tl.minimum(first + TILE_Q, q_len)  # one past the tile's last query
    lo = tl.where(window > 0, tl.maximum(offset + first - window + 1, 0), 0)
    sink_end = tl.where(window > 0, tl.minimum(sinks, lo), 0)  # sinks before the window
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    for start in range(0, sink_end, BLOCK_N):
        m_i, l_i, acc = _attend(
            q, m_i, l_i, acc, start, sink_end, q_pos, seq, kv_head, k_ptr, v_ptr, tables_ptr,
            max_blocks, scale, softcap, window, sinks, KV_HEADS, DIM, BLOCK_SIZE, BLOCK_N,
            BLOCK_D, SOFTCAP, DOT_F32,
        )  # fmt: skip
    for start in range(lo, last, BLOCK_N):
        m_i, l_i, acc = _attend(
            q, m_i, l_i, acc, start, last, q_pos, seq, kv_head, k_ptr, v_ptr, tables_ptr,
            max_blocks, scale, softcap, window, sinks, KV_HEADS, DIM, BLOCK_SIZE, BLOCK_N,
            BLOCK_D, SOFTCAP, DOT_F32,
        )  # fmt: skip
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    out_offsets = (q_row * out_stride_t + head * out_stride_h)[:, None] + dims[None, :]
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=io_mask)


def tile_sizes(group: int, dim: int, dtype: torch.dtype) -> tuple[int, int]:
    """(ROWS, BLOCK_N): query rows (queries × GQA group, at least one whole group) and keys
    per program step: 64 rows × 64 keys for half types with head dims up to 128, × 32 keys
    for fp32 or larger head dims (the q, K and V tiles fit an H100/H200's shared memory)."""
    rows = max(64, triton.next_power_of_2(group))
    block_n = 64 if dim <= 128 and dtype != torch.float32 else 32
    return rows, block_n


def paged_prefill_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: PrefillBatch,
    scale: float,
    window: int = 0,
    sinks: int = 0,
    softcap: float | None = None,
    out: torch.Tensor | None = None,
    rows: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """q [tokens, heads, d] (fp32 / fp16 / bf16, head dim contiguous; rows not in `batch`
    are not read); k_cache, v_cache [blocks, block_size, kv_heads, d] in q's dtype, already
    holding every query's own K/V; `batch` the prefill sequences (PrefillBatch); window 0 =
    none; softcap None = none. Writes the batch's rows of `out` [tokens, heads, d] (a new
    tensor when None: its other rows are left unset) and returns it."""
    if triton is None:
        raise RuntimeError("paged_prefill_triton needs Triton: pip install 'infergen[triton]'")
    tokens, heads, dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not split into {kv_heads} KV heads")
    if q.dtype not in VALUE_DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise TypeError(f"expects q and the cache in one of {VALUE_DTYPES}, got q {q.dtype}, "
                        f"cache {k_cache.dtype} / {v_cache.dtype}")  # fmt: skip
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()) or q.stride(2) != 1:
        raise ValueError("expects contiguous K/V pages and q's head dim contiguous")
    if softcap is not None and softcap <= 0:
        raise ValueError(f"softcap must be positive, got {softcap}")
    out = torch.empty_like(q) if out is None else out
    assert out.shape == q.shape and out.stride(2) == 1 and out.dtype == q.dtype
    group = heads // kv_heads
    default_rows, default_n = tile_sizes(group, dim, q.dtype)
    rows, block_n = rows or default_rows, block_n or default_n
    if rows < max(16, group) or rows & (rows - 1) or block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"rows {rows} (≥ 16 and group {group}) and block_n {block_n} "
                         "(≥ 16) must be powers of two")  # fmt: skip
    tile_q = rows // group
    tiles = batch.tiles(tile_q)
    tables = batch.block_tables
    assert tables.dtype == torch.int32 and tables.is_contiguous()
    if tiles.shape[0]:
        _prefill_kernel[(tiles.shape[0], kv_heads)](
            q, k_cache, v_cache, out, tiles, batch.query_start, batch.query_lens, batch.seq_lens,
            tables, tables.shape[1], q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            scale if softcap else scale * LOG2E, softcap or 1.0, window, sinks,
            KV_HEADS=kv_heads, GROUP=group, DIM=dim, BLOCK_SIZE=block_size, TILE_Q=tile_q,
            ROWS=rows, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(dim)),
            SOFTCAP=softcap is not None,
            # Triton's interpreter multiplies bf16 tl.dot operands wrongly (their raw bits):
            # on the CPU the same bf16 values are multiplied in fp32 instead
            DOT_F32=q.dtype == torch.bfloat16 and q.device.type == "cpu",
            num_warps=8 if dim > 128 else 4,  # a [64, 256] fp32 accumulator: more registers
        )  # fmt: skip
    return out


@PREFILL_BACKENDS.decorator("triton")
def prefill_attention_triton(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    attn_plan: AttentionPlan,
    scale: float,
    out: torch.Tensor,
    kv: KVLayer | None = None,
    core: Callable[..., torch.Tensor] = F.scaled_dot_product_attention,
    new_slots: torch.Tensor | None = None,
) -> None:
    """The PREFILL_BACKENDS row: the kernel above over the plan's PrefillBatch, writing the
    prefill rows of `out`; a cache whose format encodes its values, another attention core
    or a q dtype other than the cache's go to the torch row."""
    kv = layer_of(kv, k_cache, v_cache)
    if (
        kv.fmt is not ENGINE_DTYPE
        or core is not F.scaled_dot_product_attention
        or k_cache.dtype not in VALUE_DTYPES
        or q.dtype != k_cache.dtype
    ):
        prefill_attention(q, k_new, v_new, k_cache, v_cache, attn_plan, scale, out, kv, core,
                          new_slots)  # fmt: skip
        return
    paged_prefill_triton(q, k_cache, v_cache, attn_plan.prefill_batch(), scale,
                         attn_plan.window, attn_plan.sinks, out=out)  # fmt: skip
