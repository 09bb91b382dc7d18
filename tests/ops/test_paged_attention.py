"""Paged attention against the explicit-softmax reference and against contiguous attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from infergen.ops import paged_attention as pa
from infergen.ops.kv_store import kv_store
from infergen.ops.kv_store import reference as kv_store_reference


def _scatter_batch(query_lens, seq_lens, heads, kv_heads, dim, block_size, window, seed=0):
    """Random cache + queries for a varlen batch; block tables deliberately non-contiguous."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    tables = torch.zeros(len(seq_lens), max(blocks_per_seq), dtype=torch.int64)
    for i, n in enumerate(blocks_per_seq):
        tables[i, :n] = torch.tensor([perm.pop() for _ in range(n)])
    qsl = [0]
    for q in query_lens:
        qsl.append(qsl[-1] + q)
    q = torch.randn(qsl[-1], heads, dim, generator=gen)
    # k_new/v_new: the last query_len positions of each context, as stored in the cache
    k_new = torch.empty(qsl[-1], kv_heads, dim)
    v_new = torch.empty(qsl[-1], kv_heads, dim)
    for i, (ql, ctx) in enumerate(zip(query_lens, seq_lens, strict=True)):
        for j in range(ql):
            p = ctx - ql + j
            b = tables[i, p // block_size]
            k_new[qsl[i] + j] = k_cache[b, p % block_size]
            v_new[qsl[i] + j] = v_cache[b, p % block_size]
    plan = pa.plan(qsl, seq_lens, tables, block_size, window)
    return q, k_new, v_new, k_cache, v_cache, qsl, tables, plan


CASES = [
    # (query_lens, seq_lens): decodes only, cold prefills, chunked prefills, mixtures
    ([1], [1]),
    ([1, 1, 1], [5, 17, 33]),
    ([1] * 9, [300, 2, 77, 1, 64, 65, 128, 9, 250]),
    ([7], [7]),
    ([16, 1, 5], [16, 40, 21]),
    ([3, 9, 1, 1], [19, 9, 1, 64]),
]


@pytest.mark.parametrize("backend", ["torch", "native"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (5, 1)])
@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("case", CASES)
def test_matches_reference(case, heads, kv_heads, window, backend):
    query_lens, seq_lens = case
    q, k_new, v_new, kc, vc, qsl, tables, plan = _scatter_batch(
        query_lens, seq_lens, heads, kv_heads, 8, 4, window
    )
    scale = pa.default_scale(8)
    decode = pa.DECODE_BACKENDS.get(backend)
    got = pa.paged_attention(q, k_new, v_new, kc, vc, plan, scale, decode)
    want = pa.reference(q, kc, vc, qsl, seq_lens, tables, scale, window)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "native"])
@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize(
    "query_lens,seq_lens,as_decodes",
    [
        ([5], [5], {0}),  # a whole (tiny) context verified
        ([5, 1, 3], [40, 17, 9], {0, 2}),  # verifying decodes beside a plain one
        ([4, 16, 1, 2], [30, 16, 64, 23], {0, 3}),  # and beside a prefill chunk
    ],
)
def test_multi_token_rows_as_decodes_match_reference(query_lens, seq_lens, as_decodes,
                                                     window, backend):  # fmt: skip
    """Speculative verification's plan: each token of the `as_decodes` sequences is a decode
    row reading its causal prefix; the step is still decode-only when nothing else is in it."""
    q, k_new, v_new, kc, vc, qsl, tables, _ = _scatter_batch(
        query_lens, seq_lens, 6, 2, 8, 4, window
    )
    plan = pa.plan(qsl, seq_lens, tables, 4, window, as_decodes=as_decodes)
    plain = sum(1 for n in query_lens if n > 1) - len(as_decodes)
    assert plan.decode_only == (plain == 0) and len(plan.prefills) == plain
    scale = pa.default_scale(8)
    got = pa.paged_attention(q, k_new, v_new, kc, vc, plan, scale, pa.DECODE_BACKENDS.get(backend))
    want = pa.reference(q, kc, vc, qsl, seq_lens, tables, scale, window)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dim", [12, 64, 80, 128])
@pytest.mark.parametrize("window", [None, 21])
@pytest.mark.parametrize("heads", [6, 8, 12])
def test_native_decode_head_dims(dim, window, heads):
    """The kernel's paths: query heads three at a time (groups of 3 and 6; a group of 4 has
    one head left over), 8-position score blocks + register V sums (dim % 64 == 0), the axpy
    V path (80), scalar dots (12); long contexts with block-size and window tails, split into
    chunks whose softmax states merge."""
    seq_lens = [1, 7, 8, 9, 40, 131, 128, 129, 300]  # (chunks of 128: one, two, three)
    q, k_new, v_new, kc, vc, qsl, tables, plan = _scatter_batch(
        [1] * len(seq_lens), seq_lens, heads, 2, dim, 16, window, seed=dim
    )
    scale = pa.default_scale(dim)
    got = pa.paged_attention(q, k_new, v_new, kc, vc, plan, scale, pa.DECODE_BACKENDS.get("native"))
    want = pa.reference(q, kc, vc, qsl, seq_lens, tables, scale, window)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_native_decode_does_not_depend_on_the_batch_or_threads(threads):
    """A sequence's output is the same bits alone, in a batch, and on 1 or 2 threads (its
    chunks depend on its length only)."""
    seq_lens = [300, 5, 129, 64]
    q, k_new, v_new, kc, vc, qsl, tables, plan = _scatter_batch(
        [1] * len(seq_lens), seq_lens, 9, 3, 64, 16, None, seed=3
    )
    native, scale = pa.DECODE_BACKENDS.get("native"), pa.default_scale(64)
    batched = pa.paged_attention(q, k_new, v_new, kc, vc, plan, scale, native)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for i, ctx in enumerate(seq_lens):
            one = pa.plan(torch.tensor([0, 1]), [ctx], tables[i : i + 1], 16, None)
            alone = pa.paged_attention(q[i : i + 1], k_new[i : i + 1], v_new[i : i + 1], kc, vc,
                                       one, scale, native)  # fmt: skip
            assert torch.equal(alone, batched[i : i + 1]), ctx
    finally:
        torch.set_num_threads(before)


