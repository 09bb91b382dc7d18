"""Quantized KV cache (kvcache/kv_format.py, kvcache/calibrate.py): FP8 E4M3 codes with one
static scale per (layer, K/V, KV head).

Oracles: codes are ml_dtypes' float8_e4m3fn of the saturated x / scale; paged attention over
the codes equals the explicit-softmax reference over a cache holding the decoded values; the
engine keeps every metamorphic property of the fp32 cache (chunked = unchunked prefill,
prefix-cache hit = cold run, batched = alone), holds 4x the tokens of fp32 in the same
memory, and stays within the format's error of the fp32 engine's logits."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from infergen import LLM, SamplingParams
from infergen.errors import ConfigError, InfergenError
from infergen.kvcache.kv_format import KV_FORMATS, decode, encode
from infergen.kvcache.paged_cache import KVLayer
from infergen.ops import paged_attention as pa
from infergen.ops.kv_store import kv_store
from tests.hf_models import build_hf_model
from tests.ops.test_paged_attention import CASES, _scatter_batch

FP8 = KV_FORMATS.get("fp8_e4m3")


def test_encode_matches_ml_dtypes():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300, 3, 16, generator=gen) * torch.tensor([1.0, 30.0, 1e-3])[:, None]
    x[0, 0, :4] = torch.tensor([1e9, -1e9, 0.0, -0.0])  # saturation and signed zeros
    scale = torch.tensor([0.01, 0.05, 1e-5])
    codes = encode(x, scale, FP8)
    ratio = (x / scale[:, None]).numpy()
    expected = np.clip(ratio, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    assert codes.dtype == torch.float8_e4m3fn
    assert np.array_equal(codes.view(torch.uint8).numpy(), expected.view(np.uint8))
    assert torch.equal(decode(codes, scale, torch.float32), codes.float() * scale[:, None])


@pytest.mark.parametrize("backend", ["torch", "native"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
@pytest.mark.parametrize("case", CASES)
def test_attention_over_codes_equals_reference_on_decoded_cache(case, heads, kv_heads, backend):
    query_lens, seq_lens = case
    q, k_new, v_new, kc, vc, qsl, tables, plan = _scatter_batch(
        query_lens, seq_lens, heads, kv_heads, 8, 4, None
    )
    k_scale, v_scale = torch.rand(kv_heads) * 0.01 + 0.002, torch.rand(kv_heads) * 0.01 + 0.002
    shift = torch.randn(kv_heads, 8) * 3  # keys stored smoothed: minus a per-channel shift
    codes = encode(kc, k_scale, FP8, shift), encode(vc, v_scale, FP8)
    kv = KVLayer(*codes, k_scale, v_scale, FP8, shift)
    got = pa.paged_attention(
        q, k_new, v_new, kv.k, kv.v, plan, 0.3, pa.DECODE_BACKENDS.get(backend), kv
    )
    # the oracle sees the keys the codes stand for, shift added back: softmax ignores it
    k_dec = decode(kv.k, k_scale, torch.float32) + shift
    v_dec = decode(kv.v, v_scale, torch.float32)
    expected = pa.reference(q, k_dec, v_dec, qsl, seq_lens, tables, 0.3)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_kv_store_writes_codes():
    k_cache = torch.zeros(4, 4, 2, 8, dtype=torch.float8_e4m3fn)
    v_cache = torch.zeros_like(k_cache)
    k, v = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    scales = torch.tensor([0.01, 0.02]), torch.tensor([0.03, 0.04])
    kv = KVLayer(k_cache, v_cache, *scales, FP8)
    kv_store(k, v, k_cache, v_cache, torch.tensor([0, 5, 14]), kv)
    flat = k_cache.view(-1, 2, 8)
    assert torch.equal(
        flat[[0, 5, 14]].view(torch.uint8), encode(k, scales[0], FP8).view(torch.uint8)
    )
    assert torch.equal(
        v_cache.view(-1, 2, 8)[[0, 5, 14]].view(torch.uint8),
        encode(v, scales[1], FP8).view(torch.uint8),
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    build_hf_model("llama_gqa", path)
    return str(path)


def test_engine_capacity_scales_and_accuracy(tiny):
    fp32 = LLM(tiny, kv_cache_memory="4MiB")
    fp8 = LLM(tiny, kv_cache_memory="4MiB", kv_format="fp8_e4m3")
    tokens32, tokens8 = fp32.engine.kv_capacity_tokens, fp8.engine.kv_capacity_tokens
    assert 4 * tokens32 <= tokens8 < 4 * (tokens32 + 16)  # 16: a block's rounding
    assert fp8.engine.kv_cache.storage.dtype == torch.float8_e4m3fn
    cache = fp8.engine.kv_cache
    scales, shift = cache.scales, cache.k_shift
    assert torch.isfinite(scales).all() and (scales > 0).all() and (scales != 1).all()
    # calibrated on the same text again: the mean key, and the largest |K - mean| and |V| at
    # the top code, per layer and head
    from infergen.kvcache.calibrate import calibration_tokens

    ids = calibration_tokens(None, 211, 511)
    scratch = LLM(tiny, kv_cache_memory="4MiB")
    scratch.engine.prompt_logits(ids)
    slots = scratch.engine.kv_cache.storage.flatten(2, 3)
    used = slots[:, :, slots.abs().amax(dim=(0, 1, 3, 4)) > 0]
    assert used.shape[2] == len(ids)
    torch.testing.assert_close(shift, used[:, 0].mean(dim=1))
    keys = (used[:, 0] - shift[:, None]).abs().amax(dim=(1, 3))
    torch.testing.assert_close(scales[:, 0], keys / 448)
    torch.testing.assert_close(scales[:, 1], used[:, 1].abs().amax(dim=(1, 3)) / 448)
    tokens = torch.randint(0, 211, (60,), generator=torch.Generator().manual_seed(1)).tolist()
    ref, got = fp32.engine.prompt_logits(tokens), fp8.engine.prompt_logits(tokens)
    err = (got - ref).abs().max() / ref.abs().max()
    assert 0 < err < 0.05  # changed, by FP8's ~2^-4 relative rounding of K / V at most


def test_engine_metamorphic_with_fp8_cache(tiny):
    llm = LLM(tiny, kv_cache_memory="4MiB", kv_format="fp8_e4m3")
    engine = llm.engine
    tokens = torch.randint(0, 211, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    whole = engine.prompt_logits(tokens)
    torch.testing.assert_close(engine.prompt_logits(tokens, chunk=7), whole, rtol=1e-5, atol=1e-5)
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = [tokens[:30], tokens[5:25], tokens[:30] + [3, 4]]
    alone = [llm.generate([p], greedy)[0].token_ids for p in prompts]
    batched = llm.generate(prompts, greedy)
    assert [o.token_ids for o in batched] == alone
    assert batched[2].num_cached_prompt_tokens > 0  # a prefix-cache hit, same tokens


def test_fused_decode_with_fp8_cache_equals_per_op_path(tiny):
    """The fused decode driver stores codes and reads them (kernels/decode_layers_f32.c) as the
    per-op path does (torch encode, native decode attention), bit for bit."""
    llm = LLM(tiny, kv_cache_memory="4MiB", kv_format="fp8_e4m3")
    engine = llm.engine
    tokens = torch.randint(0, 211, (30,), generator=torch.Generator().manual_seed(4)).tolist()
    fused = engine.prompt_logits(tokens, chunk=1)
    assert engine.runner.model.fast_path_for(engine.kv_cache).available
    engine.runner.model.fast_path = None
    assert torch.equal(fused, engine.prompt_logits(tokens, chunk=1))


def test_unknown_kv_format():
    with pytest.raises(InfergenError, match="unknown KV cache format 'fp7'"):
        LLM(kv_format="fp7")


@pytest.mark.parametrize("kv_format", ["fp8_e4m3", "int4_kivi"])
def test_a_latent_cache_is_refused_before_calibration(kv_format, tmp_path):
    """DeepSeek's MLA cache holds one latent entry per token, not K and V per head: a clear
    error, before the FP8 scales' calibration (which indexed a V plane it does not have)."""
    build_hf_model("deepseek_v2", tmp_path)
    with pytest.raises(ConfigError, match="latent"):
        LLM(str(tmp_path), kv_format=kv_format)


