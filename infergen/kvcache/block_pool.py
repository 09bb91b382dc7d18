"""Block pool: allocation, reference counts and prefix caching of KV cache blocks.

A block is free (never hashed or hash dropped), in use (refcount > 0), or cached-idle
(refcount 0 but still holding the KV of a known chained hash). Idle cached blocks are kept in
LRU order and evicted only when no free block is left. A full block is registered under its
chained hash (prefix.py) after its KV has been written, so later requests that share the
prefix reuse it instead of recomputing.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable


class BlockPool:
    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True):
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        # a stack, block 0 on top: a freed block is handed out again first, its pages faulted
        # in and likely still in the caches (a never-used block's pages may not be yet: the
        # pool is zeroed lazily and faulted in by a background thread, kvcache/zeroed.py)
        self._free: deque[int] = deque(reversed(range(num_blocks)))
        self._idle: OrderedDict[int, None] = OrderedDict()  # refcount 0, hashed; LRU first
        self._ref = [0] * num_blocks
        self._hash: list[bytes | None] = [None] * num_blocks
        self._parent: list[bytes | None] = [None] * num_blocks  # the chain's previous key
        self._by_hash: dict[bytes, int] = {}
        self.num_evictions = 0
        # called with a block whose last reference went and whose contents are dropped (not
        # kept for prefix reuse): a block-quantized KV cache frees its fp32 tail
        self.on_free: Callable[[int], None] | None = None
        # called with each block handed out by allocate() (fresh contents: summaries reset)
        self.on_allocate: Callable[[int], None] | None = None
        # called with (block, its key, its parent's key) as an idle cached block is evicted,
        # before its contents are reused: the KV tiers keep them (kvcache/tiers/)
        self.on_evict: Callable[[int, bytes, bytes | None], None] | None = None
        # called the same way as a block is registered (its KV computed): write-through tiers
        self.on_register: Callable[[int, bytes, bytes | None], None] | None = None

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (free + idle cached)."""
        return len(self._free) + len(self._idle)

    @property
    def num_cached(self) -> int:
        return len(self._by_hash)

    def refcount(self, block: int) -> int:
        return self._ref[block]

    def key_of(self, block: int) -> bytes | None:
        """The prefix-cache key `block` is published under (None: not published)."""
        return self._hash[block]

    def allocate(self) -> int:
        """One block with refcount 1. Evicts the least recently used idle cached block when
        no free block is left. Raises RuntimeError when every block is referenced."""
        if self._free:
            block = self._free.pop()
        elif self._idle:
            block, _ = self._idle.popitem(last=False)
            if self.on_evict is not None:
                self.on_evict(block, self._hash[block], self._parent[block])
            del self._by_hash[self._hash[block]]
            self._hash[block] = None
            self.num_evictions += 1
        else:
            raise RuntimeError("KV block pool exhausted (the scheduler checks num_free first)")
        self._ref[block] = 1
        if self.on_allocate is not None:
            self.on_allocate(block)
        return block

    def release(self, blocks: list[int]) -> None:
        """Drop one reference to each block; release a sequence's blocks tail first so that its
        last blocks are evicted before its (more shareable) first ones."""
        for block in reversed(blocks):
            self._ref[block] -= 1
            assert self._ref[block] >= 0, f"block {block} released twice"
            if self._ref[block] == 0:
                if self._hash[block] is not None:
                    self._idle[block] = None
                else:
                    self._free.append(block)
                    if self.on_free is not None:
                        self.on_free(block)

    def unpublish(self, block: int) -> None:
        """Its only holder is about to overwrite `block` (a KV press compacting in place): it
        stops being a prefix-cache entry, its contents handed to `on_evict` first (the KV
        tiers keep them) as an eviction's are."""
        assert self._ref[block] == 1, f"block {block} is shared: it cannot be rewritten"
        key = self._hash[block]
        if key is None:
            return
        if self.on_evict is not None:
            self.on_evict(block, key, self._parent[block])
        del self._by_hash[key]
        self._hash[block] = self._parent[block] = None

    def lookup(self, block_hash: bytes) -> int | None:
        """The block holding this chained hash, or None."""
        if not self.enable_prefix_caching:
            return None
        return self._by_hash.get(block_hash)

    def acquire(self, block: int) -> None:
        """Take a reference to a cached block found by `lookup`."""
        if self._ref[block] == 0:
            self._idle.pop(block, None)
        self._ref[block] += 1

    def register(self, block: int, block_hash: bytes, parent: bytes | None = None) -> None:
        """Publish a full, computed block under its chained hash (first writer wins);
        `parent`: the hash of the block before it in its chain (None for the first)."""
        if not self.enable_prefix_caching or self._hash[block] is not None:
            return
        if block_hash in self._by_hash:
            return
        self._hash[block] = block_hash
        self._parent[block] = parent
        if self.on_register is not None:
            self.on_register(block, block_hash, parent)
        self._by_hash[block_hash] = block
