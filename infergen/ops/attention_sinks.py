"""Attention with learned sink logits (GPT-OSS): every head has one extra logit s_h that takes
part in the softmax but has no value:

    p_j = exp(q·k_j·scale) / (Σ_i exp(q·k_i·scale) + exp(s_h));   out = Σ_j p_j · v_j

so a head can put weight "nowhere" (the rows of p sum to less than 1). Same signature as
F.scaled_dot_product_attention (an attention core, ops/attention_operands.py) plus `sinks`,
broadcast against the scores' [batch, heads, q_len] axes: [1, heads, 1, 1] for prefill, and
[1, kv_heads, group, 1] for the decode path that folds the GQA group into the query axis.
Computed explicitly (scores, max-subtracted exponentials) in the inputs' dtype.
Bytes moved: as attention (K and V once), plus `heads` floats.
"""

from __future__ import annotations

import torch


def masked_scores(
    query: torch.Tensor,  # [batch, heads, q_len, d]
    key: torch.Tensor,  # [batch, kv_heads, k_len, d]
    attn_mask: torch.Tensor | None,  # bool, True = attend; broadcast to the scores
    is_causal: bool,  # queries are the last q_len of the k_len positions
    scale: float | None,
) -> torch.Tensor:
    """[batch, heads, q_len, k_len] q·kᵀ·scale with masked positions at −inf (GQA: K repeated
    over each head group)."""
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads != heads:
        key = key.repeat_interleave(heads // kv_heads, dim=1)
    scores = query @ key.transpose(-1, -2) * (scale or query.shape[-1] ** -0.5)
    q_len, k_len = scores.shape[-2], scores.shape[-1]
    if is_causal:
        q_pos = torch.arange(k_len - q_len, k_len)[:, None]
        scores = scores.masked_fill(torch.arange(k_len)[None, :] > q_pos, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return scores


def sink_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    sinks: torch.Tensor,
) -> torch.Tensor:
    """[batch, heads, q_len, d_v]: attention whose softmax has one more term exp(sinks)."""
    scores = masked_scores(query, key, attn_mask, is_causal, scale)
    sinks = sinks.to(scores.dtype).expand(*scores.shape[:-1], 1)
    top = torch.maximum(scores.amax(dim=-1, keepdim=True), sinks)
    weights = torch.exp(scores - top)
    p = weights / (weights.sum(dim=-1, keepdim=True) + torch.exp(sinks - top))
    heads, kv_heads = query.shape[1], value.shape[1]
    if kv_heads != heads:
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    return p @ value


class SinkCore:
    """An attention core (SDPA's signature) whose softmax has one more term per head, the
    head's sink logit: `sink_attention` with `sinks` [heads] laid over the query's head axes
    — [1, heads, 1, 1] for prefill's [batch, heads, q_len, d], [1, kv_heads, group, 1] for the
    decode path's [batch, kv_heads, group, d]. The native kernels read `sinks` themselves."""

    def __init__(self, sinks: torch.Tensor):
        self.sinks = sinks  # [heads]

    def __call__(self, query, key, value, attn_mask=None, is_causal=False, scale=None,
                 enable_gqa=False) -> torch.Tensor:  # fmt: skip
        sinks = self.sinks.view(1, query.shape[1], -1, 1)
        return sink_attention(
            query, key, value, attn_mask, is_causal, scale, enable_gqa, sinks=sinks
        )


def sinks_of(core) -> torch.Tensor | None:
    """The sink logits a core reads (None: a core without them)."""
    return core.sinks if isinstance(core, SinkCore) else None


def native_core(core) -> bool:
    """Whether the native attention kernels compute this core: SDPA's, or a sink core with
    fp32 sink logits (the kernels add them themselves)."""
    sinks = sinks_of(core)
    if sinks is not None:
        return sinks.dtype == torch.float32
    return core is torch.nn.functional.scaled_dot_product_attention


def reference(
    q: torch.Tensor,  # [q_len, heads, d] the last q_len positions of the context
    k: torch.Tensor,  # [k_len, kv_heads, d]
    v: torch.Tensor,  # [k_len, kv_heads, d]
    sinks: torch.Tensor,  # [heads]
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """Oracle: one query and head at a time, in float64, the sink as an extra softmax entry."""
    q_len, heads = q.shape[0], q.shape[1]
    k_len, group = k.shape[0], heads // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for t in range(q_len):
        pos = k_len - q_len + t
        lo = 0 if window is None else max(0, pos - window + 1)
        for h in range(heads):
            keys, values = (
                k[lo : pos + 1, h // group].double(),
                v[lo : pos + 1, h // group].double(),
            )
            logits = torch.cat([keys @ q[t, h].double() * scale, sinks[h : h + 1].double()])
            p = torch.softmax(logits, dim=0)[:-1]
            out[t, h] = p @ values
    return out.to(q.dtype)
