"""The KV cache tensors: per layer, K and V as [num_blocks, block_size, kv_heads, head_dim].

One allocation holds every layer: [group_size, 2, num_blocks, block_size, kv_heads, head_dim]
(groups.py: a block is a page shared by the `group_size` layers of one cache group; a model
whose layers attend alike has one group of all layers), in the engine dtype or in a KV
format's codes (kv_format.py) with one fp32 scale per (layer, K/V, KV head) in `scales`
[layers, 2, kv_heads] (NaN until calibrated) and the keys' stored shift `k_shift`
[layers, kv_heads, head_dim] (kv_format.py).
Which blocks belong to which sequence is the block pool's business (block_pool.py).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from infergen.config import ModelConfig
from infergen.errors import ConfigError
from infergen.kvcache.block_summary import BlockSummary
from infergen.kvcache.groups import cache_groups
from infergen.kvcache.kv_blocked import BlockedKVFormat, BlockedLayer, BlockedStore
from infergen.kvcache.kv_format import KV_FORMATS, KVFormat
from infergen.kvcache.state_cache import StateCache


class KVLayer(NamedTuple):
    """One layer's cache: K and V [num_blocks, block_size, kv_heads, head_dim], and for a
    scaled format its per-head scales [kv_heads] (None: the values are stored as they are).
    A block-quantized format (kv_blocked.py) has its own store and reader: `blocked`."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    fmt: KVFormat | None = None
    k_shift: torch.Tensor | None = None  # [kv_heads, head_dim]: keys are stored minus this
    blocked: BlockedLayer | None = None
    summary: BlockSummary | None = None  # per-block key min / max (sparse decode)


class PagedKVCache:
    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        kv_format: str | None = None,
        tail_slots: int = 0,  # block-quantized formats: blocks filled at once (running seqs)
        state_layers: dict | None = None,  # recurrent layers: {layer: {name: (shape, dtype)}}
        state_slots: int = 0,  # sequences whose recurrent state is held at once
        summaries: bool = False,  # keep per-block key summaries (sparse decode)
    ):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype  # what readers compute in
        self.kv_format = kv_format
        self.format = KV_FORMATS.get(kv_format, where="kv_format") if kv_format else None
        layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
        self.groups = cache_groups(config)
        # layer → its index inside its group (the page's layer slot)
        slot = {layer: j for group in self.groups for j, layer in enumerate(group.layers)}
        # the recurrent layers' per-sequence states (state_cache.py), None without any
        self.states = StateCache(state_layers, state_slots) if state_layers else None
        planes, heads, dim = config.cache_shape  # MLA: one latent entry read as K and V
        if self.format is not None and state_layers:
            raise ConfigError(
                "KV formats do not support models with recurrent layers yet",
                where="kv_format",
                found=kv_format,
                expected=f"none for {config.architecture}",
            )
        if self.format is not None and planes == 1:
            raise ConfigError(
                "KV formats do not support latent (MLA) caches yet",
                where="kv_format",
                found=kv_format,
                expected=f"none for {config.architecture}",
            )
        self.summaries: list[BlockSummary] = []
        self.blocked: BlockedStore | None = None
        if isinstance(self.format, BlockedKVFormat):
            if any(group.window for group in self.groups) or state_layers:
                raise ConfigError(
                    "block-quantized KV formats do not support sliding-window or recurrent "
                    "layers yet",
                    where="kv_format",
                    found=kv_format,
                    expected="a per-head scaled format (e.g. fp8_e4m3) or none",
                )
            self.blocked = BlockedStore(
                self.format, layers, num_blocks, block_size, kv_heads, config.head_dim,
                max(tail_slots, 1),
            )  # fmt: skip
            self.storage = self.scales = self.k_shift = None
            self.format = None  # (no per-head scales: KVLayer.fmt stays None)
            self._layers = [
                KVLayer(self.blocked.tail[i, 0], self.blocked.tail[i, 1],
                        blocked=BlockedLayer(self.blocked, i))
                for i in range(layers)
            ]  # fmt: skip
            return
        self.storage = torch.zeros(
            len(self.groups[0].layers) if self.groups else 0,
            planes,
            num_blocks,
            block_size,
            heads,
            dim,
            dtype=self.format.storage if self.format else dtype,
        )
        self.scales = self.k_shift = None
        if self.format is not None:
            self.scales = torch.full((layers, 2, kv_heads), float("nan"))
            self.k_shift = torch.zeros(layers, kv_heads, config.head_dim)
        # per-layer views made once: slicing costs ~15 µs per layer per step otherwise
        self._layers = [
            self.states.layer(i)
            if i not in slot
            else (KVLayer(self.storage[slot[i], 0], self.storage[slot[i], planes - 1]),
                  self.states.layer(i))  # attention beside an SSM (Falcon-H1)
            if self.states is not None and i in self.states.states
            else KVLayer(self.storage[slot[i], 0], self.storage[slot[i], planes - 1])
            if self.format is None
            else KVLayer(
                self.storage[slot[i], 0], self.storage[slot[i], 1], self.scales[i, 0],
                self.scales[i, 1], self.format, self.k_shift[i],
            )
            for i in range(layers)
        ]  # fmt: skip
        if summaries:
            if planes == 1 or self.blocked is not None:
                raise ConfigError(
                    "sparse decode needs per-head K and V blocks",
                    where="sparse_decode_blocks",
                    found=config.architecture,
                    expected="a model with multi-head / grouped-query attention",
                )
            self._add_summaries(config)

    def _add_summaries(self, config: ModelConfig) -> None:
        """Per KV layer, each block's key min / max (kvcache/block_summary.py)."""
        heads, dim = config.num_key_value_heads, config.head_dim
        for i, layer in enumerate(self._layers):
            if isinstance(layer, KVLayer):
                summary = BlockSummary(self.num_blocks, heads, dim)
                self._layers[i] = layer._replace(summary=summary)
                self.summaries.append(summary)

    def block_allocated(self, block: int) -> None:
        """The pool handed `block` to a sequence: its key summaries start empty."""
        for summary in self.summaries:
            summary.reset([block])

    def layer(self, index: int) -> KVLayer | dict[str, torch.Tensor]:
        """One layer's K / V cache (and scales), or a recurrent layer's state tensors."""
        return self._layers[index]

    def begin_step(self, slot_mapping: torch.Tensor) -> None:
        """Before a forward writing `slot_mapping` (block-quantized formats plan the step)."""
        if self.blocked is not None:
            self.blocked.begin_step(slot_mapping)

    def block_freed(self, block: int) -> None:
        """The block pool let `block` go (its partial contents are dropped)."""
        if self.blocked is not None:
            self.blocked.block_freed(block)

    @property
    def nbytes(self) -> int:
        if self.blocked is not None:
            return self.blocked.nbytes
        scales = self.scales.numel() * 4 + self.k_shift.numel() * 4 if self.format else 0
        states = self.states.nbytes if self.states is not None else 0
        summaries = sum(s.data.numel() * s.data.element_size() for s in self.summaries)
        return self.storage.numel() * self.storage.element_size() + scales + states + summaries
