"""The check shared by the prefill rows' tests: where a row's kernel cannot serve — another
attention core (learned sink logits), an FP8-coded cache — the row computes what the torch row
does, bit for bit."""

from __future__ import annotations

import functools

import torch

from infergen.kvcache.kv_format import KV_FORMATS, encode
from infergen.kvcache.paged_cache import KVLayer
from infergen.ops import paged_attention as pa
from infergen.ops.attention_sinks import sink_attention


def assert_falls_back_to_torch(row, q, k_new, v_new, k, v, plan, scale) -> None:
    kv_heads, heads = k.shape[2], q.shape[1]
    core = functools.partial(sink_attention, sinks=torch.randn(1, heads, 1, 1))
    want = pa.paged_attention(q, k_new, v_new, k, v, plan, scale, core=core)
    got = pa.paged_attention(q, k_new, v_new, k, v, plan, scale, core=core, prefill_fn=row)
    assert not torch.allclose(want, pa.paged_attention(q, k_new, v_new, k, v, plan, scale))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    fp8 = KV_FORMATS.get("fp8_e4m3")
    k_scale, v_scale = torch.full((kv_heads,), 0.01), torch.full((kv_heads,), 0.02)
    kv = KVLayer(encode(k, k_scale, fp8), encode(v, v_scale, fp8), k_scale, v_scale, fp8)
    want = pa.paged_attention(q, k_new, v_new, kv.k, kv.v, plan, scale, kv=kv)
    got = pa.paged_attention(q, k_new, v_new, kv.k, kv.v, plan, scale, kv=kv, prefill_fn=row)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
