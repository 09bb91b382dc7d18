"""Chained block hashes for prefix caching.

The hash of block j covers its tokens and, through the hash of block j−1, every token before
it: two sequences share block j's hash only if they share all tokens up to the end of block j.
BLAKE2b over the parent digest and the token ids (int64 little-endian), 16-byte digest.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence


def group_key(group: int, block_hash: bytes) -> bytes:
    """Prefix-cache key of a block of one cache group (groups hold different layers' KV)."""
    return block_hash if group == 0 else block_hash + group.to_bytes(4, "little")


def block_hash(parent: bytes | None, tokens: Sequence[int]) -> bytes:
    digest = hashlib.blake2b(parent or b"root", digest_size=16)
    digest.update(array("q", tokens).tobytes())
    return digest.digest()


def extend_hashes(
    hashes: list[bytes], token_ids: Sequence[int], block_size: int, upto: int
) -> None:
    """Append hashes for full blocks until `hashes` covers `upto` blocks (in place)."""
    while len(hashes) < upto:
        j = len(hashes)
        parent = hashes[-1] if hashes else None
        hashes.append(block_hash(parent, token_ids[j * block_size : (j + 1) * block_size]))
