"""Attention with low-precision operands: out = P̂ · V̂ with P = softmax(Q̂·K̂ᵀ · scale + mask).

ATTENTION_OPERANDS rows (the engine's `attention` option) replace the attention core
(F.scaled_dot_product_attention's signature) in both the prefill and the decode path:
  "fp8_e4m3"  Q̂: each (token, head) query row in E4M3 with a dynamic scale amax / 448;
              K̂, V̂: the FP8 E4M3 KV cache's codes · per-head scales (kv_format "fp8_e4m3"
              is required: K and V are read as the cache stores them);
              P̂: the softmax probabilities in E4M3 with the static scale 1 / 448 (P ≤ 1 maps
              onto the full code range, so probabilities down to 2⁻⁹/448 keep a code),
              normalised before quantization (FlashAttention-3 quantizes the unnormalised
              exp(S − m) of a tile; one normalised tile is the same rule for a whole row).
Scores, the softmax and both products accumulate in fp32: this is the numerics of an FP8
tensor-core attention. On this CPU it runs as torch ops (no FP8 matrix units): the option shows
the accuracy, the speed is the torch path's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from infergen.ops.attention_sinks import masked_scores
from infergen.registry import Registry

E4M3_MAX = 448.0

AttentionCore = Callable[..., torch.Tensor]  # F.scaled_dot_product_attention's signature
ATTENTION_OPERANDS: Registry[AttentionCore] = Registry("attention operand format")
ATTENTION_OPERANDS.register("fp32", F.scaled_dot_product_attention)


def e4m3(x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """x rounded to E4M3 codes of x / scale (saturating), times scale."""
    y = (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return y.float() * scale


def _row_scale(x: torch.Tensor) -> torch.Tensor:
    s = x.abs().amax(dim=-1, keepdim=True) / E4M3_MAX
    return torch.where(s > 0, s, torch.ones_like(s))


@ATTENTION_OPERANDS.decorator("fp8_e4m3")
def fp8_attention(
    query: torch.Tensor,  # [batch, heads, q_len, d]
    key: torch.Tensor,  # [batch, kv_heads, k_len, d] (FP8 cache values)
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,  # bool, True = attend; broadcast to the scores
    is_causal: bool = False,  # queries are the last q_len of the k_len positions
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """[batch, heads, q_len, d] with Q and P in FP8 (see the module docstring)."""
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads != heads:
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    q = e4m3(query.float(), _row_scale(query.float()))
    scores = masked_scores(q, key.float(), attn_mask, is_causal, scale)
    p = torch.softmax(scores, dim=-1)
    p = e4m3(p, 1.0 / E4M3_MAX)
    return (p @ value.float()).to(query.dtype)
