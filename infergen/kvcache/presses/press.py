"""The KV press interface (issue 25): a rule that scores each cached token of a sequence per
layer and KV head, so that the lowest-scored ones can leave the cache and their blocks go back
to the pool (engine/kv_press.py runs them; compact.py moves the kept tokens together).

A press runs when a sequence's prefill ends (its prompt computed); a budgeted one (H2O) also
during decode, holding the sequence at the prompt's kept count. `window` > 0: it reads the
queries of the last `window` computed tokens (post-RoPE, every query head), captured during
the prefill (query-aware presses: SnapKV); 0: the keys alone (query-agnostic: the scores do
not depend on what is asked next, so the kept cache stays good for any later question).

`scores(keys, queries, scale)` → [kv_heads, tokens]: higher is kept. Each KV head keeps the
same number of tokens (`kept_count`), its own best (GQA-aware: a KV head's score pools the
query heads that read it), so every head's kept tokens fill the same slots 0..kept-1.
"""

from __future__ import annotations

import math

import torch

from infergen.registry import Registry


class Press:
    """A PRESSES row: `scores` decides which tokens each KV head keeps."""

    name: str = ""
    description: str = ""
    window: int = 0  # queries of the last `window` tokens it reads (0: query-agnostic)
    # keeps evicting during decode, holding the sequence at its prompt's kept count (H2O):
    # `accumulated` scores, the `recent` last tokens always kept
    budgeted: bool = False
    recent: int = 0
    # per-layer budgets (PyramidKV): the cache is built in groups of at most this many layers
    # (kvcache/groups.py; engine-wide kv_press only), and `shares` says each group's share
    group_layers: int | None = None
    # scores from a second pass over the prompt (KVzip: `instruction`, then the prompt read
    # again `chunk` tokens at a time; `reread_scores`), engine/kv_reread.py
    rereads: bool = False
    instruction: str = ""
    chunk: int = 0

    def scores(
        self,
        keys: torch.Tensor,  # [tokens, kv_heads, head_dim] fp32, the sequence's cached keys
        queries: torch.Tensor | None,  # [window, heads, head_dim] fp32 (window > 0), else None
        scale: float,  # the attention's softmax scale
        layer: int,  # the layer's index (a press may vary by layer)
    ) -> torch.Tensor:  # [kv_heads, tokens] fp32: higher is kept
        """(A budgeted press is ranked by its `accumulated` scores instead, a re-reading one
        by `reread_scores`.)"""
        raise NotImplementedError

    def shares(self, groups: int) -> list[float]:
        """Each of `groups` full-attention cache groups' kept count, as a multiple of the
        press's (lowest layers first; their mean is 1): the same everywhere but PyramidKV."""
        return [1.0] * groups

    def accumulated(
        self,
        keys: torch.Tensor,  # [tokens, kv_heads, head_dim] fp32, the cached keys
        queries: torch.Tensor,  # [m, heads, head_dim] fp32: the last m tokens' queries
        scale: float,
    ) -> torch.Tensor:  # [kv_heads, tokens] fp32: what these queries add to each score
        """A budgeted press's score increments (summed over steps by engine/kv_press.py)."""
        raise NotImplementedError


PRESSES: Registry[Press] = Registry("KV press")


def kept_count(tokens: int, ratio: float, share: float = 1.0) -> int:
    """Tokens each KV head keeps of `tokens` when the press removes `ratio` of them (at least
    one: the last token's key, at most all); `share`: that count's multiple (per-layer
    budgets)."""
    return min(tokens, max(1, round(share * (tokens - math.floor(tokens * ratio)))))


def kept_positions(scores: torch.Tensor, keep: int) -> torch.Tensor:
    """[kv_heads, keep] int64: each KV head's `keep` best-scored positions (ties: the later
    position first), ascending — the order they keep in the compacted cache."""
    last = scores.shape[-1] - 1
    ranked = torch.sort(scores.flip(-1), dim=-1, descending=True, stable=True).indices
    return (last - ranked[..., :keep]).sort(dim=-1).values
