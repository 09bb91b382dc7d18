"""The KV cache tensors: per layer, K and V as [num_blocks, block_size, kv_heads, head_dim].

One allocation holds every layer: [layers, 2, num_blocks, block_size, kv_heads, head_dim].
Which blocks belong to which sequence is the block pool's business (block_pool.py).
"""

from __future__ import annotations

import torch

from infergen.config import ModelConfig


class PagedKVCache:
    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.storage = torch.zeros(
            config.num_hidden_layers,
            2,
            num_blocks,
            block_size,
            config.num_key_value_heads,
            config.head_dim,
            dtype=dtype,
        )
        # per-layer views made once: slicing costs ~15 µs per layer per step otherwise
        self._layers = [(self.storage[i, 0], self.storage[i, 1]) for i in range(len(self.storage))]

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k_cache, v_cache) of one layer, each [num_blocks, block_size, kv_heads, head_dim]."""
        return self._layers[index]

    @property
    def nbytes(self) -> int:
        return self.storage.numel() * self.storage.element_size()
