"""H2O (Zhang et al., 2023), "heavy hitters": a token's importance is the attention it has
accumulated from every query so far, and the cache stays within a budget during decode — the
most recent tokens plus the heavy hitters. Here the prompt's accumulated attention is that of
its last `window` queries (every prompt query would mean a second full prefill's attention),
then each decode query's attention is added as the sequence grows (engine/kv_press.py: scored
a block at a time, when the cache has grown a block past the budget). Per KV head: the
attention weights summed over the queries, averaged over the query heads sharing it (GQA)."""

from __future__ import annotations

from infergen.kvcache.presses.press import PRESSES, Press
from infergen.kvcache.presses.snapkv import WINDOW, window_weights

RECENT = 32  # the most recent tokens, always kept


class H2O(Press):
    name = "h2o"
    description = (
        f"heavy hitters under a budget: attention accumulated from the prompt's last {WINDOW} "
        f"queries, then from every decode; the {RECENT} most recent tokens kept; the cache "
        "stays at the prompt's kept count during decode"
    )
    window = WINDOW
    budgeted = True
    recent = RECENT

    def accumulated(self, keys, queries, scale):
        tokens, kv_heads, _ = keys.shape
        heads = queries.shape[1]
        summed = window_weights(keys, queries, scale).sum(dim=1)  # [heads, tokens]
        return summed.view(kv_heads, heads // kv_heads, tokens).mean(dim=1)

    def scores(self, keys, queries, scale, layer):
        scores = self.accumulated(keys, queries, scale)
        scores[:, max(0, keys.shape[0] - self.recent) :] = float("inf")
        return scores


PRESSES.register("h2o", H2O())
