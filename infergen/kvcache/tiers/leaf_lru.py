"""`LeafLRU`: the eviction order of a tier — least recently used first, but only leaves.

Entries are blocks of prefix chains: an entry's parent is the block before it in its chain.
An entry that is some stored entry's parent is not evicted while that child remains, so no
prefix is lost while a longer entry that depends on it is kept (a chain is reachable only
from its start: without its parent a child would be dead weight).
"""

from __future__ import annotations

from collections import OrderedDict


class LeafLRU:
    def __init__(self) -> None:
        self._order: OrderedDict[bytes, None] = OrderedDict()  # least recently used first
        self._parent: dict[bytes, bytes | None] = {}
        self._children: dict[bytes, int] = {}  # key → stored entries whose parent it is

    def __contains__(self, key: bytes) -> bool:
        return key in self._order

    def __len__(self) -> int:
        return len(self._order)

    def add(self, key: bytes, parent: bytes | None) -> None:
        """A new entry (the most recently used)."""
        self._order[key] = None
        self._parent[key] = parent
        if parent is not None:
            self._children[parent] = self._children.get(parent, 0) + 1

    def touch(self, key: bytes) -> None:
        """`key` was used now (a hit); its ancestors count as used too."""
        while key is not None and key in self._order:
            self._order.move_to_end(key)
            key = self._parent[key]

    def remove(self, key: bytes) -> None:
        self._order.pop(key, None)
        parent = self._parent.pop(key, None)
        if parent is not None and parent in self._children:
            self._children[parent] -= 1
            if not self._children[parent]:
                del self._children[parent]

    def victim(self, keep: bytes | None = None) -> bytes | None:
        """The least recently used leaf (an entry no stored entry depends on), other than
        `keep`; None when there is none."""
        for key in self._order:
            if key != keep and not self._children.get(key):
                return key
        return None
