"""Logits of the generic decoder against transformers, for every architecture / head layout."""

from __future__ import annotations

import pytest

from infergen import LLM, SamplingParams
from tests.hf_models import VARIANTS, assert_prefill_matches, build_hf_model, hf_greedy


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def pair(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    hf_model = build_hf_model(request.param, directory)
    llm = LLM(str(directory), kv_cache_memory="16MiB", max_num_batched_tokens=64)
    return request.param, hf_model, llm


def test_prefill_logits_match_transformers(pair):
    # chunk of 16 exercises attention over cached blocks for later chunks
    assert_prefill_matches(*pair)


def test_greedy_generation_matches_transformers(pair):
    name, hf_model, llm = pair
    prompt = [3, 17, 42, 99, 5, 8, 150, 23, 77]
    out = llm.generate(prompt, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    assert out[0].token_ids == hf_greedy(hf_model, prompt, 20), name
