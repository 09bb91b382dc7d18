"""Self-attention layer: fused QKV projection, optional QK-norm, RoPE, paged KV cache,
causal attention (MHA / GQA / MQA by the head counts; optional sliding window), output proj.
Without QK-norm, RoPE and the KV store are one op (ops/rope_kv_store.py: one Triton kernel).

`batch` is the layer's view of the ForwardBatch (ForwardBatch.view): its cache group's slots
and attention plan (kvcache/groups.py: windowed layers have their own block tables) and its
RoPE table (Gemma-3's local layers have their own base)."""

from __future__ import annotations

import torch
from torch import nn

from infergen import profiling
from infergen.config import ModelConfig
from infergen.errors import ConfigError
from infergen.kvcache.paged_cache import KVLayer
from infergen.layers.forward_batch import ForwardBatch
from infergen.layers.linear import Linear
from infergen.layers.norm import RMSNorm
from infergen.ops import kv_store as kv_store_op
from infergen.ops import rope as rope_op
from infergen.ops import rope_kv_store as rope_kv_store_op
from infergen.ops.attention_operands import ATTENTION_OPERANDS
from infergen.ops.attention_sinks import SinkCore
from infergen.ops.kv_store import kv_store
from infergen.ops.paged_attention import (
    DECODE_BACKENDS,
    PREFILL_BACKENDS,
    decode_with,
    paged_attention,
)
from infergen.ops.paged_prefill_native import prefill_attention_native  # noqa: F401 - its row
from infergen.ops.rope import ROPE_BACKENDS
from infergen.ops.rope_kv_store import ROPE_STORE_BACKENDS
from infergen.ops.sparse_decode import QuestDecode


