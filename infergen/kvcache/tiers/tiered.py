"""`KVTiers`: the tiers below one paged KV cache, in order (host, then disk), and the two
moves between them and the pool (issue 23, items 1–2):

- `save(block, key, parent)`: a block the pool evicts (write-back) — its contents copied to
  the first tier that takes it (one too small for it passes it on), which spills its own
  least recently used leaves to the next; with write-through (`save_through`), every block
  is copied to every tier as it is registered, so the disk tier holds whole prefixes;
- `load(key, block)`: a prefix block found in a tier copied into a pool block (the first tier
  holding it serves it; a tier that finds its copy corrupt answers None and the block is
  recomputed instead).

Load or recompute (`worth_loading`): a hit is loaded only when reading its blocks from the
tier is expected to take less time than recomputing their tokens — the tier's measured read
bandwidth (bytes / seconds of its `get`s so far; loaded while nothing is measured) against the
engine's measured prefill cost per token (`recompute_seconds_per_token`, set by the engine from
its step costs; None: not measured yet → load). Each decision is counted.

Keys are the scheduler's prefix-cache keys (chained block hashes, kvcache/prefix.py); a key's
parent is the previous block of its chain. A block's contents are one page of the cache
(PagedKVCache.block_data: every layer of its cache group, K and V, in the storage dtype),
encoded by the cache's offload format before the tiers get it (`codec`, compact.py: as stored,
or FP8 codes with per-block scales) and decoded into the pool's dtype when it comes back. The
encoding runs where the pool lives (on a GPU, fewer bytes cross to the host); the copies
between the pool's device and the host tier are the cache's `copies` (copies.py: pinned
memory on a side stream on a GPU, the compute stream waiting on events for what it reads).
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from infergen.kvcache.paged_cache import PagedKVCache
from infergen.kvcache.tiers.compact import AS_STORED, AsStored, ScaledBlocks
from infergen.kvcache.tiers.copies import HostCopies, host_copies


class KVTier(Protocol):
    name: str
    budget_bytes: int
    stats: dict[str, int]

    def __contains__(self, key: bytes) -> bool: ...
    def put(self, key: bytes, parent: bytes | None, data: torch.Tensor) -> bool: ...
    def get(self, key: bytes) -> torch.Tensor | None: ...


class KVTiers:
    def __init__(
        self,
        kv_cache: PagedKVCache,
        tiers: list[KVTier],
        write_through: bool = False,
        codec: AsStored | ScaledBlocks = AS_STORED,  # how the tiers store a block (compact.py)
        copies: HostCopies | None = None,  # None: the cache device's (shared with a host tier)
    ):
        self.kv_cache = kv_cache
        self.tiers = tiers
        self.write_through = write_through  # save blocks as they are registered, too
        page = kv_cache.block_data(0)  # a KV format the tiers cannot move: ConfigError
        self._page = (page.shape, page.dtype)  # what a stored block decodes to
        self.codec = codec
        codec.check(kv_cache)
        self.copies = copies if copies is not None else _shared_copies(kv_cache, tiers)
        if any(getattr(tier, "copies", self.copies) is not self.copies for tier in tiers):
            raise ValueError("a host tier must share its cache's KVTiers copies (one stream)")
        self.block_bytes = codec.stored_bytes(*self._page)  # bytes a tier holds per block
        self.saved = self.loaded = 0  # blocks moved down / brought back
        self.states_saved = self.states_loaded = 0  # recurrent-state checkpoints, likewise
        self.decisions = {"load": 0, "recompute": 0}  # hits loaded vs recomputed (cost rule)
        self.recompute_seconds_per_token: float | None = None  # the engine's measured prefill
        self._read = {tier.name: [0, 0.0] for tier in tiers}  # bytes, seconds of gets

    def __contains__(self, key: bytes) -> bool:
        return any(key in tier for tier in self.tiers)

    def save(self, block: int, key: bytes, parent: bytes | None) -> None:
        """The pool is about to reuse `block` (holding `key`): keep its contents below, in
        the first tier that takes it (unless a tier holds it already: written through)."""
        if not self.tiers or key in self:
            return
        data = self._stored(block)
        if any(tier.put(key, parent, data) for tier in self.tiers):
            self.saved += 1

    def save_through(self, block: int, key: bytes, parent: bytes | None) -> None:
        """`block` was just computed and registered: a copy into every tier (the disk tier
        too, so whole prefixes outlive a restart)."""
        missing = [tier for tier in self.tiers if key not in tier]
        if not missing:
            return
        data = self._stored(block)
        if sum(tier.put(key, parent, data) for tier in missing):
            self.saved += 1

    def load(self, key: bytes, block: int) -> bool:
        """Copy `key`'s contents into pool block `block`; False when no tier has a good copy."""
        for tier in self.tiers:
            if key in tier:
                start = time.perf_counter()
                data = tier.get(key)
                if data is not None:
                    page = self.codec.decode(self.copies.to_device(data), *self._page)
                    self.kv_cache.write_block(block, page)
                    read = self._read[tier.name]
                    read[0] += data.numel() * data.element_size()
                    read[1] += time.perf_counter() - start
                    self.loaded += 1
                    return True
        return False

    def save_state(self, key: bytes, data: torch.Tensor) -> None:
        """A recurrent-state checkpoint (kvcache/state_checkpoints.py) the store evicts: kept
        in the first tier that takes it, as a chain of its own (no parent)."""
        if self.tiers and key not in self and any(t.put(key, None, data) for t in self.tiers):
            self.states_saved += 1

    def load_state(self, key: bytes) -> torch.Tensor | None:
        """A spilled checkpoint's bytes (None: no tier holds a good copy)."""
        for tier in self.tiers:
            if key in tier:
                data = tier.get(key)
                if data is not None:
                    self.states_loaded += 1
                    return data
        return None

    def worth_loading(self, key: bytes, tokens: int) -> bool:
        """Whether to load `key`'s chain from here on (`tokens` tokens in tiers) rather than
        recompute it; the decision is counted."""
        tier = next((t for t in self.tiers if key in t), None)
        bytes_read, seconds = self._read[tier.name] if tier is not None else (0, 0.0)
        per_token = self.recompute_seconds_per_token
        load = tier is not None
        if load and per_token is not None and bytes_read and seconds > 0:
            blocks = tokens / self.kv_cache.block_size
            load_seconds = blocks * self.block_bytes * seconds / bytes_read
            load = load_seconds < tokens * per_token
        self.decisions["load" if load else "recompute"] += 1
        return load

    def bandwidth(self, tier: str) -> float | None:
        """The tier's measured read bandwidth in bytes / s (None before any read)."""
        bytes_read, seconds = self._read[tier]
        return bytes_read / seconds if seconds > 0 else None

    def _stored(self, block: int) -> torch.Tensor:
        """What the tiers get for pool block `block`: its page (a view where the pool
        lives: each tier copies what it keeps) encoded by the codec."""
        return self.codec.encode(self.kv_cache.storage[:, :, block])

    def stats(self) -> dict:
        """Per tier: hits, misses, puts, evictions, bytes read / written, bytes held, read
        GB/s; and the blocks saved / loaded and the load-or-recompute decisions."""
        tiers = {}
        for tier in self.tiers:
            bandwidth = self.bandwidth(tier.name)
            gb_s = None if bandwidth is None else bandwidth / 1e9
            tiers[tier.name] = dict(tier.stats, nbytes=tier.nbytes, read_gb_s=gb_s)
        return dict(tiers=tiers, saved=self.saved, loaded=self.loaded,
                    states_saved=self.states_saved, states_loaded=self.states_loaded,
                    decisions=dict(self.decisions))  # fmt: skip


def _shared_copies(kv_cache: PagedKVCache, tiers: list[KVTier]) -> HostCopies:
    """A host tier's copies (one side stream for both directions), else the device's."""
    shared = [tier.copies for tier in tiers if hasattr(tier, "copies")]
    return shared[0] if shared else host_copies(kv_cache.device)
