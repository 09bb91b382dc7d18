"""Varlen prefill attention in Triton (ops/paged_prefill_triton.py) against the float64 oracle
(ops/paged_attention.reference: one head, one query at a time, explicit softmax) on a grid:
head dims 24 / 64 / 80 (padded to powers of two), GQA ratios 1 / 3 / 8 (MHA, GQA, MQA), block
sizes 4 / 16, mixed batches (cold prompts, chunks after a prefix hit, a 1.2-1.5k context,
decode rows served by the decode row beside them), sliding windows with and without sinks,
logit soft-capping, fp32 / bf16 / fp16, blocks scattered over the pool; the plan's
PrefillBatch and its tiles; and the PREFILL_BACKENDS row's fallback to the torch row. Kernels
run in the Triton interpreter on the CPU (TRITON_INTERPRET=1, tests/conftest.py) or on a GPU
with TRITON_INTERPRET=0 (benchmarks/device_check.sh)."""

from __future__ import annotations

import pytest
import torch

from infergen.ops import paged_attention as pa
from infergen.ops.paged_prefill_triton import paged_prefill_triton
from tests.ops.prefill_fallback import assert_falls_back_to_torch
from tests.ops.scattered_pool import scattered_pool
from tests.triton_env import DEVICE, runnable

pytestmark = runnable
TRITON_ROW = pa.PREFILL_BACKENDS.get("triton")


def _case(query_lens, seq_lens, kv_heads, group, dim, block_size, dtype=torch.float32, seed=0,
          q_scale=1.0):  # fmt: skip
    """A pool with every sequence's blocks scattered (a random permutation; the queries' own
    K/V already stored, as kv_store leaves them), queries, and the query start offsets."""
    gen = torch.Generator().manual_seed(seed)
    k, v, tables = scattered_pool(seq_lens, kv_heads, dim, block_size, dtype, gen)
    q = (torch.randn(sum(query_lens), kv_heads * group, dim, generator=gen) * q_scale).to(dtype)
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    return q, k, v, tables, starts


def _prefill_rows(starts, query_lens):
    pairs = zip(starts, query_lens, strict=False)  # starts has one more entry
    return torch.cat([torch.arange(s, s + n) for s, n in pairs if n > 1])


def _new_kv(cache, tables, starts, seq_lens):
    """[tokens, kv_heads, d]: the queries' own K (or V) as stored in the cache (the torch
    row reads a cold prompt's from there, the kernel from the cache)."""
    block_size, rows = cache.shape[1], []
    for i, ctx in enumerate(seq_lens):
        for p in range(ctx - (starts[i + 1] - starts[i]), ctx):
            rows.append(cache[tables[i, p // block_size], p % block_size])
    return torch.stack(rows)


GRID = [
    # (query_lens, seq_lens, kv_heads, group, dim, block_size, window, sinks, softcap)
    ([37], [37], 2, 1, 64, 16, None, 0, None),  # a cold prompt, MHA
    ([5, 17, 1, 2], [5, 60, 20, 2], 1, 8, 24, 4, None, 0, None),  # MQA, dim 24, a decode
    ([64, 9], [1200, 9], 1, 8, 64, 16, None, 0, None),  # a chunk after a 1.1k prefix hit
    ([30, 45], [30, 120], 2, 3, 24, 4, 16, 0, None),  # window, no sinks
    ([150, 200, 1], [150, 1500, 900], 1, 3, 80, 16, 64, 4, None),  # window + sinks, 1.5k
    ([40, 70], [40, 300], 2, 3, 64, 16, None, 0, 2.0),  # soft-capping
    ([50, 1], [130, 40], 1, 8, 80, 4, 20, 3, 3.0),  # soft-capping, window + sinks, MQA
]


@pytest.mark.parametrize(
    "query_lens, seq_lens, kv_heads, group, dim, block_size, window, sinks, softcap", GRID
)
def test_matches_the_float64_oracle(query_lens, seq_lens, kv_heads, group, dim, block_size,
                                    window, sinks, softcap):  # fmt: skip
    q_scale = 3.0 if softcap else 1.0  # scores of several units: the cap bites
    q, k, v, tables, starts = _case(query_lens, seq_lens, kv_heads, group, dim, block_size,
                                    q_scale=q_scale)  # fmt: skip
    scale = pa.default_scale(dim)
    want = pa.reference(q, k, v, starts, seq_lens, tables, scale, window, sinks, softcap)
    plan = pa.plan(starts, seq_lens, tables.to(DEVICE), block_size, window, sinks)
    dq, dk, dv = q.to(DEVICE), k.to(DEVICE), v.to(DEVICE)
    if softcap is None:  # the engine's way: decodes to the decode row, the rest to the kernel
        k_new, v_new = (_new_kv(c, tables, starts, seq_lens).to(DEVICE) for c in (k, v))
        got = pa.paged_attention(dq, k_new, v_new, dk, dv, plan, scale,
                                 prefill_fn=TRITON_ROW).cpu()  # fmt: skip
    else:  # the engine passes no cap yet: the launcher, and the prefill rows only
        rows = _prefill_rows(starts, query_lens)
        got = paged_prefill_triton(dq, dk, dv, plan.prefill_batch(), scale, plan.window,
                                   plan.sinks, softcap).cpu()[rows]  # fmt: skip
        want, uncapped = want[rows], pa.reference(q, k, v, starts, seq_lens, tables, scale,
                                                  window, sinks)[rows]  # fmt: skip
        assert (want - uncapped).abs().max() > 0.05  # the cap changes the answer
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, group, dim, window, sinks, softcap", [
    (torch.bfloat16, 3, 80, 32, 2, None),
    (torch.float16, 8, 64, None, 0, 4.0),
])  # fmt: skip
def test_half_precision_values_and_queries(dtype, group, dim, window, sinks, softcap):
    query_lens, seq_lens = [60, 90, 1], [60, 400, 50]
    q, k, v, tables, starts = _case(query_lens, seq_lens, 1, group, dim, 16, dtype, seed=1)
    scale = pa.default_scale(dim)
    want = pa.reference(q.float(), k.float(), v.float(), starts, seq_lens, tables, scale,
                        window, sinks, softcap)  # fmt: skip
    plan = pa.plan(starts, seq_lens, tables.to(DEVICE), 16, window, sinks)
    got = paged_prefill_triton(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), plan.prefill_batch(),
                               scale, plan.window, plan.sinks, softcap).cpu()  # fmt: skip
    assert got.dtype == dtype
    rows = _prefill_rows(starts, query_lens)
    # half-precision probabilities into the second product and the output's rounding
    torch.testing.assert_close(got[rows].float(), want[rows], rtol=2e-2, atol=2e-2)


