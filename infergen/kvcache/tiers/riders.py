"""`Riders`: other paged KV caches whose blocks travel with the pool's blocks through the KV
tiers (issue 24: the `mtp` proposer's layer keeps a KV cache of its own, with the target's
block ids; engine/spec/mtp.py).

A rider's block b holds its KV for the positions of the pool's block b. Without it in the
tiers, a prefix block saved below and loaded back into another pool block would find there
whatever that block held before: stale KV for the rider, hence worse drafts (never wrong
outputs). With riders, what a tier stores for a block is one flat uint8 tensor:

    [the codec's encoding of the pool's page | rider 1's page as it stores it | …]

each part starting at a multiple of ALIGN bytes (so that each is viewed back in its own
dtype where it lies, on the pool's device). The riders' pages are kept as their caches
store them: the offload format (compact.py) encodes the pool's page only.
"""

from __future__ import annotations

import math

import torch

from infergen.errors import ConfigError
from infergen.kvcache.paged_cache import PagedKVCache

ALIGN = 16  # bytes: every part's offset (the widest element a part may be viewed as)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


class Riders:
    def __init__(self, pool: PagedKVCache, encoded: torch.Tensor, riders: list[PagedKVCache]):
        """`encoded`: the codec's encoding of one of the pool's pages (its shape and dtype
        are every stored page's); `riders`: caches with the pool's blocks (checked)."""
        for rider in riders:
            if (rider.num_blocks, rider.block_size) != (pool.num_blocks, pool.block_size):
                raise ConfigError(
                    "a cache carried through the KV tiers must have the pool's blocks",
                    where="kv_offload",
                    found=f"{rider.num_blocks} blocks of {rider.block_size} tokens",
                    expected=f"{pool.num_blocks} blocks of {pool.block_size} tokens",
                )
        self.caches = riders
        pages = [rider.page(0) for rider in riders]  # (a format whose pages cannot move: raises)
        self.parts = [(encoded.shape, encoded.dtype)] + [(p.shape, p.dtype) for p in pages]
        sizes = [math.prod(shape) * dtype.itemsize for shape, dtype in self.parts]
        self.offsets = [0]
        for size in sizes[:-1]:
            self.offsets.append(self.offsets[-1] + _aligned(size))
        self.sizes = sizes
        self.nbytes = self.offsets[-1] + sizes[-1]  # what a tier stores per block

    def pack(self, encoded: torch.Tensor, block: int) -> torch.Tensor:
        """The flat uint8 tensor of `encoded` (the pool's page of `block`, encoded) and each
        rider's page of `block`, on the pool's device (module docstring)."""
        flat = torch.zeros(self.nbytes, dtype=torch.uint8, device=encoded.device)
        parts = [encoded] + [rider.page(block) for rider in self.caches]
        for part, offset, size in zip(parts, self.offsets, self.sizes, strict=True):
            flat[offset : offset + size] = part.reshape(-1).view(torch.uint8)
        return flat

    def unpack(self, stored: torch.Tensor, block: int) -> torch.Tensor:
        """`pack`'s tensor (where the pool lives): each rider's page written into its `block`;
        returns the pool's encoded page (for the codec to decode)."""
        views = [
            stored[offset : offset + size].view(dtype).view(shape)
            for (shape, dtype), offset, size in zip(
                self.parts, self.offsets, self.sizes, strict=True
            )
        ]
        for rider, page in zip(self.caches, views[1:], strict=True):
            rider.write_block(block, page)
        return views[0]
