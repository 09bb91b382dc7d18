"""Multi-head latent attention (layers/mla.py): the weight-absorbed form over the latent cache
equals the naive (decompressed) form, and the cache holds only latent + RoPE key per token."""

from __future__ import annotations

import pytest
import torch

from infergen import LLM
from infergen.layers.mla import naive_reference
from tests.hf_models import build_hf_model


@pytest.fixture(scope="module", params=["deepseek_v2", "deepseek_v3"])
def llm(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    build_hf_model(request.param, directory)
    return LLM(str(directory), kv_cache_memory="16MiB", block_size=4)


def test_absorbed_decode_equals_naive_prefill(llm):
    """One chunk of 30 new tokens runs the naive form; one token at a time runs the absorbed
    form over the latent cache for every token."""
    tokens = torch.randint(0, 211, (30,), generator=torch.Generator().manual_seed(0)).tolist()
    naive = llm.engine.prompt_logits(tokens, chunk=30)
    absorbed = llm.engine.prompt_logits(tokens, chunk=1)
    torch.testing.assert_close(absorbed, naive, rtol=1e-5, atol=1e-5 * naive.abs().max().item())


def test_layer_matches_the_decompressed_reference(llm):
    """The layer's output through the paged latent cache (chunks of 7: naive first, absorbed
    after) against the float64 decompressed oracle over the whole sequence."""
    model = llm.engine.runner.model
    layer = model.layers[1].attn
    captured = []
    layer.register_forward_hook(lambda m, args, out: captured.append((args[0].clone(), out)))
    tokens = torch.randint(0, 211, (20,), generator=torch.Generator().manual_seed(1)).tolist()
    llm.engine.prompt_logits(tokens, chunk=7)
    x = torch.cat([args for args, _ in captured])
    got = torch.cat([out for _, out in captured])
    want = naive_reference(layer, x, torch.arange(20), model.rope_cache)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_cache_holds_the_latent_and_rope_key_only(llm):
    config = llm.engine.model_config
    mla = config.mla
    storage = llm.engine.kv_cache.storage  # [layers, planes, blocks, block, heads, dim]
    assert storage.shape[1] == 1 and storage.shape[4:] == (1, mla.kv_lora_rank + 8)
    per_token = config.kv_bytes_per_token(4)
    mha = config.num_hidden_layers * 2 * config.num_attention_heads * (16 + 8) * 4
    assert per_token == config.num_hidden_layers * (mla.kv_lora_rank + 8) * 4 < mha / 7
