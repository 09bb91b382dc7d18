"""Partial-block reuse for attention-only models (kvcache/state_checkpoints.py "tails"): the
partial block where a prompt ends or a sequence finishes is kept, so a longer prompt — a
conversation's next turn: prompt + answer + new tokens — resumes after the last computed
token, not at the last full block.

Oracle: the same engine with prefix caching off (a cold, full run, itself checked against
transformers in tests/models/test_architectures_hf.py): greedy tokens identical and logprobs
within 1e-5, for Llama (one cache group), Gemma-3 (sliding-window and full groups) and
DeepSeek-V2 (MLA's latent cache); from the pool, the host tier, and disk after a restart."""

from __future__ import annotations

import pytest

from infergen import LLM, SamplingParams
from tests.hf_models import build_hf_model
from tests.kvcache.test_state_checkpoints import BLOCK, GREEDY, _assert_same, _tokens

FAMILIES = ("llama_gqa", "gemma3", "deepseek_v2")


@pytest.fixture(scope="module", params=FAMILIES)
def model(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    build_hf_model(request.param, directory)
    cold = LLM(str(directory), block_size=BLOCK, enable_prefix_caching=False)
    return str(directory), cold


def _llm(path: str, **options) -> LLM:
    return LLM(path, block_size=BLOCK, max_num_batched_tokens=64, **options)


def test_the_next_turn_resumes_after_the_answer(model):
    """A finished turn leaves its partial block: the next turn reuses every computed token
    (the answer's last token, never computed, is the first one recomputed)."""
    path, cold = model
    llm = _llm(path)
    prompt = _tokens(10, 3)
    answer = llm.generate(prompt, GREEDY)[0].token_ids
    computed = len(prompt) + len(answer) - 1
    assert computed % BLOCK  # (a tail: inside a block)
    turn = prompt + answer + _tokens(6, 4)
    out = llm.generate(turn, GREEDY)[0]
    assert out.num_cached_prompt_tokens == computed
    assert llm.engine.scheduler.checkpoints.stats["tokens_resumed"] == computed
    _assert_same(out, cold.generate(turn, GREEDY)[0])


@pytest.mark.parametrize("shared", [BLOCK * 3 + 1, BLOCK * 3 + 3, 2])
def test_a_longer_prompt_resumes_at_a_prompt_end(model, shared):
    """A prompt ending inside a block (or inside the first block) keeps its tail; a prompt
    extending it resumes there."""
    path, cold = model
    llm = _llm(path)
    first = _tokens(shared, 1)
    llm.generate(first, SamplingParams(max_tokens=1, temperature=0))
    prompt = first + _tokens(7, 2)
    out = llm.generate(prompt, GREEDY)[0]
    assert out.num_cached_prompt_tokens == shared
    _assert_same(out, cold.generate(prompt, GREEDY)[0])


def test_a_tail_needs_its_full_blocks(model):
    """A tail resumes only after the full blocks before it: a prompt that shares the tail's
    tokens but not the blocks before it (another first block) finds nothing."""
    path, _ = model
    llm = _llm(path)
    head, tail = _tokens(BLOCK, 5), _tokens(3, 6)
    llm.generate(head + tail, SamplingParams(max_tokens=1, temperature=0))
    other = _tokens(BLOCK, 7) + tail + _tokens(4, 8)
    assert llm.generate(other, GREEDY)[0].num_cached_prompt_tokens == 0


def test_tails_go_through_the_tiers_and_survive_a_restart(model, tmp_path):
    """With no memory of their own (every tail goes straight down) the tails are found in the
    host tier; with a disk tier written through, a restarted engine resumes from disk."""
    path, cold = model
    prompt = _tokens(11, 9)
    turn = prompt + _tokens(5, 10)
    ref = cold.generate(turn, GREEDY)[0]

    llm = _llm(path, state_checkpoint_memory="1B", kv_offload_memory="64MiB")
    llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0))
    out = llm.generate(turn, GREEDY)[0]
    assert out.num_cached_prompt_tokens == len(prompt)
    assert llm.engine.kv_tiers.states_loaded >= 1
    _assert_same(out, ref)

    options = dict(kv_offload_dir=str(tmp_path), kv_offload_write_through=True)
    _llm(path, **options).generate(prompt, SamplingParams(max_tokens=1, temperature=0))
    restarted = _llm(path, **options)
    out = restarted.generate(turn, GREEDY)[0]
    assert out.num_cached_prompt_tokens == len(prompt)
    _assert_same(out, ref)


def test_no_checkpoint_memory_means_full_blocks_only(model):
    path, _ = model
    llm = _llm(path, state_checkpoint_memory="0")
    prompt = _tokens(10, 11)
    llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0))
    out = llm.generate(prompt + [5, 6, 7], GREEDY)[0]
    assert out.num_cached_prompt_tokens == len(prompt) // BLOCK * BLOCK
