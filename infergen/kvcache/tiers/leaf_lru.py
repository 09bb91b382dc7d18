"""`LeafLRU`: the eviction order of a tier — least recently used first, but only leaves.

Entries are blocks of prefix chains: an entry's parent is the block before it in its chain.
An entry that is some stored entry's parent is not evicted while that child remains, so no
prefix is lost while a longer entry that depends on it is kept (a chain is reachable only from
its start: without its parent a child would be dead weight). A child may arrive before its
parent (the pool evicts a sequence's last blocks first): the parent is protected from then on.

Leaves wait in a heap of (last use, key); an item made stale by a later use or by a new child
is skipped when it comes up, and the heap is rebuilt when stale items pile up.
"""

from __future__ import annotations

import heapq


class LeafLRU:
    def __init__(self) -> None:
        self._tick = 0
        self._used: dict[bytes, int] = {}  # stored key → its last use (larger: more recent)
        self._parent: dict[bytes, bytes | None] = {}
        self._children: dict[bytes, set[bytes]] = {}  # key → stored (or arriving) children
        self._leaves: list[tuple[int, bytes]] = []

    def __contains__(self, key: bytes) -> bool:
        return key in self._used

    def __len__(self) -> int:
        return len(self._used)

    def parent_of(self, key: bytes) -> bytes | None:
        """The stored entry's parent key (None for a chain's first block)."""
        return self._parent.get(key)

    def link(self, key: bytes, parent: bytes | None) -> None:
        """`key` is arriving under `parent`: the parent is no leaf from now on (call before
        making room for `key`, so the parent is never evicted for it)."""
        if parent is not None:
            self._children.setdefault(parent, set()).add(key)

    def unlink(self, key: bytes, parent: bytes | None) -> None:
        """`key` is not stored under `parent` (any more); the parent may be a leaf again."""
        siblings = self._children.get(parent) if parent is not None else None
        if siblings is not None:
            siblings.discard(key)
            if not siblings:
                del self._children[parent]
                self._push_if_leaf(parent)

    def add(self, key: bytes, parent: bytes | None) -> None:
        """`key` is stored now (linked under `parent` already by `link`)."""
        self._parent[key] = parent
        self.touch(key)

    def touch(self, key: bytes) -> None:
        """`key` was used now."""
        self._tick += 1
        self._used[key] = self._tick
        self._push_if_leaf(key)

    def remove(self, key: bytes) -> None:
        """`key` is gone (evicted, corrupt, deleted)."""
        self._used.pop(key, None)
        self.unlink(key, self._parent.pop(key, None))

    def victim(self) -> bytes | None:
        """The least recently used stored leaf; None when there is none."""
        while self._leaves:
            tick, key = self._leaves[0]
            if self._used.get(key) == tick and not self._children.get(key):
                return key
            heapq.heappop(self._leaves)
        return None

    def _push_if_leaf(self, key: bytes) -> None:
        used = self._used.get(key)
        if used is None or self._children.get(key):
            return
        heapq.heappush(self._leaves, (used, key))
        if len(self._leaves) > 2 * len(self._used) + 64:  # rebuild without the stale items
            self._leaves = [(t, k) for k, t in self._used.items() if not self._children.get(k)]
            heapq.heapify(self._leaves)
