"""Block pool: refcounts, prefix registration/lookup, LRU eviction of idle cached blocks."""

from __future__ import annotations

import pytest

from infergen.kvcache.block_pool import BlockPool
from infergen.kvcache.prefix import block_hash, extend_hashes


def test_allocate_release_and_exhaustion():
    pool = BlockPool(3)
    blocks = [pool.allocate() for _ in range(3)]
    assert sorted(blocks) == [0, 1, 2] and pool.num_free == 0
    with pytest.raises(RuntimeError):
        pool.allocate()
    pool.release(blocks)
    assert pool.num_free == 3


def test_shared_block_is_freed_only_when_unreferenced():
    pool = BlockPool(4)
    b = pool.allocate()
    h = block_hash(None, [1, 2, 3, 4])
    pool.register(b, h)
    assert pool.lookup(h) == b
    pool.acquire(b)
    assert pool.refcount(b) == 2
    pool.release([b])
    assert pool.refcount(b) == 1 and pool.lookup(h) == b
    pool.release([b])
    assert pool.refcount(b) == 0 and pool.lookup(h) == b  # idle but still cached
    pool.acquire(b)  # a prefix hit revives it
    assert pool.refcount(b) == 1 and pool.num_free == 3


def test_lru_eviction_only_when_no_free_blocks():
    pool = BlockPool(3)
    a, b = pool.allocate(), pool.allocate()
    ha, hb = block_hash(None, [1]), block_hash(None, [2])
    pool.register(a, ha)
    pool.register(b, hb)
    pool.release([a])  # a idle first → least recently used
    pool.release([b])
    c = pool.allocate()  # the never-used free block comes first
    assert c not in (a, b) and pool.num_evictions == 0
    d = pool.allocate()  # now evict the LRU idle block: a
    assert d == a and pool.lookup(ha) is None and pool.lookup(hb) == b
    assert pool.num_evictions == 1


def test_release_tail_first_keeps_shared_prefix_longest():
    pool = BlockPool(3)
    blocks = [pool.allocate() for _ in range(3)]
    hashes = []
    extend_hashes(hashes, list(range(12)), 4, 3)
    for blk, h in zip(blocks, hashes, strict=True):
        pool.register(blk, h)
    pool.release(blocks)
    assert pool.allocate() == blocks[2]  # last block evicted first
    assert pool.lookup(hashes[0]) == blocks[0]


def test_chained_hash_depends_on_whole_prefix():
    a, b = [], []
    extend_hashes(a, [1, 2, 3, 4, 5, 6, 7, 8], 4, 2)
    extend_hashes(b, [9, 2, 3, 4, 5, 6, 7, 8], 4, 2)
    assert a[1] != b[1]  # same second block, different first block
    c = []
    extend_hashes(c, [1, 2, 3, 4, 5, 6, 7, 8, 0], 4, 2)
    assert c == a


def test_prefix_caching_disabled_never_hits():
    pool = BlockPool(2, enable_prefix_caching=False)
    b = pool.allocate()
    h = block_hash(None, [1])
    pool.register(b, h)
    assert pool.lookup(h) is None