class Attention(nn.Module):
    prefix = "self_attn."  # checkpoint name of the layer's attention tensors

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        backend: str = "torch",
        group: int = 0,  # the layer's KV cache group (ForwardBatch.view)
        rope_index: int = 0,  # the layer's RoPE table (ForwardBatch.view)
    ):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.scale = config.attention_scale
        self.group, self.rope_index = group, rope_index
        h = config.hidden_size
        # Qwen3-Next's output gate: q_proj's per-head gate rows, kept after v ([q; k; v; gate])
        self.gated = config.arch.attention_output_gate
        out = self.q_size * (2 if self.gated else 1) + 2 * self.kv_size
        self.qkv = Linear(h, out, config.qkv_bias, dtype, backend)
        self.rotary_dim = config.rotary_dim  # < head_dim: RoPE on the first dims only
        self.o = Linear(self.q_size, h, config.o_bias, dtype, backend)
        eps = config.rms_norm_eps
        self.q_norm = RMSNorm(self.head_dim, eps, dtype, backend) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps, dtype, backend) if config.qk_norm else None
        self.rope = ROPE_BACKENDS.get(backend, where="kernels", fallback="torch")
        self.rope_store = ROPE_STORE_BACKENDS.get(backend, where="kernels", fallback="torch")
        self.decode = DECODE_BACKENDS.get(backend, where="kernels", fallback="torch")
        self.decode_row = self.decode  # (the row itself, without a core bound)
        # a row that cannot serve a layer (an encoded KV format, another `core`) runs torch's
        self.prefill = PREFILL_BACKENDS.get(backend, where="kernels", fallback="torch")
        self.core = ATTENTION_OPERANDS.get("fp32")  # the attention core (prefill and decode)
        self.summary = None  # per-block key bounds, kept for sparse decode (use_sparse_decode)
        self.sinks = None
        if config.arch.attention_sinks:  # learned per-head sink logits (ops/attention_sinks.py)
            self.sinks = nn.Parameter(torch.zeros(self.num_heads, dtype=dtype), False)
            self._bind_sinks()

    def _bind_sinks(self) -> None:
        """The attention core reading the sink logits (made again when the module moves to
        another device, `_apply`): prefill's, and decode's through the decode rows that take
        a core (the native kernel reads the sinks itself; other rows run torch's)."""
        self.core = SinkCore(self.sinks)
        self.decode = decode_with(self.decode_row, self.core)

    def _apply(self, fn, *args, **kwargs):
        module = super()._apply(fn, *args, **kwargs)
        if self.sinks is not None:  # the views in the cores still point at the old tensor
            self._bind_sinks()
        return module

    def use_sparse_decode(self, summary, top_k_blocks: int, keep_first: int) -> None:
        """Decode through Quest-style block selection (ops/sparse_decode.py) on `summary`."""
        if self.sinks is not None:
            raise ConfigError(
                "sparse decode does not support attention sinks yet",
                where="sparse_decode_blocks",
                found=top_k_blocks,
                expected="None for a model with learned sink logits",
            )
        self.summary = summary
        self.decode = QuestDecode(summary, top_k_blocks, keep_first)

    def set_operands(self, name: str) -> None:
        """Attention operands in another format (ops/attention_operands.py): both paths run
        that core (the native decode kernel computes fp32 operands only)."""
        if self.sinks is not None:
            raise ConfigError(
                "low-precision attention operands do not support attention sinks yet",
                where="attention",
                found=name,
                expected="None for a model with learned sink logits",
            )
        self.core = ATTENTION_OPERANDS.get(name, where="attention")
        self.decode = decode_with(self.decode_row, self.core)

    def forward(
        self,
        x: torch.Tensor,  # [tokens, hidden]
        batch: ForwardBatch,
        kv: KVLayer,
    ) -> torch.Tensor:
        tokens, heads, dim = x.shape[0], self.num_heads, self.head_dim
        rope, slots = batch.rope, batch.slot_mapping
        qkv = self.qkv(x)  # [tokens, q_size + 2·kv_size (+ q_size gate)]
        kv_end = self.q_size + 2 * self.kv_size
        v = qkv[:, self.q_size + self.kv_size : kv_end].view(tokens, self.num_kv_heads, dim)
        if self.q_norm is None:  # q and k are adjacent: rotated as one tensor, k, v stored
            qk = qkv[:, : self.q_size + self.kv_size].view(tokens, -1, dim)
            if profiling.enabled():
                with rope_kv_store_op.region(qk, v, kv):
                    q, k = self.rope_store(qk, v, heads, rope, kv, slots, self._rope)
            else:
                q, k = self.rope_store(qk, v, heads, rope, kv, slots, self._rope)
        else:
            q = self.q_norm(qkv[:, : self.q_size].view(tokens, heads, dim))
            k = self.k_norm(qkv[:, self.q_size : self.q_size + self.kv_size].view(tokens, -1, dim))
            if profiling.enabled():
                with rope_op.region(q):
                    q = self._rope(q, rope)
                with rope_op.region(k):
                    k = self._rope(k, rope)
                with kv_store_op.region(k, v, kv.k, kv.v):
                    kv_store(k, v, kv.k, kv.v, slots, kv)
            else:
                q, k = self._rope(q, rope), self._rope(k, rope)
                kv_store(k, v, kv.k, kv.v, slots, kv)
        if self.summary is not None:  # sparse decode's per-block key bounds
            self.summary.update(k, slots, kv.k.shape[1])
        out = paged_attention(
            q, k, v, kv.k, kv.v, batch.attn_plan, self.scale, self.decode, kv, self.core, slots,
            self.prefill,
        ).view(tokens, self.q_size)  # fmt: skip
        if self.gated:
            out = out * torch.sigmoid(qkv[:, kv_end:])
        return self.o(out)

    def queries(self, x: torch.Tensor, rope) -> torch.Tensor:
        """The queries [tokens, heads, head_dim] of normed inputs x [tokens, hidden] at the
        positions of `rope` (after QK-norm and RoPE), as forward computes them: what a KV
        press's observation window reads (engine/kv_press.py), without touching the cache."""
        tokens = x.shape[0]
        q = self.qkv(x)[:, : self.q_size].reshape(tokens, self.num_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        return self._rope(q.contiguous(), rope)

    def _rope(self, x: torch.Tensor, rope) -> torch.Tensor:
        """RoPE on x [tokens, heads, head_dim], on its first rotary_dim dims when partial."""
        if self.rotary_dim == self.head_dim:
            return self.rope(x, rope)
        rotated = self.rope(x[..., : self.rotary_dim].contiguous(), rope)
        return torch.cat([rotated, x[..., self.rotary_dim :]], dim=-1)

    def load(self, get: callable, prefix: str, norm_offset: float = 0.0) -> None:
        names = ("q_proj", "k_proj", "v_proj")
        qkv_bias = self.qkv.has_bias
        weights = [get(f"{prefix}{n}.weight") for n in names]
        if self.gated:  # q_proj rows per head are [query, gate]: split, the gates last
            per_head = weights[0].reshape(self.num_heads, 2, self.head_dim, -1)
            query, gate = per_head[:, 0].flatten(0, 1), per_head[:, 1].flatten(0, 1)
            weights = [query, *weights[1:], gate]
        self.qkv.load(
            Linear.fused(weights),
            Linear.fused([get(f"{prefix}{n}.bias") for n in names]) if qkv_bias else None,
        )
        self.o.load(
            get(prefix + "o_proj.weight"), get(prefix + "o_proj.bias") if self.o.has_bias else None
        )
        if self.q_norm is not None:
            self.q_norm.weight.copy_(get(prefix + "q_norm.weight") + norm_offset)
            self.k_norm.weight.copy_(get(prefix + "k_norm.weight") + norm_offset)
        if self.sinks is not None:
            self.sinks.copy_(get(prefix + "sinks"))
