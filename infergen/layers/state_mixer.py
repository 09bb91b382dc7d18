"""A recurrent mixer (Mamba2 SSM, gated DeltaNet) in the decoder layer's attention seat.

The decoder layer calls every mixer as mixer(x, batch, cache_layer); for a recurrent mixer the
cache layer is its state tensors (kvcache/state_cache.py) and the batch gives each sequence's
rows, state slot and whether it starts fresh (its first step, or the first after preemption).
"""

from __future__ import annotations

import torch
from torch import nn

from infergen.config import ModelConfig
from infergen.layers.forward_batch import ForwardBatch


def _mamba(config: ModelConfig, dtype: torch.dtype, backend: str) -> nn.Module:
    from infergen.layers.ssm import Mamba2Mixer

    return Mamba2Mixer(config.ssm, dtype, backend, op_backend=backend)


def _deltanet(config: ModelConfig, dtype: torch.dtype, backend: str) -> nn.Module:
    from infergen.layers.linear_attention import GatedDeltaNet

    return GatedDeltaNet(config.linear_attention, dtype, linear_backend=backend,
                         conv_backend=backend, norm_backend=backend)  # fmt: skip


# layer type → (mixer factory, checkpoint prefix of its tensors inside the layer)
STATE_MIXERS = {"mamba": (_mamba, "mamba."), "linear_attention": (_deltanet, "linear_attn.")}


class StateMixer(nn.Module):
    group = 0  # no KV cache group, one RoPE table: the whole ForwardBatch is its view
    rope_index = 0

    def __init__(self, kind: str, config: ModelConfig, dtype: torch.dtype, backend: str):
        super().__init__()
        factory, self.prefix = STATE_MIXERS[kind]
        self.mixer = factory(config, dtype, backend)

    def state_layout(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """{state name: (per-sequence shape, dtype)}: recurrent states accumulate in fp32."""
        return {name: (shape, torch.float32) for name, shape in self.mixer.state_shapes().items()}

    def forward(
        self, x: torch.Tensor, batch: ForwardBatch, states: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        return self.mixer(x, states, batch.query_start_loc, batch.state_slots, batch.fresh)

    def load(self, get: callable, prefix: str, norm_offset: float = 0.0) -> None:
        self.mixer.load(get, prefix)


class ParallelMixer(nn.Module):
    """Attention and an SSM side by side on the same normed input, outputs summed (Falcon-H1;
    its multipliers are folded into the weights at load). Its cache layer is
    (KV cache layer, state tensors)."""

    prefix = ""

    def __init__(self, attention: nn.Module, config: ModelConfig, dtype, backend: str):
        super().__init__()
        self.attention = attention
        self.ssm = StateMixer("mamba", config, dtype, backend)
        self.group, self.rope_index = attention.group, attention.rope_index

    def state_layout(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return self.ssm.state_layout()

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: tuple) -> torch.Tensor:
        kv, states = cache
        return self.attention(x, batch, kv) + self.ssm(x, batch, states)

    def load(self, get: callable, prefix: str, norm_offset: float = 0.0) -> None:
        self.attention.load(get, prefix + self.attention.prefix, norm_offset)
        self.ssm.load(get, prefix + self.ssm.prefix)
