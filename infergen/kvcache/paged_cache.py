"""The KV cache manager: per layer, K and V as [num_blocks, block_size, kv_heads, head_dim].

The KV format (kv_protocol.py: a KV_FORMATS row, or ENGINE_DTYPE without one) allocates the
tensors: for the engine dtype and the scaled formats one allocation holds every layer,
[group_size, 2, num_blocks, block_size, kv_heads, head_dim] (groups.py: a block is a page
shared by the `group_size` layers of one cache group; a model whose layers attend alike has
one group of all layers), in the engine dtype or in the format's codes with one fp32 scale per
(layer, K/V, KV head) in `scales` [layers, 2, kv_heads] (NaN until calibrated) and the keys'
stored shift `k_shift` [layers, kv_heads, head_dim] (kv_format.py); a block-quantized format
keeps its own stores (kv_blocked.py). Recurrent layers get state slots (state_cache.py),
sparse decode per-block key summaries (block_summary.py).
Which blocks belong to which sequence is the block pool's business (block_pool.py).
"""

from __future__ import annotations

import torch

from infergen.config import ModelConfig
from infergen.errors import ConfigError
from infergen.kvcache.block_summary import BlockSummary
from infergen.kvcache.groups import cache_groups
from infergen.kvcache.kv_format import kv_format_of
from infergen.kvcache.kv_protocol import CacheLayout, KVLayer, PagedPool
from infergen.kvcache.state_cache import StateCache

__all__ = ["KVLayer", "PagedKVCache"]


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
        device: torch.device | str = "cpu",  # where every tensor of the cache lives
        spare_block: bool = False,  # one more block no sequence gets (captured decode steps)
        groups: tuple | None = None,  # the model's cache groups (None: cache_groups(config))
    ):
        self.device = torch.device(device)
        self.num_blocks = num_blocks  # blocks the pool hands out: 0 .. num_blocks - 1
        # with `spare_block`, one more block that no sequence gets: padded rows of a captured
        # decode step (models/cuda_graphs.py) write there
        self.spare_block = num_blocks if spare_block else None
        self.block_size = block_size
        self.dtype = dtype  # what readers compute in
        self.kv_format = kv_format
        self.format = kv_format_of(kv_format)  # kv_protocol.KVCacheFormat
        layers = self.num_layers = config.num_hidden_layers
        self.groups = cache_groups(config) if groups is None else tuple(groups)
        # layer → its index inside its group (the page's layer slot)
        slot = self.page_slot = {
            layer: j for group in self.groups for j, layer in enumerate(group.layers)
        }
        # the recurrent layers' per-sequence states (state_cache.py), None without any
        self.states = StateCache(state_layers, state_slots, self.device) if state_layers else None
        planes, heads, dim = config.cache_shape  # MLA: one latent entry read as K and V
        self.format.check(config, any(group.window for group in self.groups), bool(state_layers))
        self.summaries: list[BlockSummary] = []
        self.pool = self.format.allocate(
            CacheLayout(
                layers, slot, len(self.groups[0].layers) if self.groups else 0, planes,
                num_blocks + spare_block, block_size, heads, dim, dtype, tail_slots, self.device,
            )
        )  # fmt: skip
        # the paged tensor and the per-head scales (None where the format has none)
        self.storage, self.scales, self.k_shift = (
            self.pool.storage, self.pool.scales, self.pool.k_shift
        )  # fmt: skip
        self._layers = [
            self.states.layer(i)
            if i not in slot
            else (self.pool.layer(i), self.states.layer(i))  # attention beside an SSM (Falcon-H1)
            if self.states is not None and i in self.states.states
            else self.pool.layer(i)
            for i in range(layers)
        ]  # fmt: skip
        if summaries:
            if planes == 1 or not self.format.supports_sparse_decode:
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
                summary = BlockSummary(self.num_blocks, heads, dim, device=self.device)
                self._layers[i] = layer._replace(summary=summary)
                self.summaries.append(summary)

    def block_allocated(self, block: int) -> None:
        """The pool handed `block` to a sequence: its key summaries start empty."""
        for summary in self.summaries:
            summary.reset([block])

    def layer(self, index: int) -> KVLayer | dict[str, torch.Tensor]:
        """One layer's K / V cache (and scales), or a recurrent layer's state tensors."""
        return self._layers[index]

    def block_data(self, block: int) -> torch.Tensor:
        """A copy of one block's contents on the host: every layer of its page, K and V,
        [group_size, planes, block_size, heads, dim] in the storage dtype (the KV tiers'
        unit, kvcache/tiers/)."""
        return self._paged_storage()[:, :, block].to("cpu", copy=True)

    @property
    def block_bytes(self) -> int:
        """Bytes of one block's contents (what a tier stores per block)."""
        page = self._paged_storage()[:, :, 0]
        return page.numel() * page.element_size()

    def page(self, block: int) -> torch.Tensor:
        """A view of one block's contents (block_data without the copy), on the device."""
        return self._paged_storage()[:, :, block]

    @property
    def pages_movable(self) -> bool:
        """Whether blocks can be copied out and back (block_data / page): the engine-dtype and
        scaled formats; a block-quantized format keeps its own stores."""
        return isinstance(self.pool, PagedPool)

    def write_block(self, block: int, data: torch.Tensor) -> None:
        """Put contents `block_data` returned back into `block`."""
        self._paged_storage()[:, :, block].copy_(data)

    def _paged_storage(self) -> torch.Tensor:
        if not isinstance(self.pool, PagedPool):
            raise ConfigError(
                "KV offload tiers move pages of the engine-dtype or FP8 KV cache",
                where="kv_format",
                found=self.kv_format,
                expected="None or 'fp8_e4m3' with kv_offload_memory / kv_offload_dir",
            )
        return self.storage

    def begin_step(self, slot_mapping: torch.Tensor) -> None:
        """Before a forward writing `slot_mapping` (block-quantized formats plan the step)."""
        self.pool.begin_step(slot_mapping)

    def block_freed(self, block: int) -> None:
        """The block pool let `block` go (its partial contents are dropped)."""
        self.pool.block_freed(block)

    @property
    def nbytes(self) -> int:
        states = self.states.nbytes if self.states is not None else 0
        summaries = sum(s.data.numel() * s.data.element_size() for s in self.summaries)
        return self.pool.nbytes + states + summaries
