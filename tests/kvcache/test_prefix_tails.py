"""Partial-block reuse for attention-only models (kvcache/state_checkpoints.py "tails"): the
partial block where a prompt ends or a sequence finishes is kept, so a longer prompt — a
conversation's next turn: prompt + answer + new tokens — resumes after the last computed
token, not at the last full block.

Resuming at a prompt end and after a finished turn, from the pool, the host tier and disk
after a restart, is checked against a cold run with the recurrent models' checkpoints
(tests/kvcache/test_state_checkpoints.py, `any_model`: Llama, Gemma-3 with sliding and full
groups, DeepSeek-V2's MLA). Here: what is particular to tails."""

from __future__ import annotations

import pytest

from infergen import SamplingParams
from tests.hf_models import build_hf_model
from tests.kvcache.test_state_checkpoints import ATTENTION, BLOCK, GREEDY, _llm, _tokens


@pytest.fixture(scope="module", params=ATTENTION)
def path(request, tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp(request.param)
    build_hf_model(request.param, directory)
    return str(directory)


def test_a_tail_needs_its_full_blocks(path):
    """A tail resumes only after the full blocks before it: a prompt that shares the tail's
    tokens but not the blocks before it (another first block) finds nothing."""
    llm = _llm(path)
    head, tail = _tokens(BLOCK, 5), _tokens(3, 6)
    llm.generate(head + tail, SamplingParams(max_tokens=1, temperature=0))
    other = _tokens(BLOCK, 7) + tail + _tokens(4, 8)
    assert llm.generate(other, GREEDY)[0].num_cached_prompt_tokens == 0


def test_no_checkpoint_memory_means_full_blocks_only(path):
    llm = _llm(path, state_checkpoint_memory="0")
    prompt = _tokens(10, 11)
    llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0))
    out = llm.generate(prompt + [5, 6, 7], GREEDY)[0]
    assert out.num_cached_prompt_tokens == len(prompt) // BLOCK * BLOCK
