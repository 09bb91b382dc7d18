"""Query-aware block-sparse decode attention (Quest, Tang et al. 2024, arXiv:2406.10774).

Per decode sequence i (one query token, context of seq_lens[i] positions in the cache blocks
listed by block_tables[i]) and per KV head h:
1. Score every candidate block b (a block overlapping the span the query may read:
   [max(0, len − window), len), or [0, len) without a window) by an upper bound of q·k over
   the block's keys, from the block's summary (kvcache/block_summary.py):
       bound_j(b) = Σ_d max(q_j,d · min_d(b), q_j,d · max_d(b))     for query head j of h
       score(b)   = max over the GQA group's query heads j of bound_j(b)
2. Select S = min(top_k_blocks, candidates) blocks: always the last (partial) block and the
   first `keep_first` blocks of the sequence (attention sinks; with a sliding window only
   those inside it), then the best-scoring others.
3. out_j = softmax(q_j·Kᵀ · scale + mask) · V over the selected blocks' positions, masking
   positions ≥ len and positions outside the window.
With top_k_blocks ≥ the number of candidate blocks this is dense decode attention exactly.

Choices:
- Selection per (sequence, KV head), as Quest selects per head: each KV head reads its own
  most relevant blocks, so the same accuracy needs fewer blocks than one selection shared by
  all heads (which must take the union of every head's needs). The cost: the gather reads
  [block_size, head_dim] slices per (block, head) — rows of head_dim contiguous elements
  strided by kv_heads·head_dim — instead of whole contiguous blocks. Bytes read per head are
  the same as a shared selection with the same k.
- GQA score = max over the group of per-head bounds: the block is read if any query head of
  the group may give a key in it a large logit (a bound is an upper bound of that head's
  largest logit in the block, the max of bounds is one of the group's largest logit). A sum
  over heads would let other heads' bounds mask one head's needle; a bound of the summed
  query loses the per-head sign pattern (and is no bound of any head's logit).
- An empty (reset, never updated) block scores +max: unknown blocks are always read.
Bytes moved per step: summaries 2·blocks·kv_heads·d (of the candidate blocks) + K and V of
the selected blocks 2·S·block_size·kv_heads·d, against 2·len·kv_heads·d for dense decode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from infergen.errors import ConfigError
from infergen.kvcache.block_summary import MAX, MIN, BlockSummary
from infergen.kvcache.kv_protocol import KVLayer, layer_of
from infergen.ops.paged_attention import AttentionPlan
from infergen.registry import Registry


class BlockSelection(NamedTuple):
    blocks: torch.Tensor  # [decodes, kv_heads, width] int64 block-table columns, ascending
    valid: torch.Tensor  # [decodes, kv_heads, width] bool; width = max selected blocks
    first_pos: torch.Tensor  # [decodes] int64 first position the query may read (window)


SparseDecodeFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
SPARSE_DECODE_BACKENDS: Registry[SparseDecodeFn] = Registry("sparse decode attention backend")


def _check(top_k_blocks: int, keep_first: int) -> None:
    if keep_first < 0 or top_k_blocks < keep_first + 1:
        raise ConfigError(
            "sparse decode must be able to read the last block and the first keep_first blocks",
            where="top_k_blocks",
            found=f"top_k_blocks={top_k_blocks}, keep_first={keep_first}",
            expected="keep_first ≥ 0 and top_k_blocks ≥ keep_first + 1",
        )


def _spans(
    seq_lens: torch.Tensor, block_size: int, window: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[decodes] each: blocks of the sequence, first readable position, its block."""
    lens = seq_lens.to(torch.int64)
    n_blocks = (lens + block_size - 1) // block_size
    first_pos = (lens - window).clamp(min=0) if window else torch.zeros_like(lens)
    return n_blocks, first_pos, first_pos // block_size


