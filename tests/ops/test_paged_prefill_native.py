"""Prefill attention in C (ops/paged_prefill_native.py, kernels/paged_prefill_attention_f32.c)
against the float64 oracle (ops/paged_attention.reference: one head, one query at a time,
explicit softmax): head dims 16 / 64 / 128 / 256, GQA ratios 1 / 3 / 4 / 8 / 16 and 64 (MHA,
GQA, MQA; 64 heads per KV head fill more than one tile of rows), block sizes 4 / 5 / 16,
mixed batches (cold prompts, chunks after a prefix hit, decode rows beside them, contexts
past 1k), sliding windows, blocks scattered over the pool, strided queries; the build's other
ISA paths (generic: 4-float vectors; avx2: 8) in a subprocess; and the row's fallback to the
torch row where the kernel cannot serve."""

from __future__ import annotations

import functools

import pytest
import torch

from infergen.kvcache.paged_cache import KVLayer
from infergen.ops import paged_attention as pa
from infergen.ops.attention_sinks import sink_attention
from infergen.ops.paged_prefill_native import native_prefill_serves
from tests.kernel_isa import assert_ok_with_isa
from tests.ops.prefill_fallback import assert_falls_back_to_torch
from tests.ops.scattered_pool import scattered_pool

NATIVE_ROW = pa.PREFILL_BACKENDS.get("native")


