"""Per-block key summaries for query-aware sparse decode (Quest, Tang et al. 2024, §3).

For every KV cache block and KV head, the elementwise minimum and maximum of the keys stored
in it so far:
    summary[b, h, 0, d] = min_{t in block b} K[b, t, h, d]
    summary[b, h, 1, d] = max_{t in block b} K[b, t, h, d]
From it, Σ_d max(q_d·min_d, q_d·max_d) bounds q·k from above for every key k of the block
(ops/sparse_decode.py scores blocks with it).

Storage: [num_blocks, kv_heads, 2, head_dim] per layer — 2 rows per block of `block_size`
rows of K (1/8 of K at block size 16). Min / max of values of a dtype are values of that
dtype, so storing the summary in the keys' dtype is lossless.
Bytes moved by `update`: read tokens·kv_heads·d keys, read-modify-write 2·tokens·kv_heads·d
summary elements.

Life cycle (what the engine must do):
- `reset(blocks)` when the block pool hands a block to a new owner (fresh allocation, or a
  block being refilled after an eviction / swap-in). A reset block is *empty*
  (min = +∞, max = −∞); the scorer treats an empty block as "unknown: always worth reading",
  so a block that was never summarized is never skipped silently.
- `update(k, slot_mapping, block_size)` after each `kv_store` with the same keys and slots
  (prefill and decode alike). A partially filled block is fine: min / max only widen as
  tokens arrive, so the summary always covers exactly the block's stored tokens.
- A block reused through the prefix cache keeps its contents, so it keeps its summary: do not
  reset it. A block restored from a lower tier into a new block id: `load()` it from the
  cache (or `reset()` it: it is then always read).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

MIN, MAX = 0, 1  # rows of the summary's third axis


class BlockSummary:
    """One layer's key summaries: `data` [num_blocks, kv_heads, 2, head_dim] (min, max)."""

    def __init__(
        self,
        num_blocks: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        self.data = torch.empty(num_blocks, kv_heads, 2, head_dim, dtype=dtype, device=device)
        self.reset(torch.arange(num_blocks, device=device))

    @property
    def num_blocks(self) -> int:
        return self.data.shape[0]

    def reset(self, blocks: torch.Tensor | Sequence[int]) -> None:
        """Mark `blocks` [n] (block ids) empty: call when the pool allocates them."""
        blocks = torch.as_tensor(blocks, dtype=torch.int64, device=self.data.device)
        if blocks.numel() == 0:
            return
        self.data[blocks, :, MIN] = float("inf")
        self.data[blocks, :, MAX] = float("-inf")

    def update(self, k: torch.Tensor, slot_mapping: torch.Tensor, block_size: int) -> None:
        """Fold newly stored keys k [tokens, kv_heads, d] at cache slots `slot_mapping`
        [tokens] int64 (slot = block·block_size + offset) into their blocks' min / max.
        Vectorised: one scatter-min and one scatter-max over all tokens."""
        if k.shape[0] == 0:
            return
        if k.shape[1:] != self.data.shape[1:2] + self.data.shape[3:]:
            raise ValueError(
                f"keys {tuple(k.shape)} do not match the summary's "
                f"[tokens, {self.data.shape[1]}, {self.data.shape[3]}]"
            )
        blocks = torch.div(slot_mapping, block_size, rounding_mode="floor")
        index = blocks.to(self.data.device)[:, None, None].expand(k.shape)  # [tokens, kvh, d]
        k = k.to(self.data.dtype)
        self.data[:, :, MIN].scatter_reduce_(0, index, k, "amin")
        self.data[:, :, MAX].scatter_reduce_(0, index, k, "amax")

    def load(self, k_cache: torch.Tensor, blocks: torch.Tensor, lengths: torch.Tensor) -> None:
        """Recompute the summaries of `blocks` [n] from the cache, whose first `lengths` [n]
        positions are filled (e.g. after a swap-in to new block ids)."""
        blocks = torch.as_tensor(blocks, dtype=torch.int64)
        self.data[blocks] = summarize(k_cache, blocks, lengths).to(self.data.dtype)


def summarize(
    k_cache: torch.Tensor, block_ids: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """Oracle: the summaries recomputed from the cache.

    k_cache [num_blocks, block_size, kv_heads, d] (values as the attention reads them);
    block_ids [n] int64; lengths [n]: how many leading positions of each block are filled
    (0 → empty: min = +∞, max = −∞). Returns [n, kv_heads, 2, d] in k_cache's dtype
    (float32 for one-byte codes).
    """
    block_ids = torch.as_tensor(block_ids, dtype=torch.int64, device=k_cache.device)
    lengths = torch.as_tensor(lengths, dtype=torch.int64, device=k_cache.device)
    keys = k_cache[block_ids]  # [n, block_size, kv_heads, d]
    if keys.element_size() == 1:
        keys = keys.float()
    filled = (
        torch.arange(k_cache.shape[1], device=k_cache.device) < lengths[:, None]
    )  # [n, block_size]
    filled = filled[:, :, None, None]
    inf = torch.tensor(float("inf"), dtype=keys.dtype, device=keys.device)
    low = torch.where(filled, keys, inf).amin(dim=1)  # [n, kv_heads, d]
    high = torch.where(filled, keys, -inf).amax(dim=1)
    return torch.stack([low, high], dim=2)  # [n, kv_heads, 2, d]
