"""Quest block-sparse decode: summaries vs recompute, k = all blocks vs dense decode, sparse
vs its explicit-loop reference, the selection rule, and a planted needle."""

from __future__ import annotations

import pytest
import torch

from infergen.errors import ConfigError
from infergen.kvcache.block_summary import BlockSummary, summarize
from infergen.kvcache.kv_format import KV_FORMATS, encode
from infergen.kvcache.paged_cache import KVLayer
from infergen.ops import paged_attention as pa
from infergen.ops import sparse_decode as sd


def _decode_batch(seq_lens, heads, kv_heads, dim, block_size, seed=0):
    """Random cache + one query per sequence; block tables non-contiguous, padded with -1
    (never read); the summary built by incremental updates as the engine would."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    tables = torch.full((len(seq_lens), max(blocks_per_seq)), -1, dtype=torch.int64)
    for i, n in enumerate(blocks_per_seq):
        tables[i, :n] = torch.tensor([perm.pop() for _ in range(n)])
    q = torch.randn(len(seq_lens), heads, dim, generator=gen)
    summary = BlockSummary(num_blocks, kv_heads, dim)
    for i, ctx in enumerate(seq_lens):  # prefill all but the last token, then one decode
        pos = torch.arange(ctx)
        slots = tables[i, pos // block_size] * block_size + pos % block_size
        flat = k_cache.view(-1, kv_heads, dim)
        for part in (slots[:-1], slots[-1:]):
            summary.update(flat[part], part, block_size)
    return q, k_cache, v_cache, tables, summary


def _dense(q, k_cache, v_cache, tables, seq_lens, window):
    plan = pa.plan(
        list(range(len(seq_lens) + 1)), seq_lens, tables.clamp(min=0), k_cache.shape[1], window
    )
    return pa.decode_attention(q, k_cache, v_cache, plan, pa.default_scale(q.shape[-1]))


def test_summary_incremental_partial_and_reset():
    block_size, kv_heads, dim = 4, 2, 5
    gen = torch.Generator().manual_seed(1)
    k_cache = torch.zeros(6, block_size, kv_heads, dim)
    summary = BlockSummary(6, kv_heads, dim)
    flat = k_cache.view(-1, kv_heads, dim)

    def store(block_list, start, count):  # positions start..start+count of one sequence
        pos = torch.arange(start, start + count)
        slots = torch.tensor(block_list)[pos // block_size] * block_size + pos % block_size
        k = torch.randn(count, kv_heads, dim, generator=gen)
        flat[slots] = k
        summary.update(k, slots, block_size)

    seq_a, seq_b = [4, 1, 3], [0, 5]
    store(seq_a, 0, 6)  # one full block, one partial
    store(seq_b, 0, 3)  # one partial block
    for p in range(6, 11):  # decodes: fills block 1, opens block 3
        store(seq_a, p, 1)
    store(seq_b, 3, 2)  # chunk crossing a block boundary
    blocks = torch.tensor([4, 1, 3, 0, 5, 2])
    lengths = torch.tensor([4, 4, 3, 4, 1, 0])
    torch.testing.assert_close(
        summary.data[blocks], summarize(k_cache, blocks, lengths), rtol=0, atol=0
    )
    # summarize itself against a plain loop
    for b, n in zip(blocks.tolist(), lengths.tolist(), strict=True):
        if n:
            assert torch.equal(summarize(k_cache, [b], [n])[0, :, 0], k_cache[b, :n].amin(0))
            assert torch.equal(summarize(k_cache, [b], [n])[0, :, 1], k_cache[b, :n].amax(0))
    assert torch.isinf(summary.data[2]).all()  # never written: empty
    # seq_a finishes; its block 1 goes to a new sequence: reset, then fewer tokens than before
    summary.reset([1])
    store([1], 0, 2)
    torch.testing.assert_close(
        summary.data[blocks], summarize(k_cache, blocks, torch.tensor([4, 2, 3, 4, 1, 0])),
        rtol=0, atol=0,
    )  # fmt: skip
    # load(): recompute from the cache (e.g. after a swap-in)
    summary.reset([4, 0])
    summary.load(k_cache, torch.tensor([4, 0]), torch.tensor([4, 4]))
    torch.testing.assert_close(summary.data[[4, 0]], summarize(k_cache, [4, 0], [4, 4]))


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (6, 1)])
@pytest.mark.parametrize("dim", [7, 16])
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("window", [None, 11])
@pytest.mark.parametrize("seq_lens", [[1], [5, 17, 33], [70, 2, 16, 1, 49, 64, 9]])
def test_all_blocks_equals_dense(seq_lens, block_size, dim, heads, kv_heads, window):
    q, kc, vc, tables, summary = _decode_batch(seq_lens, heads, kv_heads, dim, block_size)
    lens = torch.tensor(seq_lens)
    got, read = sd.sparse_decode_attention(
        q, kc, vc, summary.data, tables.clamp(min=0), lens, pa.default_scale(dim),
        top_k_blocks=tables.shape[1] + 1, keep_first=1, window=window or 0,
    )  # fmt: skip
    torch.testing.assert_close(
        got, _dense(q, kc, vc, tables, seq_lens, window), rtol=1e-5, atol=1e-5
    )
    qsl = list(range(len(seq_lens) + 1))
    want = pa.reference(q, kc, vc, qsl, seq_lens, tables, pa.default_scale(dim), window)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(read, sd.dense_positions(lens, window or 0))


@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 2, 7), (6, 1, 16), (3, 3, 8)])
@pytest.mark.parametrize("top_k,keep_first", [(2, 1), (3, 0), (3, 2)])
@pytest.mark.parametrize("window", [0, 13])
def test_sparse_matches_reference(heads, kv_heads, dim, top_k, keep_first, window):
    seq_lens = [30, 3, 21, 9, 41]
    q, kc, vc, tables, summary = _decode_batch(seq_lens, heads, kv_heads, dim, 4, seed=dim)
    tables = tables.clamp(min=0)
    lens, scale = torch.tensor(seq_lens), pa.default_scale(dim)
    args = (q, kc, vc, summary.data, tables, lens, scale, top_k, keep_first, window)
    got, read = sd.sparse_decode_attention(*args)
    want, want_read, chosen = sd.reference(*args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(read, want_read)
    sel = sd.select_blocks(q, summary.data, tables, lens, 4, top_k, keep_first, window)
    for i in range(len(seq_lens)):
        for h in range(kv_heads):
            assert sel.blocks[i, h][sel.valid[i, h]].tolist() == chosen[i][h]
    if not window:
        assert (read < lens).any()  # something was skipped


@pytest.mark.parametrize("keep_first", [0, 1, 2])
def test_selection_rule(keep_first):
    seq_lens = [1, 4, 5, 13, 40, 64, 37]
    block_size, top_k = 4, 4
    q, kc, vc, tables, summary = _decode_batch(seq_lens, 6, 2, 8, block_size, seed=5)
    tables, lens = tables.clamp(min=0), torch.tensor(seq_lens)
    sel = sd.select_blocks(q, summary.data, tables, lens, block_size, top_k, keep_first)
    for i, ctx in enumerate(seq_lens):
        n = -(-ctx // block_size)
        for h in range(2):
            chosen = sel.blocks[i, h][sel.valid[i, h]].tolist()
            assert len(chosen) == len(set(chosen)) == min(top_k, n)
            assert n - 1 in chosen
            assert set(range(min(keep_first, n))) <= set(chosen)
    # a block never summarized (reset) is always read
    summary.reset([int(tables[4, 3])])
    sel = sd.select_blocks(q, summary.data, tables, lens, block_size, top_k, keep_first)
    assert (sel.blocks[4][sel.valid[4]].view(2, -1) == 3).any(dim=1).all()
    with pytest.raises(ConfigError):
        sd.select_blocks(q, summary.data, tables, lens, block_size, keep_first, keep_first)


def test_needle_is_found():
    """Random keys, one key per KV head strongly aligned with that head's queries: with 4 of
    64 blocks the needle's block is read and the output is the dense one."""
    heads, kv_heads, dim, block_size, ctx = 4, 2, 64, 16, 64 * 16 - 5
    gen = torch.Generator().manual_seed(7)
    q, kc, vc, tables, _ = _decode_batch([ctx], heads, kv_heads, dim, block_size, seed=7)
    direction = torch.randn(kv_heads, dim, generator=gen)
    noise = 0.1 * torch.randn(kv_heads, heads // kv_heads, dim, generator=gen)
    q = (direction[:, None] + noise).reshape(1, heads, dim)
    needles = [37, 12]  # block-table columns, one per KV head
    for h, column in enumerate(needles):
        kc[tables[0, column], 5, h] = 4.0 * direction[h]
    summary = BlockSummary(kc.shape[0], kv_heads, dim)
    pos = torch.arange(ctx)
    slots = tables[0, pos // block_size] * block_size + pos % block_size
    summary.update(kc.view(-1, kv_heads, dim)[slots], slots, block_size)
    lens = torch.tensor([ctx])
    sel = sd.select_blocks(q, summary.data, tables, lens, block_size, top_k_blocks=4)
    for h, column in enumerate(needles):
        assert column in sel.blocks[0, h].tolist()
    got, read = sd.sparse_decode_attention(
        q, kc, vc, summary.data, tables, lens, pa.default_scale(dim), top_k_blocks=4
    )
    torch.testing.assert_close(got, _dense(q, kc, vc, tables, [ctx], None), rtol=1e-4, atol=1e-4)
    assert int(read) == 3 * block_size + (ctx - 63 * block_size)  # 4 blocks, last partial


def test_fp8_cache_all_blocks_equals_dense():
    """A per-head scaled FP8 cache: codes gathered as bytes, decoded with the head's scale."""
    seq_lens, heads, kv_heads, dim = [9, 30, 2], 4, 2, 8
    q, kc, vc, tables, summary = _decode_batch(seq_lens, heads, kv_heads, dim, 4, seed=3)
    fmt = KV_FORMATS.get("fp8_e4m3")
    k_scale, v_scale = torch.tensor([0.01, 0.02]), torch.tensor([0.02, 0.01])
    kv = KVLayer(encode(kc, k_scale, fmt), encode(vc, v_scale, fmt), k_scale, v_scale, fmt)
    tables, lens = tables.clamp(min=0), torch.tensor(seq_lens)
    plan = pa.plan(list(range(len(seq_lens) + 1)), seq_lens, tables, 4, None)
    scale = pa.default_scale(dim)
    want = pa.decode_attention(q, kv.k, kv.v, plan, scale, kv)
    got, _ = sd.sparse_decode_attention(
        q, kv.k, kv.v, summary.data, tables, lens, scale, tables.shape[1] + 1, kv=kv
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # and through the DECODE_BACKENDS-shaped adapter, which records the positions read
    quest = sd.QuestDecode(summary, top_k_blocks=2)
    out = pa.paged_attention(q, q, q, kv.k, kv.v, plan, scale, quest, kv)
    want, read, _ = sd.reference(q, kc, vc, summary.data, tables, lens, scale, 2)
    torch.testing.assert_close(out, want, rtol=0.1, atol=0.1)  # fp8 codes vs fp32 keys
    assert torch.equal(quest.last_kv_read, read)
