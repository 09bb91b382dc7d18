"""Tiers below the paged KV pool (issue 23): blocks evicted from the pool move down to host
memory and disk, keyed by their chained prefix hashes, and come back on a prefix hit."""
