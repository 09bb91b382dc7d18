"""Paged decode attention in Triton (ops/paged_decode_triton.py) against the float64 oracle
(ops/paged_attention.reference: one head, one query at a time, explicit softmax) on a grid:
head dims that are and are not powers of two, block sizes, contexts of 1 position to several
splits, GQA ratios 1..8 (MHA, GQA, MQA), sliding windows with sink tokens, fp32 / bf16 values,
blocks scattered over the pool; and through the DECODE_BACKENDS row with an engine plan.
Kernels run in the Triton interpreter on the CPU (TRITON_INTERPRET=1, tests/conftest.py) or
on a GPU with TRITON_INTERPRET=0 (benchmarks/device_check.sh)."""

from __future__ import annotations

import pytest
import torch

from infergen.ops import paged_attention as pa
from infergen.ops.paged_decode_triton import num_splits, paged_decode_triton
from tests.ops.scattered_pool import scattered_pool
from tests.triton_env import DEVICE, runnable

pytestmark = runnable


def _case(seq_lens, kv_heads, group, dim, block_size, dtype=torch.float32, seed=0):
    """A pool with every sequence's blocks scattered (a random permutation), and queries."""
    gen = torch.Generator().manual_seed(seed)
    k, v, tables = scattered_pool(seq_lens, kv_heads, dim, block_size, dtype, gen)
    q = torch.randn(len(seq_lens), kv_heads * group, dim, generator=gen).to(dtype)
    return q, k, v, tables, torch.tensor(seq_lens)


def _oracle(q, k, v, tables, seq_lens, scale, window=None, sinks=0):
    starts = list(range(q.shape[0] + 1))
    return pa.reference(
        q.float(), k.float(), v.float(), starts, seq_lens.tolist(), tables, scale, window, sinks
    )


GRID = [
    # (seq_lens, kv_heads, group, dim, block_size, window, sinks, splits)
    ([1], 1, 1, 64, 16, None, 0, None),  # one position
    ([17, 5, 40], 2, 4, 64, 16, None, 0, None),  # GQA 4
    ([33, 70], 1, 8, 80, 4, None, 0, None),  # MQA, head dim 80 (padded), small blocks
    ([100, 9], 4, 1, 32, 8, None, 0, 3),  # MHA, three splits
    ([300], 2, 2, 64, 16, None, 0, 4),  # splits of 96 positions at batch 1
    ([130, 64], 2, 3, 48, 16, 32, 4, 2),  # window 32 + 4 sinks, a split wholly in the gap
    ([2000], 1, 2, 64, 16, None, 0, None),  # 2k context: num_splits picks the splits
]


@pytest.mark.parametrize("seq_lens, kv_heads, group, dim, block_size, window, sinks, splits", GRID)
def test_matches_the_float64_oracle(seq_lens, kv_heads, group, dim, block_size, window, sinks,
                                    splits):  # fmt: skip
    q, k, v, tables, lens = _case(seq_lens, kv_heads, group, dim, block_size)
    scale = pa.default_scale(dim)
    want = _oracle(q, k, v, tables, lens, scale, window, sinks)
    dev = [t.to(DEVICE) for t in (q, k, v, tables, lens)]
    got = paged_decode_triton(*dev, scale, window or 0, sinks, splits=splits).cpu()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_bf16_values_and_queries():
    q, k, v, tables, lens = _case([45, 12], 2, 2, 64, 16, dtype=torch.bfloat16, seed=1)
    scale = pa.default_scale(64)
    want = _oracle(q, k, v, tables, lens, scale)
    dev = [t.to(DEVICE) for t in (q, k, v, tables, lens)]
    got = paged_decode_triton(*dev, scale, splits=2).cpu()
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)  # bf16 output rounding


def test_the_backend_row_reads_an_engine_plan():
    """DECODE_BACKENDS["triton"] with the plan the engine builds equals the torch row."""
    seq_lens, block_size = [23, 7, 51], 8
    q, k, v, tables, lens = _case(seq_lens, 2, 3, 64, block_size, seed=2)
    plan = pa.plan(list(range(len(seq_lens) + 1)), seq_lens, tables, block_size, None)
    scale = pa.default_scale(64)
    want = pa.DECODE_BACKENDS.get("torch")(q, k, v, plan, scale)
    dev_plan = pa.plan(list(range(len(seq_lens) + 1)), seq_lens, tables.to(DEVICE), block_size,
                       None)  # fmt: skip
    got = pa.DECODE_BACKENDS.get("triton")(
        q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), dev_plan, scale
    ).cpu()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_splits_fill_the_machine_only_where_the_batch_does_not():
    assert num_splits(8192, 1) == 32  # batch 1, one KV head: 32 splits of 256
    assert num_splits(300, 4) == 2  # short context: splits of at least 256 positions
    assert num_splits(8192, 256) == 1  # enough programs already
