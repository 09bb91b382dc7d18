"""SnapKV (Li et al., 2024): the last `window` tokens of the prompt act as an observation
window; a cached token's importance is the attention the window's queries pay it. Per KV head:
the softmax attention weights of every window query (causal: a window query sees the keys up to
its own position) over the sequence's keys, averaged over the window's queries and over the
query heads that share the KV head (GQA), then max-pooled over neighbouring positions
(`kernel`: a kept token keeps its neighbours too, as the paper's clustering does). The window's
own tokens are always kept (score +inf)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infergen.kvcache.presses.press import PRESSES, Press

WINDOW = 32  # observation window (tokens at the prompt's end whose queries score the rest)
KERNEL = 7  # pooling width over positions


def window_weights(keys: torch.Tensor, queries: torch.Tensor, scale: float) -> torch.Tensor:
    """[heads, window, tokens]: the causal softmax attention weights of the last `window`
    positions' queries [window, heads, head_dim] over keys [tokens, kv_heads, head_dim]."""
    tokens, kv_heads, _ = keys.shape
    window, heads, _ = queries.shape
    expanded = keys.repeat_interleave(heads // kv_heads, dim=1)  # [tokens, heads, head_dim]
    logits = torch.einsum("whd,thd->hwt", queries, expanded) * scale
    query_pos = torch.arange(tokens - window, tokens, device=keys.device)
    future = torch.arange(tokens, device=keys.device)[None, :] > query_pos[:, None]
    return logits.masked_fill_(future, float("-inf")).softmax(dim=-1)


class SnapKV(Press):
    name = "snapkv"
    description = (
        "query-aware: the attention the prompt's last 32 queries pay each token, averaged over "
        "the KV head's query heads, max-pooled over 7 positions; the window itself kept"
    )
    window = WINDOW

    def __init__(self, kernel: int = KERNEL):
        self.kernel = kernel

    def scores(self, keys, queries, scale, layer):
        tokens, kv_heads, _ = keys.shape
        window, heads, _ = queries.shape
        weights = window_weights(keys, queries, scale).mean(dim=1)  # [heads, tokens]
        per_kv = weights.view(kv_heads, heads // kv_heads, tokens).mean(dim=1)
        before = tokens - window  # (0: a prompt no longer than the window, all of it kept)
        kept = torch.full((kv_heads, window), float("inf"), device=keys.device)
        if before == 0:
            return kept
        pooled = F.max_pool1d(
            per_kv[:, None, :before], self.kernel, stride=1, padding=self.kernel // 2
        )[:, 0]  # [kv_heads, before]
        return torch.cat([pooled, kept], dim=-1)


PRESSES.register("snapkv", SnapKV())
