"""Multi-head latent attention (DeepSeek-V2/V3): the cache stores, per token, one compressed
latent c (kv_lora_rank) and one RoPE key k_pe (qk_rope_head_dim) shared by every head.

    c = norm(x·W_kv_a[:kv_lora_rank]);  k_pe = rope(x·W_kv_a[kv_lora_rank:])
    head h:  k_h = [W_uk_h·c, k_pe],  v_h = W_uv_h·c,  q_h = [q_nope_h, rope(q_pe_h)]
    out_h = softmax(q_h·k_hᵀ·scale)·v_h;  y = o_proj(out)

Decode (and any step that reads cached tokens) runs the weight-absorbed form over the latent
cache: q_nope_h·(W_uk_h·c) = (W_uk_hᵀ·q_nope_h)·c, so with q̃_h = [W_uk_hᵀ·q_nope_h, q_pe_h] the
scores are q̃_h·[c, k_pe] — an MQA over one cached "head" of kv_lora_rank + rope dims that is
also the value (the output's first kv_lora_rank dims are softmax·c; W_uv_h maps them back).
Nothing per head is ever decompressed for cached tokens. A prefill whose context is all new
runs the naive form (K and V decompressed for the new tokens only, plain MHA), which costs
less there: head_dim-sized dot products instead of kv_lora_rank-sized ones.

Checkpoints with interleaved RoPE pairs (V2; V3 with rope_interleave) have their q_pe / k_pe
projection rows reordered at load so every rotary layout is the half-split one (the dot
products are unchanged: q and k are permuted alike).

Under tensor parallelism (models/sharding.py) a rank holds a run of the query heads (their
q_proj / q_b_proj rows, kv_b_proj's W_uk_h and W_uv_h, o_proj's columns; config's
num_attention_heads is the rank's) and the whole latent path (the down-projections and their
norms). Its KV cache holds every token's full latent + RoPE key, the same entries on every
rank: each head reads the whole latent, so the cache cannot be split by head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from infergen.config import ModelConfig
from infergen.errors import ConfigError
from infergen.kvcache.paged_cache import KVLayer
from infergen.layers.forward_batch import ForwardBatch
from infergen.layers.linear import Linear
from infergen.layers.norm import RMSNorm
from infergen.ops.paged_attention import DECODE_BACKENDS, paged_attention
from infergen.ops.rope import ROPE_BACKENDS, RopeInputs


def _deinterleave(rows: int) -> torch.Tensor:
    """Row order that turns interleaved rotary pairs (x0, x1), (x2, x3)… into halves."""
    return torch.cat([torch.arange(0, rows, 2), torch.arange(1, rows, 2)])


class MLAttention(nn.Module):
    prefix = "self_attn."

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        backend: str = "torch",
        group: int = 0,
        rope_index: int = 0,
    ):
        super().__init__()
        mla, h = config.mla, config.hidden_size
        self.mla = mla
        self.num_heads = heads = config.num_attention_heads
        self.nope, self.rope_dim = mla.qk_nope_head_dim, mla.qk_rope_head_dim
        self.latent, self.v_dim = mla.kv_lora_rank, mla.v_head_dim
        self.group, self.rope_index = group, rope_index
        self.scale = config.attention_scale
        q_out = heads * (self.nope + self.rope_dim)
        eps = 1e-6  # the latent norms' epsilon is fixed, not the config's (reference code)
        kv_a = self.latent + self.rope_dim
        if mla.q_lora_rank:  # q and kv down-projections read the same x: one GEMM
            self.down = Linear(h, mla.q_lora_rank + kv_a, False, dtype, backend)
            self.q_norm = RMSNorm(mla.q_lora_rank, eps, dtype, backend)
            self.q_up = Linear(mla.q_lora_rank, q_out, False, dtype, backend)
        else:
            self.down = Linear(h, q_out + kv_a, False, dtype, backend)
            self.q_norm = self.q_up = None
        self.kv_norm = RMSNorm(self.latent, eps, dtype, backend)
        # kv_b_proj split per head: keys' nope part and values, both from the latent
        self.w_uk = nn.Parameter(torch.zeros(heads, self.nope, self.latent, dtype=dtype), False)
        self.w_uv = nn.Parameter(torch.zeros(heads, self.v_dim, self.latent, dtype=dtype), False)
        self.o = Linear(heads * self.v_dim, h, False, dtype, backend)
        self.rope = ROPE_BACKENDS.get(backend, where="kernels", fallback="torch")
        self.decode = DECODE_BACKENDS.get(backend, where="kernels", fallback="torch")

    def set_operands(self, name: str) -> None:
        raise ConfigError(
            "low-precision attention operands do not support latent attention (MLA) yet",
            where="attention",
            found=name,
            expected="None for an MLA model",
        )

    def forward(self, x: torch.Tensor, batch: ForwardBatch, kv: KVLayer) -> torch.Tensor:
        tokens, heads = x.shape[0], self.num_heads
        down = self.down(x)
        q_rows = down.shape[1] - self.latent - self.rope_dim
        if self.q_up is not None:
            q = self.q_up(self.q_norm(down[:, :q_rows].contiguous()))
        else:
            q = down[:, :q_rows]
        q = q.reshape(tokens, heads, self.nope + self.rope_dim)
        q_nope = q[..., : self.nope]
        q_pe = self.rope(q[..., self.nope :].contiguous(), batch.rope)  # [tokens, heads, r]
        latent = self.kv_norm(down[:, q_rows : q_rows + self.latent].contiguous())
        k_pe = self.rope(down[:, q_rows + self.latent :].reshape(tokens, 1, -1), batch.rope)
        entry = torch.cat([latent, k_pe[:, 0]], dim=-1)  # [tokens, latent + r]: the cache row
        kv.k.view(-1, entry.shape[1]).index_copy_(0, batch.slot_mapping, entry)
        plan = batch.attn_plan
        if plan.decode_rows is None and all(item.slots is None for item in plan.prefills):
            out = self._naive(q_nope, q_pe, latent, k_pe, plan)  # all-new contexts
        else:
            out = self._absorbed(q_nope, q_pe, entry, kv, batch)
        return self.o(out.reshape(tokens, heads * self.v_dim))

    def _absorbed(self, q_nope, q_pe, entry, kv: KVLayer, batch: ForwardBatch) -> torch.Tensor:
        """Attention over the latent cache: [tokens, heads, v_dim]."""
        q_latent = torch.einsum("thn,hnc->thc", q_nope, self.w_uk)  # [tokens, heads, latent]
        query = torch.cat([q_latent, q_pe], dim=-1)
        new = entry.unsqueeze(1)  # [tokens, 1, latent + r]: K, and V whose tail is dropped
        out = paged_attention(
            query, new, new, kv.k, kv.k, batch.attn_plan, self.scale, self.decode, None,
            new_slots=batch.slot_mapping,
        )  # fmt: skip
        return torch.einsum("thc,hvc->thv", out[..., : self.latent], self.w_uv)

    def _naive(self, q_nope, q_pe, latent, k_pe, plan) -> torch.Tensor:
        """Decompressed attention over the new tokens only: [tokens, heads, v_dim]."""
        k_nope = torch.einsum("tc,hnc->thn", latent, self.w_uk)
        values = torch.einsum("tc,hvc->thv", latent, self.w_uv)
        keys = torch.cat([k_nope, k_pe.expand(-1, self.num_heads, -1)], dim=-1)
        query = torch.cat([q_nope, q_pe], dim=-1)
        out = q_nope.new_empty(*q_nope.shape[:2], self.v_dim)
        for item in plan.prefills:
            rows = slice(item.start, item.end)
            o = F.scaled_dot_product_attention(
                query[rows].transpose(0, 1).unsqueeze(0),
                keys[rows].transpose(0, 1).unsqueeze(0),
                values[rows].transpose(0, 1).unsqueeze(0),
                attn_mask=item.mask,
                is_causal=item.mask is None,
                scale=self.scale,
            )
            out[rows] = o[0].transpose(0, 1)
        return out

    @torch.no_grad()
    def load(self, get: callable, prefix: str, norm_offset: float = 0.0) -> None:
        heads, qk = self.num_heads, self.nope + self.rope_dim
        q_name = "q_a_proj" if self.q_up is not None else "q_proj"
        q = get(f"{prefix}{q_name}.weight")
        kv_a = get(prefix + "kv_a_proj_with_mqa.weight")
        if self.mla.rope_interleave:  # rotary pairs → halves, in q's rope rows and k_pe's
            rope_rows = self.latent + _deinterleave(self.rope_dim)
            kv_a = torch.cat([kv_a[: self.latent], kv_a[rope_rows]])
        q_up = get(prefix + "q_b_proj.weight") if self.q_up is not None else None
        if self.mla.rope_interleave:
            per_head = torch.cat(
                [torch.arange(self.nope), self.nope + _deinterleave(self.rope_dim)]
            )
            order = (torch.arange(heads)[:, None] * qk + per_head).flatten()
            if q_up is not None:
                q_up = q_up[order]
            else:
                q = q[order]
        self.down.load(Linear.fused([q, kv_a]))
        if q_up is not None:
            self.q_up.load(q_up)
            self.q_norm.weight.copy_(get(prefix + "q_a_layernorm.weight") + norm_offset)
        self.kv_norm.weight.copy_(get(prefix + "kv_a_layernorm.weight") + norm_offset)
        kv_b = get(prefix + "kv_b_proj.weight").view(heads, self.nope + self.v_dim, self.latent)
        self.w_uk.copy_(kv_b[:, : self.nope])
        self.w_uv.copy_(kv_b[:, self.nope :])
        self.o.load(get(prefix + "o_proj.weight"))


def naive_reference(layer: MLAttention, x: torch.Tensor, positions: torch.Tensor, rope_table):
    """Oracle for one sequence (causal over x's tokens): every head's K and V decompressed
    from the latent, plain softmax attention in float64. Returns [tokens, hidden]."""
    tokens, heads = x.shape[0], layer.num_heads
    rope = RopeInputs(positions, rope_table)
    down = layer.down(x)
    q_rows = down.shape[1] - layer.latent - layer.rope_dim
    q = layer.q_up(layer.q_norm(down[:, :q_rows].contiguous())) if layer.q_up else down[:, :q_rows]
    q = q.reshape(tokens, heads, -1)
    q_pe = layer.rope(q[..., layer.nope :].contiguous(), rope)
    latent = layer.kv_norm(down[:, q_rows : q_rows + layer.latent].contiguous())
    k_pe = layer.rope(down[:, q_rows + layer.latent :].reshape(tokens, 1, -1).contiguous(), rope)
    keys = torch.cat([torch.einsum("tc,hnc->thn", latent, layer.w_uk),
                      k_pe.expand(-1, heads, -1)], dim=-1).double()  # fmt: skip
    values = torch.einsum("tc,hvc->thv", latent, layer.w_uv).double()
    query = torch.cat([q[..., : layer.nope], q_pe], dim=-1).double()
    scores = torch.einsum("qhd,khd->hqk", query, keys) * layer.scale
    causal = torch.ones(tokens, tokens, dtype=torch.bool).tril()
    p = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    out = torch.einsum("hqk,khv->qhv", p, values).to(x.dtype)
    return layer.o(out.reshape(tokens, -1))
