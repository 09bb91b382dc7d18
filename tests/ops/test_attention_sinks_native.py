"""Learned sink logits (GPT-OSS) in the native kernels — decode (kernels/
paged_decode_attention_f32.c, the merge of a sequence's chunks) and prefill (kernels/
paged_prefill_attention_f32.c, the tile's last normalisation) — against the float64 oracle
(ops/attention_sinks.reference: one query and head at a time, the sink an extra softmax
entry): mixed batches of decode rows (one to three chunks) and prefill chunks, GQA / MQA /
MHA, windows, head dims 16 / 64, sinks from far below to far above the scores."""

from __future__ import annotations

import functools

import pytest
import torch

from infergen.kvcache.paged_cache import KVLayer
from infergen.ops import attention_sinks
from infergen.ops import paged_attention as pa
from infergen.ops.attention_sinks import SinkCore
from infergen.ops.paged_prefill_native import native_prefill_serves
from tests.ops.test_paged_prefill_native import _case

DECODE = pa.DECODE_BACKENDS.get("native")
PREFILL = pa.PREFILL_BACKENDS.get("native")


def _oracle(q, k, v, starts, seq_lens, tables, sinks, scale, window):
    """Each sequence's rows by attention_sinks.reference over its context read from the pool."""
    block_size = k.shape[1]
    out = torch.empty_like(q)
    for i, ctx in enumerate(seq_lens):
        positions = torch.arange(ctx)
        blocks = tables[i, positions // block_size]
        keys, values = k[blocks, positions % block_size], v[blocks, positions % block_size]
        rows = slice(starts[i], starts[i + 1])
        out[rows] = attention_sinks.reference(q[rows], keys, values, sinks, scale, window)
    return out


CASES = [
    # (query_lens, seq_lens, kv_heads, group, dim, block_size, window)
    ([1, 1, 1, 1], [1, 9, 129, 300], 2, 3, 64, 16, None),  # decode rows of 1, 2 and 3 chunks
    ([1, 1], [40, 260], 1, 8, 16, 4, 24),  # MQA, a window
    ([12, 1, 5], [12, 50, 70], 2, 2, 16, 4, None),  # a prompt, a decode row, a chunk
    ([33], [90], 4, 1, 64, 16, 20),  # MHA, a chunk after cached context, a window
]


@pytest.mark.parametrize("query_lens, seq_lens, kv_heads, group, dim, block_size, window", CASES)
def test_native_kernels_with_sinks_match_the_float64_oracle(
    query_lens, seq_lens, kv_heads, group, dim, block_size, window
):
    q, k, v, tables, starts, k_new, v_new = _case(
        query_lens, seq_lens, kv_heads, group, dim, block_size, seed=dim + len(seq_lens)
    )
    heads = kv_heads * group
    sinks = torch.randn(heads, generator=torch.Generator().manual_seed(heads)) * 2
    sinks[0] = 30.0  # a head that puts nearly all its weight on the sink
    plan = pa.plan(starts, seq_lens, tables, block_size, window)
    scale = pa.default_scale(dim)
    core = SinkCore(sinks)
    if plan.prefills:
        assert native_prefill_serves(q, KVLayer(k, v), core, plan)
    decode = functools.partial(DECODE, core=core)
    got = pa.paged_attention(q, k_new, v_new, k, v, plan, scale, decode, None, core, None, PREFILL)
    want = _oracle(q, k, v, starts, seq_lens, tables, sinks, scale, window)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the torch rows with the same core agree (the engine's fallback where no kernel serves)
    torch_decode = functools.partial(pa.DECODE_BACKENDS.get("torch"), core=core)
    slow = pa.paged_attention(q, k_new, v_new, k, v, plan, scale, torch_decode, None, core)
    torch.testing.assert_close(slow, want, rtol=1e-5, atol=1e-5)