def _case(query_lens, seq_lens, kv_heads, group, dim, block_size, seed=0):
    """A pool with every sequence's blocks scattered, queries, their start offsets, and the
    queries' own K / V as the cache holds them (k_new, v_new: what the torch row reads)."""
    gen = torch.Generator().manual_seed(seed)
    k, v, tables = scattered_pool(seq_lens, kv_heads, dim, block_size, torch.float32, gen)
    q = torch.randn(sum(query_lens), kv_heads * group, dim, generator=gen)
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    new = [
        (tables[i, p // block_size], p % block_size)
        for i, ctx in enumerate(seq_lens)
        for p in range(ctx - query_lens[i], ctx)
    ]
    k_new = torch.stack([k[b, s] for b, s in new])
    v_new = torch.stack([v[b, s] for b, s in new])
    return q, k, v, tables, starts, k_new, v_new


GRID = [
    # (query_lens, seq_lens, kv_heads, group, dim, block_size, window)
    ([37], [37], 2, 1, 64, 16, None),  # a cold prompt, MHA
    ([5, 17, 1, 2], [5, 60, 20, 2], 1, 8, 16, 4, None),  # MQA, dim 16, a decode row
    ([64, 9], [1200, 9], 1, 8, 64, 16, None),  # a chunk after a 1.1k prefix hit
    ([101], [761], 3, 3, 64, 16, None),  # the agentic hit: SmolLM2's heads
    ([30, 45], [30, 120], 2, 3, 16, 4, 16),  # window
    ([150, 200, 1], [150, 1500, 900], 1, 3, 128, 16, 64),  # window, 1.5k, a decode row
    ([50, 7], [130, 40], 1, 4, 256, 5, 20),  # Gemma's head dim, a block size of 5
    ([70], [70], 4, 1, 64, 16, 9),  # a window shorter than a key chunk
    ([3, 40], [80, 40], 1, 64, 16, 16, None),  # 64 heads per KV head: several head tiles
    ([9, 33], [9, 33], 2, 16, 32, 4, 7),  # 16 heads per KV head
]


@pytest.mark.parametrize("query_lens, seq_lens, kv_heads, group, dim, block_size, window", GRID)
def test_matches_the_float64_oracle(query_lens, seq_lens, kv_heads, group, dim, block_size,
                                    window):  # fmt: skip
    q, k, v, tables, starts, k_new, v_new = _case(query_lens, seq_lens, kv_heads, group, dim,
                                                  block_size)  # fmt: skip
    scale = pa.default_scale(dim)
    want = pa.reference(q, k, v, starts, seq_lens, tables, scale, window)
    plan = pa.plan(starts, seq_lens, tables, block_size, window)
    assert native_prefill_serves(q, KVLayer(k, v), pa.F.scaled_dot_product_attention, plan)
    got = pa.paged_attention(q, k_new, v_new, k, v, plan, scale, prefill_fn=NATIVE_ROW)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_strided_queries_and_its_own_rows_only():
    """q a strided view (q and k of one projection, as the attention layer slices them); the
    kernel writes the prefill rows of `out` and nothing else."""
    query_lens, seq_lens, kv_heads, group, dim = [23, 1, 40], [50, 30, 40], 2, 3, 64
    q, k, v, tables, starts, k_new, v_new = _case(query_lens, seq_lens, kv_heads, group, dim,
                                                  16, seed=3)  # fmt: skip
    qk = torch.cat([q, torch.randn(q.shape[0], kv_heads, dim)], dim=1)  # [tokens, 6 + 2, d]
    strided = qk[:, : kv_heads * group]
    assert not strided.is_contiguous()
    scale = pa.default_scale(dim)
    plan = pa.plan(starts, seq_lens, tables, 16, None)
    out = torch.full_like(q, float("nan"))
    NATIVE_ROW(strided, k_new, v_new, k, v, plan, scale, out)
    want = pa.reference(q, k, v, starts, seq_lens, tables, scale)
    prefill_rows = [r for r in range(q.shape[0]) if r != 23]  # row 23: the decode
    torch.testing.assert_close(out[prefill_rows], want[prefill_rows], rtol=1e-5, atol=1e-5)
    assert out[23].isnan().all()


_ISA_CHECK = """
import torch
from infergen.ops import paged_attention as pa
from tests.ops.test_paged_prefill_native import GRID, _case
row = pa.PREFILL_BACKENDS.get("native")
for query_lens, seq_lens, kv_heads, group, dim, block_size, window in GRID[2:8]:
    q, k, v, tables, starts, k_new, v_new = _case(query_lens, seq_lens, kv_heads, group, dim,
                                                  block_size)
    scale = pa.default_scale(dim)
    plan = pa.plan(starts, seq_lens, tables, block_size, window)
    got = pa.paged_attention(q, k_new, v_new, k, v, plan, scale, prefill_fn=row)
    want = pa.reference(q, k, v, starts, seq_lens, tables, scale, window)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
print("ok")
"""


@pytest.mark.parametrize("isa", ["generic", "avx2"])
def test_other_isa_builds(isa, tmp_path):
    """The kernel built for 4-float vectors (INFERGEN_KERNEL_ISA=generic: no AVX) and for
    AVX2's 8 (the default where the CPU lacks AVX-512) agrees with the oracle too."""
    assert_ok_with_isa(isa, _ISA_CHECK, tmp_path)


def test_the_row_falls_back_to_torch_where_the_kernel_cannot_serve():
    """Another attention core (learned sink logits), an FP8-coded cache, StreamingLLM sink
    positions and a head dim of 24: the native row computes what the torch row does."""
    query_lens, seq_lens, kv_heads, group, dim = [6, 1, 9], [6, 12, 20], 2, 2, 16
    q, k, v, tables, starts, k_new, v_new = _case(query_lens, seq_lens, kv_heads, group, dim,
                                                  4, seed=4)  # fmt: skip
    plan = pa.plan(starts, seq_lens, tables, 4, None)
    scale = pa.default_scale(dim)
    core = functools.partial(sink_attention, sinks=torch.randn(1, kv_heads * group, 1, 1))
    assert not native_prefill_serves(q, KVLayer(k, v), core, plan)
    assert_falls_back_to_torch(NATIVE_ROW, q, k_new, v_new, k, v, plan, scale)
    sinks_plan = pa.plan(starts, seq_lens, tables, 4, 5, sinks=2)
    assert not native_prefill_serves(q, KVLayer(k, v), pa.F.scaled_dot_product_attention,
                                     sinks_plan)  # fmt: skip
    want = pa.reference(q, k, v, starts, seq_lens, tables, scale, 5, 2)
    got = pa.paged_attention(q, k_new, v_new, k, v, sinks_plan, scale, prefill_fn=NATIVE_ROW)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    q24, k24, v24, t24, s24, kn24, vn24 = _case([8], [8], 1, 2, 24, 4, seed=5)
    plan24 = pa.plan(s24, [8], t24, 4, None)
    assert not native_prefill_serves(q24, KVLayer(k24, v24), pa.F.scaled_dot_product_attention,
                                     plan24)  # fmt: skip
    got = pa.paged_attention(q24, kn24, vn24, k24, v24, plan24, 0.2, prefill_fn=NATIVE_ROW)
    torch.testing.assert_close(got, pa.reference(q24, k24, v24, s24, [8], t24, 0.2),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
