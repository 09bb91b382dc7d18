"""Architectures beyond the Llama-shaped layer against transformers: logits within
1e-4 × max |logit| in fp32 and 32 greedy tokens identical, with prompts longer than the window
(small blocks, so windowed cache groups let blocks go while the sequence runs)."""

from __future__ import annotations

import pytest
import torch

from infergen import LLM, SamplingParams
from tests.hf_models import ARCH_VARIANTS, build_hf_model


@pytest.fixture(scope="module", params=sorted(ARCH_VARIANTS))
def pair(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    hf_model = build_hf_model(request.param, directory)
    llm = LLM(str(directory), kv_cache_memory="16MiB", block_size=4, max_num_batched_tokens=64)
    return request.param, hf_model, llm


def test_prefill_logits_match_transformers(pair):
    name, hf_model, llm = pair
    torch.manual_seed(1)
    tokens = torch.randint(0, hf_model.config.vocab_size, (40,)).tolist()
    with torch.no_grad():
        expected = hf_model(torch.tensor([tokens])).logits[0]
    # chunks of 16 attend over cached blocks, some of them already out of the window
    got = llm.engine.prompt_logits(tokens, chunk=16)
    tolerance = 1e-4 * expected.abs().max()
    assert (got - expected).abs().max() <= tolerance, name


@pytest.mark.parametrize("prompt_len", [5, 23])
def test_greedy_generation_matches_transformers(pair, prompt_len):
    name, hf_model, llm = pair
    torch.manual_seed(prompt_len)
    prompt = torch.randint(0, hf_model.config.vocab_size, (prompt_len,)).tolist()
    with torch.no_grad():
        expected = hf_model.generate(
            torch.tensor([prompt]),
            max_new_tokens=32,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    out = llm.generate(prompt, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    assert out[0].token_ids == expected, name
