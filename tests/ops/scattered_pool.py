"""A paged KV pool whose sequences' blocks are scattered (a random permutation of the pool,
three blocks spare), shared by the paged attention kernels' tests."""

from __future__ import annotations

import torch


def scattered_pool(seq_lens, kv_heads, dim, block_size, dtype, gen: torch.Generator):
    """(k, v [num_blocks, block_size, kv_heads, dim] random in `dtype`, block tables
    [seqs, max_blocks] int64) for sequences of `seq_lens` tokens."""
    per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(per_seq) + 3
    order = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(seq_lens), max(per_seq), dtype=torch.int64)
    used = 0
    for i, n in enumerate(per_seq):
        tables[i, :n] = order[used : used + n]
        used += n
    shape = (num_blocks, block_size, kv_heads, dim)
    k = torch.randn(shape, generator=gen).to(dtype)
    v = torch.randn(shape, generator=gen).to(dtype)
    return k, v, tables
