"""The generic decoder-only transformer every architecture in arch.py is assembled into.

    h = embed(tokens)
    for each layer:  h += attn(norm(h));  h += mlp(norm(h))
    logits = lm_head(norm(h))        (lm_head = embed when embeddings are tied)

The residual add is fused into the next norm: each sublayer returns its output as a pending
`delta` and the following RMSNorm does h += delta; y = norm(h) in one op.
Only the rows in `ForwardBatch.logits_indices` go through the final norm and the LM head:
a 512-token prefill computes one row of logits, not 512.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from infergen.config import ModelConfig
from infergen.engine.forward_batch import ForwardBatch
from infergen.io.block_weight import dense
from infergen.kvcache.paged_cache import PagedKVCache
from infergen.layers.attention import Attention
from infergen.layers.linear import Linear
from infergen.layers.mlp import GatedMLP
from infergen.layers.norm import RMSNorm
from infergen.models.fused_decode import FusedDecode
from infergen.ops.rope import RopeInputs, cos_sin_cache


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, kernels: str):
        super().__init__()
        eps = config.rms_norm_eps
        self.attn_norm = RMSNorm(config.hidden_size, eps, dtype, kernels)
        self.attn = Attention(config, dtype, kernels)
        self.mlp_norm = RMSNorm(config.hidden_size, eps, dtype, kernels)
        self.mlp = GatedMLP(config, dtype, kernels)

    def forward(
        self,
        h: torch.Tensor,  # [tokens, hidden] residual stream, updated in place
        delta: torch.Tensor | None,  # previous layer's MLP output, not yet added to h
        batch: ForwardBatch,
        kv: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        attn_out = self.attn(self.attn_norm(h, delta), batch, kv)
        return self.mlp(self.mlp_norm(h, attn_out))  # the new pending delta


class Transformer(nn.Module):
    def __init__(
        self, config: ModelConfig, dtype: torch.dtype = torch.float32, kernels: str = "torch"
    ):
        super().__init__()
        self.config = config
        self.dtype = dtype
        # The LM head is a Linear; with tied embeddings it also serves the embedding lookup
        # (`rows`), so the [vocab, hidden] matrix is stored once, in the head's layout.
        self.lm_head = Linear(config.hidden_size, config.vocab_size, False, dtype, kernels)
        self.embed = (
            None
            if config.tie_word_embeddings
            else nn.Parameter(
                torch.empty(config.vocab_size, config.hidden_size, dtype=dtype), False
            )
        )
        self.layers = nn.ModuleList(
            DecoderLayer(config, dtype, kernels) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, kernels)
        self.register_buffer("rope_cache", cos_sin_cache(config), persistent=False)
        # decode steps run all layers in one native call where the layers allow it
        # (models/fused_decode.py); False forces the per-op path (tests compare the two)
        self.fused_decode = True
        self._fused_decode: FusedDecode | None = None
        # the decoder layers through the compiler (compiler/runtime.py), when the engine
        # option `compile` asks for it; used only on the cache it was built for
        self.compiled = None

    @torch.no_grad()
    def load_weights(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy checkpoint tensors (Hugging Face names, validated shapes) into the layers."""

        def get(name: str) -> torch.Tensor:
            return tensors[name]

        embed = get("model.embed_tokens.weight")
        if self.embed is None:
            self.lm_head.load(embed)
        else:
            self.embed.copy_(dense(embed))  # GGUF blocks kept by the loader: dequantized
            self.lm_head.load(get("lm_head.weight"))
        for i, layer in enumerate(self.layers):
            prefix = f"model.layers.{i}."
            layer.attn_norm.weight.copy_(get(prefix + "input_layernorm.weight"))
            layer.mlp_norm.weight.copy_(get(prefix + "post_attention_layernorm.weight"))
            layer.attn.load(get, prefix + "self_attn.")
            layer.mlp.load(get, prefix + "mlp.")
        self.norm.weight.copy_(get("model.norm.weight"))

    def _fused(self, kv_cache: PagedKVCache) -> FusedDecode:
        if self._fused_decode is None or self._fused_decode.kv_cache is not kv_cache:
            self._fused_decode = FusedDecode(self, kv_cache)
        return self._fused_decode

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, kv_cache: PagedKVCache) -> torch.Tensor:
        """Returns logits [len(batch.logits_indices), vocab] in fp32."""
        if batch.rope is None:
            batch.rope = RopeInputs(batch.positions, self.rope_cache)
        ids = batch.input_ids
        h = self.lm_head.rows(ids) if self.embed is None else self.embed.index_select(0, ids)
        # h [tokens, hidden] is a fresh tensor: the layers update it in place
        delta = None
        if self.compiled is not None and self.compiled.kv_cache is kv_cache:
            h, delta = self.compiled.run(h, batch)
        elif self.fused_decode:
            delta = self._fused(kv_cache).run(h, batch)
        if delta is None:  # the per-op path: every step the fused decode does not cover
            for i, layer in enumerate(self.layers):
                delta = layer(h, delta, batch, kv_cache.layer(i))
        rows = batch.logits_indices
        if rows.numel() == 0:  # only unfinished prefill chunks this step: nothing to sample
            return torch.empty(0, self.config.vocab_size)
        return self.head(h.index_select(0, rows), delta.index_select(0, rows))

    def head(self, h: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """Logits [rows, vocab] in fp32 of the rows h [rows, hidden] (+ their pending delta)."""
        return self.lm_head(self.norm(h, delta)).float()
