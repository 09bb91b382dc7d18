"""Logits of the generic decoder against transformers, for every architecture / head layout."""

from __future__ import annotations

import pytest
import torch

from infergen import LLM, SamplingParams
from tests.hf_models import VARIANTS, build_hf_model


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def pair(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    hf_model = build_hf_model(request.param, directory)
    llm = LLM(str(directory), kv_cache_memory="16MiB", max_num_batched_tokens=64)
    return request.param, hf_model, llm


def test_prefill_logits_match_transformers(pair):
    name, hf_model, llm = pair
    torch.manual_seed(1)
    tokens = torch.randint(0, hf_model.config.vocab_size, (40,)).tolist()
    with torch.no_grad():
        expected = hf_model(torch.tensor([tokens])).logits[0]
    # chunk of 16 exercises attention over cached blocks for later chunks
    got = llm.engine.prompt_logits(tokens, chunk=16)
    tolerance = 1e-4 * expected.abs().max()
    assert (got - expected).abs().max() <= tolerance, name


def test_greedy_generation_matches_transformers(pair):
    name, hf_model, llm = pair
    prompt = [3, 17, 42, 99, 5, 8, 150, 23, 77]
    with torch.no_grad():
        expected = hf_model.generate(
            torch.tensor([prompt]),
            max_new_tokens=20,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    out = llm.generate(prompt, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    assert out[0].token_ids == expected, name