def test_one_query_sequences_small_tiles_and_strided_queries():
    """The launcher on a hand-built PrefillBatch: sequences of 1 query too, tiles of 5
    queries × 3 heads (16 rows, a group that does not divide them), keys 16 at a time, and
    q a strided view (q and k of one projection, as the attention layer slices them)."""
    query_lens, seq_lens, kv_heads, group, dim = [1, 23, 4, 1], [1, 23, 41, 30], 2, 3, 24
    q, k, v, tables, starts = _case(query_lens, seq_lens, kv_heads, group, dim, 4, seed=3)
    qk = torch.cat([q, torch.randn(q.shape[0], kv_heads, dim)], dim=1)  # [tokens, 6 + 2, d]
    strided = qk.to(DEVICE)[:, : kv_heads * group]
    scale = pa.default_scale(dim)
    want = pa.reference(q, k, v, starts, seq_lens, tables, scale)
    as_int32 = dict(dtype=torch.int32, device=DEVICE)
    batch = pa.PrefillBatch(
        query_start=torch.tensor(starts[:-1], **as_int32),
        query_lens=torch.tensor(query_lens, **as_int32),
        seq_lens=torch.tensor(seq_lens, **as_int32),
        block_tables=tables.to(**as_int32),
        host_query_lens=query_lens,
        host_seq_lens=seq_lens,
    )
    got = paged_prefill_triton(strided, k.to(DEVICE), v.to(DEVICE), batch, scale, rows=16,
                               block_n=16).cpu()  # fmt: skip
    assert batch.tiles(5).shape[0] == 1 + 5 + 1 + 1  # 23 queries: tiles of 5, 5, 5, 5, 3
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_plan_builds_its_prefill_batch_once_and_tiles_every_query_once():
    query_lens, seq_lens = [7, 1, 20, 3], [7, 9, 50, 3]
    _, _, _, tables, starts = _case(query_lens, seq_lens, 1, 1, 16, 4)
    plan = pa.plan(starts, seq_lens, tables, 4, None)
    batch = plan.prefill_batch()
    assert plan.prefill_batch() is batch
    assert batch.query_start.tolist() == [0, 8, 28]  # the decode row 7 is not a prefill
    assert batch.query_lens.tolist() == [7, 20, 3] and batch.seq_lens.tolist() == [7, 50, 3]
    assert torch.equal(batch.block_tables, tables[[0, 2, 3]].int())
    tiles = batch.tiles(4)
    assert batch.tiles(4) is tiles
    covered = sorted((s, f + j) for s, f in tiles.tolist() for j in range(4)
                     if f + j < query_lens[[0, 2, 3][s]])  # fmt: skip
    want = [(i, j) for i, n in enumerate([7, 20, 3]) for j in range(n)]
    assert covered == want  # every query in exactly one tile
    reach = [min(seq_lens[[0, 2, 3][s]], seq_lens[[0, 2, 3][s]] - query_lens[[0, 2, 3][s]]
                 + f + 4) for s, f in tiles.tolist()]  # fmt: skip
    assert reach == sorted(reach, reverse=True)  # the longest tiles first
    assert reach[0] == 50


def test_the_row_falls_back_to_torch_where_the_kernel_cannot_serve():
    """Another attention core (learned sink logits) and an FP8-coded cache: the triton row
    computes what the torch row does (the kernel has neither)."""
    query_lens, seq_lens, kv_heads, group, dim = [6, 1, 9], [6, 12, 20], 2, 2, 16
    q, k, v, tables, starts = _case(query_lens, seq_lens, kv_heads, group, dim, 4, seed=4)
    plan = pa.plan(starts, seq_lens, tables, 4, None)
    scale = pa.default_scale(dim)
    k_new, v_new = _new_kv(k, tables, starts, seq_lens), _new_kv(v, tables, starts, seq_lens)
    assert_falls_back_to_torch(TRITON_ROW, q, k_new, v_new, k, v, plan, scale)
