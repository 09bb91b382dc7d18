"""Multi-token-prediction (MTP) layers: the extra layers some checkpoints carry beside the
decoder to predict a token further ahead (DeepSeek-V3, §2.2 of its report); the `mtp`
speculative proposer drafts with them (engine/spec/mtp.py).

Layer j of the checkpoint's `num_nextn_predict_layers` is stored as decoder layer N + j (N the
decoder's layers) plus its own parts. At position i it reads the target's final hidden state
h_i (after the final norm) and the embedding of the token at i + 1, and predicts the token at
i + 2:

    x   = eh_proj([enorm(embed(t[i+1])) ; hnorm(h_i)])     (the embedding zeroed at position 0)
    out = x + block(x)                                      (a decoder layer: attention + MLP)
    logits = head(norm(out))                                (shared_head.norm / shared_head.head)

The block attends over its own KV of positions ≤ i: an MTP layer keeps a KV cache of its own.
Drafting further ahead feeds `out` back as the next position's h (as vLLM and SGLang do). The
embedding is the target's (the copy DeepSeek-V3 stores per MTP layer is the same tensor).
"""

from __future__ import annotations

import torch
from torch import nn

from infergen.config import ModelConfig
from infergen.errors import ConfigError
from infergen.layers.forward_batch import ForwardBatch
from infergen.layers.linear import Linear
from infergen.layers.norm import RMSNorm
from infergen.models.tensor_names import MTP_ARCHITECTURES
from infergen.models.transformer import DecoderLayer


class MTPLayer(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, kernels: str, index: int):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.enorm = RMSNorm(h, eps, dtype, kernels)
        self.hnorm = RMSNorm(h, eps, dtype, kernels)
        self.eh_proj = Linear(2 * h, h, False, dtype, kernels)
        # the decoder layer N + j: its MLP dense or experts as the config says of that index
        self.block = DecoderLayer(config, dtype, kernels, index)
        self.norm = RMSNorm(h, eps, dtype, kernels)
        self.head = Linear(h, config.vocab_size, False, dtype, kernels)

    def forward(
        self,
        embeds: torch.Tensor,  # [rows, hidden] embeddings of the tokens at i + 1 (updated)
        hidden: torch.Tensor,  # [rows, hidden] h_i: the target's final hidden state, or out
        batch: ForwardBatch,  # the rows at positions i, over this layer's own KV cache
        kv: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """`out` [rows, hidden]: the layer's output before its head's norm (module docstring)."""
        embeds[batch.positions == 0] = 0
        x = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(hidden)], dim=-1))
        delta = self.block(x, None, batch, kv)  # x becomes the residual stream
        return x.add_(delta)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Logits [rows, vocab] in fp32 of outputs `out`."""
        return self.head(self.norm(out)).float()

    def load(self, get: callable, prefix: str, norm_offset: float, mlp_norm: str) -> None:
        for norm, name in ((self.enorm, "enorm"), (self.hnorm, "hnorm"),
                           (self.norm, "shared_head.norm")):  # fmt: skip
            norm.weight.copy_(get(f"{prefix}{name}.weight") + norm_offset)
        self.eh_proj.load(get(prefix + "eh_proj.weight"))
        self.head.load(get(prefix + "shared_head.head.weight"))
        self.block.load(get, prefix, norm_offset, mlp_norm)


def mtp_layers(config: ModelConfig, dtype: torch.dtype, kernels: str) -> nn.ModuleList:
    """The checkpoint's first MTP layer, to be loaded with the weights (Transformer.mtp): it
    drafts at every depth (DeepSeek-V3 carries one; further layers would need KV caches fed by
    the previous layer's outputs at every position); a clear error when the model has none."""
    if not config.mtp_layers or config.architecture not in MTP_ARCHITECTURES:
        raise ConfigError(
            "speculative='mtp' drafts with the checkpoint's multi-token-prediction layers, "
            "and this model has none",
            where="speculative",
            found=f"{config.architecture} with {config.mtp_layers} MTP layers",
            expected=f"a {' / '.join(MTP_ARCHITECTURES)} checkpoint with "
            "num_nextn_predict_layers ≥ 1 (or another proposer)",
        )
    return nn.ModuleList([MTPLayer(config, dtype, kernels, config.num_hidden_layers)])


def mtp_cache_config(config: ModelConfig) -> ModelConfig:
    """The config whose KV cache holds the first MTP layer's KV (one full-attention layer, the
    decoder's cache shape): the `mtp` proposer's cache."""
    return config.replace(num_hidden_layers=1, layer_types=())
