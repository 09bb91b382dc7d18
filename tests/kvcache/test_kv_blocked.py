"""Block-quantized KV cache formats (kvcache/kv_blocked.py): KIVI int4 / int2, NVFP4.

Oracles: the codecs against numpy (min-max rounding with fp16 scale and minimum, keys per
channel over the block's tokens, values per token) and infergen.formats' NVFP4 rule; paged
attention over the cache against a float64 attention whose keys / values are, per query, its
own block in fp32 and every earlier block dequantized (the KIVI window rule); a one-shot
prefill, chunked prefill and token-by-token decoding of the same K / V agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from infergen import LLM, SamplingParams
from infergen.config import ModelConfig
from infergen.errors import InfergenError
from infergen.kvcache.kv_format import KV_FORMATS
from infergen.kvcache.paged_cache import PagedKVCache
from infergen.ops.kv_store import kv_store
from infergen.ops.paged_attention import decode_attention, paged_attention, plan
from tests.hf_models import BASE

FORMATS = ["int4_kivi", "int2_kivi", "nvfp4"]


def _minmax_numpy(x: np.ndarray, axis: int, bits: int) -> np.ndarray:
    qmax = 2**bits - 1
    lo, hi = x.min(axis=axis, keepdims=True), x.max(axis=axis, keepdims=True)
    scale = ((hi - lo) / qmax).astype(np.float16).astype(np.float32)
    lo = lo.astype(np.float16).astype(np.float32)
    q = np.clip(np.rint((x - lo) / np.where(scale > 0, scale, 1)), 0, qmax)
    return q * scale + lo


@pytest.mark.parametrize("name,bits", [("int4_kivi", 4), ("int2_kivi", 2)])
def test_kivi_codec_against_numpy(name, bits):
    fmt = KV_FORMATS.get(name)
    x = torch.randn(3, 16, 2, 64, generator=torch.Generator().manual_seed(0))
    x[:, :, :, 5] += 8.0  # an outlier channel: per-channel key ranges absorb it
    for keys, axis in ((True, 1), (False, 3)):
        got = fmt.decode(fmt.encode(x, keys), keys)
        expected = torch.from_numpy(_minmax_numpy(x.numpy(), axis, bits))
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    shapes = fmt.shapes(16, 2, 64, True)
    assert shapes["codes"][0] == (16, 2, 64 * bits // 8)


def test_nvfp4_codec_against_formats():
    from infergen.formats import dequantize, quantize

    fmt = KV_FORMATS.get("nvfp4")
    x = torch.randn(2, 16, 3, 32, generator=torch.Generator().manual_seed(1))
    got = fmt.decode(fmt.encode(x, True), True)
    for n in range(2):
        for h in range(3):
            block = x[n, :, h]  # one (block, head): NVFP4 with its own tensor scale
            expected = dequantize(quantize(block.contiguous(), "nvfp4", axis=-1))
            torch.testing.assert_close(got[n, :, h], expected, rtol=1e-6, atol=1e-7)


def _config() -> ModelConfig:
    return ModelConfig(architecture="llama", head_dim=32, num_key_value_heads=2, **BASE)


def _reference(q, keys, dequantized, block, scale):
    """float64: query p reads its own block from `keys`, earlier blocks from `dequantized`."""
    ctx, q_len = keys[0].shape[0], q.shape[0]
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = q.shape[1] // keys[0].shape[1]
    for t in range(q_len):
        p = ctx - q_len + t
        own = p // block * block
        k = torch.cat([dequantized[0][:own], keys[0][own : p + 1]]).double()
        v = torch.cat([dequantized[1][:own], keys[1][own : p + 1]]).double()
        for h in range(q.shape[1]):
            w = torch.softmax(k[:, h // group] @ q[t, h].double() * scale, dim=0)
            out[t, h] = w @ v[:, h // group]
    return out


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("chunks", [[37], [5, 16, 16], [1] * 37])
def test_paged_attention_follows_the_window_rule(name, chunks):
    block, ctx, heads = 8, sum(chunks), 4
    config = _config()
    cache = PagedKVCache(config, 12, block, torch.float32, name, tail_slots=6)
    layer = cache.layer(0)
    gen = torch.Generator().manual_seed(len(chunks))
    k = torch.randn(ctx, 2, 32, generator=gen)
    v = torch.randn(ctx, 2, 32, generator=gen)
    q = torch.randn(ctx, heads, 32, generator=gen)
    table = torch.tensor([[7, 2, 9, 4, 0]])  # block ids out of order
    slots_all = table[0, torch.arange(ctx) // block] * block + torch.arange(ctx) % block
    outs, start = [], 0
    for n in chunks:
        slots = slots_all[start : start + n]
        cache.begin_step(slots)
        kv_store(k[start : start + n], v[start : start + n], layer.k, layer.v, slots, layer)
        p = plan([0, n], [start + n], table, block, None)
        fn = decode_attention if n == 1 else None
        outs.append(paged_attention(q[start : start + n], k[start : start + n],
                                    v[start : start + n], layer.k, layer.v, p, 0.3, fn, layer,
                                    new_slots=slots))  # fmt: skip
        start += n
    got = torch.cat(outs)
    fmt = KV_FORMATS.get(name)
    full = ctx // block * block  # the complete blocks, as stored
    deq = [
        fmt.decode(fmt.encode(t[:full].view(-1, block, 2, 32), keys=i == 0), keys=i == 0).reshape(
            full, 2, 32
        )
        for i, t in enumerate((k, v))
    ]
    expected = _reference(q, (k, v), deq, block, 0.3)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def test_engine_capacity_and_errors(tmp_path):
    from tests.hf_models import build_hf_model

    build_hf_model("llama_gqa", tmp_path)
    fp32 = LLM(str(tmp_path), kv_cache_memory="4MiB")
    for name in FORMATS:
        llm = LLM(str(tmp_path), kv_cache_memory="4MiB", kv_format=name)
        assert llm.engine.kv_capacity_tokens > 3 * fp32.engine.kv_capacity_tokens, name
        assert llm.engine.kv_cache.nbytes <= 4 << 20
        params = SamplingParams(max_tokens=40, ignore_eos=True)  # across several blocks
        out = llm.generate([[1, 2, 3], [4, 5], [6]], params)
        assert all(len(o.token_ids) == 40 for o in out)
    with pytest.raises(InfergenError, match="unknown KV cache format"):
        LLM(str(tmp_path), kv_format="int3_kivi")


def test_tails_grow_when_more_blocks_open_than_set_aside():
    cache = PagedKVCache(_config(), 12, 8, torch.float32, "int4_kivi", tail_slots=1)
    slots = torch.arange(40)  # five blocks written in one step
    cache.begin_step(slots)
    layer = cache.layer(0)
    k = torch.randn(40, 2, 32)
    kv_store(k, k, layer.k, layer.v, slots, layer)
    keys, _ = layer.own_store.gather(slots, torch.ones(40, dtype=torch.bool))
    assert torch.equal(keys, k)  # every open block's fp32 values kept
    assert cache.pool.tail.shape[2] >= 5