@pytest.mark.parametrize("name", ["gemma3", "gpt_oss"])
def test_windowed_models_calibrate_every_layer(name, tmp_path, monkeypatch):
    """Sliding-window and full layers (cache groups whose j-th layers share a page slot): the
    engine builds with FP8, every layer has its scales and key shift, and none saturates on
    the calibration text: each layer's |K - shift| and |V|, recorded as its attention stores
    them in an fp32 engine, stay within its scale times the top code. And the logits are as
    close to fp32's as with each layer calibrated on its own recorded K / V (these tiny
    random models lose ~10-20 % in FP8 either way)."""
    from infergen.kvcache.calibrate import calibration_tokens
    from infergen.layers import attention

    build_hf_model(name, tmp_path)
    fp8 = LLM(str(tmp_path), kv_cache_memory="4MiB", kv_format="fp8_e4m3")
    cache = fp8.engine.kv_cache
    layers = fp8.engine.runner.model.config.num_hidden_layers
    assert cache.scales.shape[0] == layers and cache.k_shift.shape[0] == layers
    fp32 = LLM(str(tmp_path), kv_cache_memory="4MiB")
    stored: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = attention.kv_store

    def recording(k, v, *args, **kwargs):
        stored.append((k.detach().clone(), v.detach().clone()))
        return original(k, v, *args, **kwargs)

    monkeypatch.setattr(attention, "kv_store", recording)
    for layer in fp32.engine.runner.model.layers:  # (every layer through kv_store: without
        layer.attn.q_norm = layer.attn.q_norm or torch.nn.Identity()  # QK-norm, RoPE and the
        layer.attn.k_norm = layer.attn.k_norm or torch.nn.Identity()  # store are one op)
    fp32.engine.runner.model.fast_path = None
    ids = calibration_tokens(None, fp32.engine.runner.model.config.vocab_size, 511)
    fp32.engine.prompt_logits(ids)
    assert len(stored) % layers == 0 and stored
    own = []  # each layer's scales and shift from its own K / V
    for i in range(layers):
        keys = torch.cat([k for k, _ in stored[i::layers]])
        values = torch.cat([v for _, v in stored[i::layers]])
        top_k = (keys - cache.k_shift[i]).abs().amax(dim=(0, 2))
        top_v = values.abs().amax(dim=(0, 2))
        assert (top_k <= cache.scales[i, 0] * 448 * (1 + 1e-4)).all(), (i, top_k)
        assert (top_v <= cache.scales[i, 1] * 448 * (1 + 1e-4)).all(), (i, top_v)
        shift = keys.mean(dim=0)
        own.append(((keys - shift).abs().amax(dim=(0, 2)) / 448, top_v / 448, shift))
    tokens = torch.randint(0, 200, (60,), generator=torch.Generator().manual_seed(1)).tolist()
    ref, shared = fp32.engine.prompt_logits(tokens), fp8.engine.prompt_logits(tokens)
    with torch.no_grad():
        for i, (k_scale, v_scale, shift) in enumerate(own):
            cache.scales[i, 0], cache.scales[i, 1], cache.k_shift[i] = k_scale, v_scale, shift
    alone = fp8.engine.prompt_logits(tokens)
    err_shared = (shared - ref).abs().max() / ref.abs().max()
    err_alone = (alone - ref).abs().max() / ref.abs().max()
    assert 0 < err_shared <= 1.5 * err_alone, (err_shared, err_alone)