def block_scores(q: torch.Tensor, summary: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """q [decodes, heads, d], summary [num_blocks, kv_heads, 2, d], blocks [decodes, n]
    (block ids) → [decodes, kv_heads, n] float32 scores (max over the GQA group of
    Σ_d max(q_d·min_d, q_d·max_d)); an empty block scores float32 max."""
    batch, heads, dim = q.shape
    kv_heads = summary.shape[1]
    s = summary[blocks].float()  # [decodes, n, kv_heads, 2, d]
    low, high = s[..., MIN, :], s[..., MAX, :]
    empty = (low > high).any(-1)  # [decodes, n, kv_heads]
    low = torch.where(empty[..., None], 0.0, low)
    high = torch.where(empty[..., None], 0.0, high)
    query = q.float().reshape(batch, kv_heads, heads // kv_heads, dim)
    # q_d ≥ 0 takes max_d, q_d < 0 takes min_d: max(q·min, q·max) since min ≤ max
    bound = torch.einsum("bhgd,bnhd->bhgn", query.clamp(min=0), high)
    bound += torch.einsum("bhgd,bnhd->bhgn", query.clamp(max=0), low)
    big = torch.finfo(torch.float32).max
    score = bound.amax(dim=2).nan_to_num(nan=big, posinf=big, neginf=-big)  # [b, kvh, n]
    return torch.where(empty.transpose(1, 2), big, score)


def select_blocks(
    q: torch.Tensor,
    summary: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    top_k_blocks: int,
    keep_first: int = 1,
    window: int = 0,
) -> BlockSelection:
    """The blocks each (sequence, KV head) reads: exactly min(top_k_blocks, candidates)."""
    _check(top_k_blocks, keep_first)
    max_blocks = block_tables.shape[1]
    n_blocks, first_pos, first_block = _spans(seq_lens, block_size, window)
    column = torch.arange(max_blocks, device=block_tables.device)  # [max_blocks]
    candidate = (column >= first_block[:, None]) & (column < n_blocks[:, None])  # [b, M]
    forced = candidate & ((column == n_blocks[:, None] - 1) | (column < keep_first))
    count = torch.clamp(n_blocks - first_block, max=top_k_blocks)  # [decodes]
    width = int(count.max())
    ids = torch.where(candidate, block_tables, torch.zeros_like(block_tables))
    score = block_scores(q, summary, ids)  # [decodes, kv_heads, M]
    inf = float("inf")
    key = torch.where(candidate[:, None], score, -inf)
    key = torch.where(forced[:, None], inf, key)  # forced blocks first (≤ count of them)
    top = key.topk(width, dim=-1).indices  # [decodes, kv_heads, width]
    valid = (torch.arange(width, device=top.device) < count[:, None, None]).expand(top.shape)
    top = torch.where(valid, top, max_blocks).sort(dim=-1).values  # ascending, padding last
    top = torch.where(valid, top, 0)
    return BlockSelection(top, valid, first_pos)


@SPARSE_DECODE_BACKENDS.decorator("torch")
def sparse_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    summary: torch.Tensor | BlockSummary,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    top_k_blocks: int,
    keep_first: int = 1,
    window: int = 0,
    kv: KVLayer | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [decodes, heads, d]; k_cache / v_cache [num_blocks, block_size, kv_heads, d];
    summary [num_blocks, kv_heads, 2, d]; block_tables [decodes, max_blocks] int64;
    seq_lens [decodes] int64 (context length including the query's own token, already
    stored); `kv`: the layer's KVLayer, whose format reads the blocks (None: the caches hold
    values as they are).

    Returns (out [decodes, heads, d], kv_read [decodes] int64): kv_read is the number of KV
    positions the sequence attended, per KV head (mean over its KV heads, floored: heads
    differ only when a window cuts the first candidate block).
    """
    kv = layer_of(kv, k_cache, v_cache)
    if isinstance(summary, BlockSummary):
        summary = summary.data
    batch, heads, dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    sel = select_blocks(
        q, summary, block_tables, seq_lens, block_size, top_k_blocks, keep_first, window
    )
    width = sel.blocks.shape[-1]
    ids = block_tables.gather(1, sel.blocks.view(batch, -1)).view(batch, kv_heads, width)
    ids = torch.where(sel.valid, ids, torch.zeros_like(ids))
    keys, values = kv.fmt.read_blocks(kv, ids, q.dtype)  # [b, kvh, width, bs, d]
    pos = sel.blocks[..., None] * block_size + torch.arange(block_size, device=q.device)
    lens = seq_lens.to(torch.int64)[:, None, None, None]
    mask = sel.valid[..., None] & (pos < lens) & (pos >= sel.first_pos[:, None, None, None])
    query = q.reshape(batch, kv_heads, heads // kv_heads, dim)
    o = F.scaled_dot_product_attention(
        query,
        keys.reshape(batch, kv_heads, width * block_size, dim),
        values.reshape(batch, kv_heads, width * block_size, dim),
        attn_mask=mask.reshape(batch, kv_heads, 1, width * block_size),
        scale=scale,
    )
    kv_read = torch.div(mask.sum(dim=(1, 2, 3)), kv_heads, rounding_mode="floor")
    return o.reshape(batch, heads, dim), kv_read


def dense_positions(seq_lens: torch.Tensor, window: int = 0) -> torch.Tensor:
    """[decodes] KV positions dense decode reads: the denominator of the fraction read."""
    lens = seq_lens.to(torch.int64)
    return lens.clamp(max=window) if window else lens


@dataclass
class QuestDecode:
    """One layer's sparse decode in the DECODE_BACKENDS signature
    (q, k_cache, v_cache, attn_plan, scale, kv): pass it as paged_attention's `decode_fn`.
    `last_kv_read` [decodes] holds the positions read by the latest call (for metrics)."""

    summary: BlockSummary
    top_k_blocks: int
    keep_first: int = 1
    last_kv_read: torch.Tensor | None = None
    kv_read_total: int = 0  # positions read over every call (per KV head)
    kv_dense_total: int = 0  # positions dense decode would have read

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        attn_plan: AttentionPlan,
        scale: float,
        kv: KVLayer | None = None,
    ) -> torch.Tensor:
        out, self.last_kv_read = sparse_decode_attention(
            attn_plan.decode_queries(q),
            k_cache,
            v_cache,
            self.summary.data,
            attn_plan.decode_block_tables,
            attn_plan.decode_seq_lens,
            scale,
            self.top_k_blocks,
            self.keep_first,
            attn_plan.window,
            kv,
        )
        self.kv_read_total += int(self.last_kv_read.sum())
        self.kv_dense_total += int(
            dense_positions(attn_plan.decode_seq_lens, attn_plan.window).sum()
        )
        return out


def reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    summary: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    top_k_blocks: int,
    keep_first: int = 1,
    window: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, list[list[list[int]]]]:
    """Oracle: per sequence, per KV head, choose blocks by an explicit loop, then explicit
    float64 softmax per query head. Returns (out, kv_read, chosen[i][h] sorted block-table
    columns)."""
    _check(top_k_blocks, keep_first)
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    heads = q.shape[1]
    group = heads // kv_heads
    out = torch.zeros_like(q, dtype=torch.float64)
    kv_read = torch.zeros(q.shape[0], dtype=torch.int64)
    chosen: list[list[list[int]]] = []
    for i, ctx in enumerate(seq_lens.tolist()):
        n = -(-ctx // block_size)
        first_pos = max(0, ctx - window) if window else 0
        candidates = list(range(first_pos // block_size, n))
        chosen.append([])
        for h in range(kv_heads):

            def score(j: int, i: int = i, h: int = h) -> float:
                low = summary[block_tables[i, j], h, MIN].double()
                high = summary[block_tables[i, j], h, MAX].double()
                if bool((low > high).any()):
                    return float("inf")  # never summarized: always worth reading
                return max(
                    float(
                        torch.maximum(q[i, head].double() * low, q[i, head].double() * high).sum()
                    )
                    for head in range(h * group, (h + 1) * group)
                )

            forced = [j for j in candidates if j == n - 1 or j < keep_first]
            others = sorted((j for j in candidates if j not in forced), key=score, reverse=True)
            take = min(top_k_blocks, len(candidates)) - len(forced)
            blocks = sorted(forced + others[:take])
            chosen[i].append(blocks)
            positions = [
                p
                for j in blocks
                for p in range(j * block_size, (j + 1) * block_size)
                if first_pos <= p < ctx
            ]
            kv_read[i] += len(positions)
            keys = torch.stack(
                [k_cache[block_tables[i, p // block_size], p % block_size, h] for p in positions]
            ).double()  # [positions, d]
            values = torch.stack(
                [v_cache[block_tables[i, p // block_size], p % block_size, h] for p in positions]
            ).double()
            for head in range(h * group, (h + 1) * group):
                logits = keys @ q[i, head].double() * scale
                weights = torch.exp(logits - logits.max())
                out[i, head] = (weights / weights.sum()) @ values
        kv_read[i] //= kv_heads
    return out.to(q.dtype), kv_read, chosen