def test_paged_equals_contiguous_attention():
    """Metamorphic: a sequence scattered over random blocks = plain causal SDPA on it."""
    heads, kv_heads, dim, length, block_size = 6, 3, 16, 45, 8
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(length, heads, dim, generator=gen)
    k = torch.randn(length, kv_heads, dim, generator=gen)
    v = torch.randn(length, kv_heads, dim, generator=gen)
    num_blocks = 10
    k_cache = torch.zeros(num_blocks, block_size, kv_heads, dim)
    v_cache = torch.zeros_like(k_cache)
    table = torch.tensor([[7, 2, 9, 0, 4, 1]])
    slots = torch.tensor(
        [int(table[0, p // block_size]) * block_size + p % block_size for p in range(length)]
    )
    kv_store(k, v, k_cache, v_cache, slots)
    want = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1).repeat_interleave(2, 0),
        v.transpose(0, 1).repeat_interleave(2, 0),
        is_causal=True,
    ).transpose(0, 1)
    # as two chunks: the second reads the first chunk's KV through the block table
    for split in (length, 20, 1):
        outs = []
        for start, end in ((0, split), (split, length)):
            if end <= start:
                continue
            plan = pa.plan([0, end - start], [end], table, block_size, None)
            outs.append(
                pa.paged_attention(
                    q[start:end], k[start:end], v[start:end], k_cache, v_cache, plan, dim**-0.5
                )
            )
        torch.testing.assert_close(torch.cat(outs), want, rtol=1e-5, atol=1e-5)


def test_kv_store_matches_reference():
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(9, 2, 4, generator=gen)
    v = torch.randn(9, 2, 4, generator=gen)
    slots = torch.tensor([0, 5, 6, 7, 12, 13, 31, 30, 1])
    caches = [torch.zeros(8, 4, 2, 4) for _ in range(4)]
    kv_store(k, v, caches[0], caches[1], slots)
    kv_store_reference(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


@pytest.mark.parametrize("backend", ["torch", "native"])
@pytest.mark.parametrize("case", CASES[1:])
def test_windowed_attention_ignores_released_blocks(case, backend):
    """Metamorphic: the blocks a sliding-window group let go (kvcache/groups.py) point to a
    block of garbage; the result still equals attention over the window's slice of the KV,
    and the plan gathers no more than the window per sequence."""
    query_lens, seq_lens = case
    window, block = 6, 4
    q, k_new, v_new, kc, vc, qsl, tables, _ = _scatter_batch(
        query_lens, seq_lens, 4, 2, 8, block, window
    )
    want = pa.reference(q, kc, vc, qsl, seq_lens, tables, pa.default_scale(8), window)
    poison = kc.shape[0]  # an extra block of huge values where released blocks now point
    kc = torch.cat([kc, torch.full_like(kc[:1], 1e4)])
    vc = torch.cat([vc, torch.full_like(vc[:1], -1e4)])
    dropped = tables.clone()
    for i, (ql, ctx) in enumerate(zip(query_lens, seq_lens, strict=True)):
        first_read = max(0, ctx - ql - window + 1) // block  # as the scheduler releases
        dropped[i, :first_read] = poison
    plan = pa.plan(qsl, seq_lens, dropped, block, window)
    for item in plan.prefills:
        query_len = item.end - item.start
        assert item.slots is None or item.slots.numel() <= window - 1 + query_len
    if plan.decode_slots is not None:
        assert plan.decode_slots.numel() <= window * plan.decode_rows.numel()
    decode = pa.DECODE_BACKENDS.get(backend)
    got = pa.paged_attention(q, k_new, v_new, kc, vc, plan, pa.default_scale(8), decode)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "native"])
@pytest.mark.parametrize("case", CASES)
def test_window_with_sink_tokens_matches_reference(case, backend):
    """StreamingLLM: a window of 6 plus the first 3 positions (sinks) for every query."""
    query_lens, seq_lens = case
    q, k_new, v_new, kc, vc, qsl, tables, _ = _scatter_batch(query_lens, seq_lens, 4, 2, 8, 4, 6)
    plan = pa.plan(qsl, seq_lens, tables, 4, 6, sinks=3)
    decode = pa.DECODE_BACKENDS.get(backend)
    got = pa.paged_attention(q, k_new, v_new, kc, vc, plan, pa.default_scale(8), decode)
    want = pa.reference(q, kc, vc, qsl, seq_lens, tables, pa.default_scale(8), 6, sinks=3)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
