"""Architectures beyond the Llama-shaped layer against transformers: logits within
1e-4 × max |logit| in fp32 and 32 greedy tokens identical, with prompts longer than the window
(small blocks, so windowed cache groups let blocks go while the sequence runs)."""

from __future__ import annotations

import pytest
import torch

from infergen import LLM, SamplingParams
from tests.hf_models import ARCH_VARIANTS, assert_prefill_matches, build_hf_model, hf_greedy


@pytest.fixture(scope="module", params=sorted(ARCH_VARIANTS))
def pair(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    hf_model = build_hf_model(request.param, directory)
    llm = LLM(str(directory), kv_cache_memory="16MiB", block_size=4, max_num_batched_tokens=64)
    return request.param, hf_model, llm


def test_prefill_logits_match_transformers(pair):
    # chunks of 16 attend over cached blocks, some of them already out of the window
    assert_prefill_matches(*pair)


@pytest.mark.parametrize("prompt_len", [5, 23])
def test_greedy_generation_matches_transformers(pair, prompt_len):
    name, hf_model, llm = pair
    torch.manual_seed(prompt_len)
    prompt = torch.randint(0, hf_model.config.vocab_size, (prompt_len,)).tolist()
    out = llm.generate(prompt, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    assert out[0].token_ids == hf_greedy(hf_model, prompt, 32), name
