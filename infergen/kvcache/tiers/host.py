"""`HostTier`: KV blocks in host memory within a byte budget (issue 23, item 1).

A block is stored as a host copy of what it is given (KVTiers gives every layer's K and V of
one page, in the cache's storage dtype or encoded by kv_offload_format: compact.py). The copy
is made by the cache's `HostCopies` (copies.py): a clone on the CPU; on a GPU pinned memory
filled on a side stream, ordered against the compute stream by events. Full: least recently
used leaves go first (leaf_lru.py) — to the next tier down (`spill`: the disk tier's `put`,
after the copies in flight are complete) when there is one, else dropped.

Threads: the engine thread puts, the KV tiers' background loader may get (tiers/loader.py):
every operation holds the tier's lock (a spill holds it through the next tier's put, which
takes that tier's own lock: always host then disk, never the other way).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from infergen.kvcache.tiers.copies import CPU_COPIES, HostCopies
from infergen.kvcache.tiers.leaf_lru import LeafLRU

Spill = Callable[[bytes, bytes | None, torch.Tensor], bool]


class HostTier:
    name = "host"
    in_memory = True  # a load is a memcpy: inline while it is cheap (KVTiers.loads_inline)

    def __init__(
        self, budget_bytes: int, spill: Spill | None = None, copies: HostCopies = CPU_COPIES
    ):
        self.budget_bytes = budget_bytes
        self.spill = spill
        self.copies = copies  # how host copies are made (the cache's device: copies.py)
        self._data: dict[bytes, torch.Tensor] = {}
        self._order = LeafLRU()
        self.nbytes = 0
        self.stats = dict(hits=0, misses=0, puts=0, evictions=0, spilled=0, bytes_read=0,
                          bytes_written=0)  # fmt: skip
        self._lock = threading.Lock()

    def __contains__(self, key: bytes) -> bool:
        return key in self._data

    def put(self, key: bytes, parent: bytes | None, data: torch.Tensor) -> bool:
        """Keep a copy of `data` under `key`; False when it cannot fit the budget."""
        with self._lock:
            return self._put(key, parent, data)

    def _put(self, key: bytes, parent: bytes | None, data: torch.Tensor) -> bool:
        size = data.numel() * data.element_size()
        if key in self._data:
            self._order.touch(key)
            return True
        if size > self.budget_bytes:
            return False
        self._order.link(key, parent)  # the parent is no leaf now: never evicted for `key`
        while self.nbytes + size > self.budget_bytes:
            victim = self._order.victim()
            if victim is None:
                self._order.unlink(key, parent)
                return False
            self._evict(victim)
        self._data[key] = self.copies.to_host(data)
        self._order.add(key, parent)
        self.nbytes += size
        self.stats["puts"] += 1
        self.stats["bytes_written"] += size
        return True

    def get(self, key: bytes) -> torch.Tensor | None:
        with self._lock:
            data = self._data.get(key)
            if data is None:
                self.stats["misses"] += 1
                return None
            self._order.touch(key)
            self.stats["hits"] += 1
            self.stats["bytes_read"] += data.numel() * data.element_size()
            return data

    def discard(self, key: bytes) -> None:
        """Forget `key` (not spilled): a one-time entry that was used (a swapped-out
        sequence's partial block)."""
        with self._lock:
            data = self._data.pop(key, None)
            if data is not None:
                self._order.remove(key)
                self.nbytes -= data.numel() * data.element_size()

    def _evict(self, key: bytes) -> None:
        data = self._data.pop(key)
        parent = self._order.parent_of(key)
        self._order.remove(key)
        self.nbytes -= data.numel() * data.element_size()
        self.stats["evictions"] += 1
        if self.spill is None:
            return
        self.copies.settle()  # a GPU copy into `data` may still be in flight
        if self.spill(key, parent, data):
            self.stats["spilled"] += 1
