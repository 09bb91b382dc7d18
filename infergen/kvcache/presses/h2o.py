"""H2O (Zhang et al., 2023), "heavy hitters": a token's importance is the attention it has
accumulated from every query so far, and the cache stays within a budget during decode — the
most recent tokens plus the heavy hitters. Every query counts: each prefill chunk's and each
decode's queries are scored against the cache as they are computed (engine/kv_press.py; the
prompt is never taken from the prefix cache, whose queries were never seen). Per KV head: the
attention weights summed over the queries, averaged over the query heads sharing it (GQA).

(A first version scored the prompt by its last 32 queries only: on the long-context tasks it
lost the pass key even at 25 % removal — the key's digits draw little attention from the
question, and without SnapKV's pooling their neighbours do not carry them.)"""

from __future__ import annotations

from infergen.kvcache.presses.press import PRESSES, Press
from infergen.kvcache.presses.snapkv import window_weights

RECENT = 32  # the most recent tokens, always kept
EVERY = 1 << 40  # its window: every token of the prompt


class H2O(Press):
    name = "h2o"
    description = (
        f"heavy hitters under a budget: attention accumulated from every query (prompt and "
        f"decodes); the {RECENT} most recent tokens kept; the cache stays at the prompt's kept "
        "count during decode"
    )
    window = EVERY
    budgeted = True
    recent = RECENT

    def accumulated(self, keys, queries, scale):
        tokens, kv_heads, _ = keys.shape
        heads = queries.shape[1]
        summed = window_weights(keys, queries, scale).sum(dim=1)  # [heads, tokens]
        return summed.view(kv_heads, heads // kv_heads, tokens).mean(dim=1)


PRESSES.register("h2o", H2O())
