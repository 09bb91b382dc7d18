"""Metamorphic engine tests on tiny random models: scheduling must not change results.

batched = one at a time; chunked prefill = unchunked; prefix-cache hit = cold run;
forced preemption (tiny KV pool) = no preemption = reserving admission; seeded sampling
independent of the batch.
Run on a Llama (GQA, one cache group), Gemma-3 (sliding-window layers with window 8 in their
own cache groups, which let blocks go while a sequence runs), GPT-OSS (alternating windows,
sinks, MoE), DeepSeek-V3 (latent attention cache, MoE), and the models with recurrent state
slots: Qwen3-Next (DeltaNet + attention), Falcon-H1 (attention beside an SSM), Mamba2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from infergen import LLM, SamplingParams
from tests.engine.greedy import assert_greedy_equivalent
from tests.hf_models import build_hf_model

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=2)


# the model → a KV pool (blocks of 4) that forces preemption but fits every request alone
# (mamba2 has no KV blocks: its sequences queue for state slots instead of being preempted)
TIGHT_BLOCKS = {"llama_gqa": 26, "gemma3": 60, "gpt_oss": 50, "deepseek_v3": 26,
                "qwen3_next": 26, "falcon_h1": 26, "mamba2": None}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(TIGHT_BLOCKS))
def model_dir(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param + "-")
    build_hf_model(request.param, directory)
    return str(directory)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = [3, 70, 17, 33, 1, 48, 9, 25][:n]
    return [torch.randint(0, 211, (L,), generator=gen).tolist() for L in lengths]


def test_batched_equals_one_at_a_time(model_dir):
    prompts = _prompts(8)
    llm = LLM(model_dir, max_num_batched_tokens=64, max_num_seqs=5, block_size=4)
    batched = llm.generate(prompts, GREEDY)
    for prompt, out in zip(prompts, batched, strict=True):
        alone = llm.generate(prompt, GREEDY)[0]
        assert_greedy_equivalent(out, alone)


def test_chunked_prefill_equals_unchunked(model_dir):
    prompts = _prompts(4, seed=1)
    chunked = LLM(model_dir, max_num_batched_tokens=7, block_size=4).generate(prompts, GREEDY)
    whole = LLM(model_dir, max_num_batched_tokens=512, block_size=4).generate(prompts, GREEDY)
    for a, b in zip(chunked, whole, strict=True):
        assert_greedy_equivalent(a, b)


@pytest.mark.parametrize("weights", [None, "int8"])
def test_prompt_longer_than_the_token_budget_alone(model_dir, weights):
    """One prompt over several steps with no other sequence: the steps before its last chunk
    sample nothing (no logits rows), and the result equals the unchunked run."""
    prompt = torch.randint(0, 211, (70,), generator=torch.Generator().manual_seed(9)).tolist()
    chunked = LLM(model_dir, max_num_batched_tokens=16, weights=weights).generate(prompt, GREEDY)
    whole = LLM(model_dir, max_num_batched_tokens=512, weights=weights).generate(prompt, GREEDY)
    assert_greedy_equivalent(chunked[0], whole[0])


def test_prefix_cache_hit_equals_cold_run(model_dir):
    shared = _prompts(2, seed=2)[1][:40]  # 40 shared tokens = 5 full blocks of 8
    first, second = shared + [1, 2, 3], shared + [7, 8, 9, 10]
    warm = LLM(model_dir, block_size=8)
    # recurrent layers resume only where their state was checkpointed: the first prompt's
    # end (no use to the second), and — the second's first chunk ending where the part it
    # shares with the first ends — block 5's end, which the first prompt's rerun resumes from
    recurrent = warm.engine.kv_cache.states is not None
    out_first = warm.generate(first, GREEDY)[0]
    assert out_first.num_cached_prompt_tokens == 0
    out_second = warm.generate(second, GREEDY)[0]
    assert out_second.num_cached_prompt_tokens == (0 if recurrent else 40)
    again = warm.generate(first, GREEDY)[0]  # 43 tokens: 5 full blocks reusable
    assert again.num_cached_prompt_tokens == 40
    cold = LLM(model_dir, block_size=8, enable_prefix_caching=False)
    cold_second = cold.generate(second, GREEDY)[0]
    assert cold_second.num_cached_prompt_tokens == 0
    assert_greedy_equivalent(out_second, cold_second)
    assert_greedy_equivalent(again, out_first)


def test_generated_blocks_are_cached_too(model_dir):
    """A follow-up prompt that extends prompt + answer reuses the answer's blocks."""
    llm = LLM(model_dir, block_size=4)
    prompt = _prompts(3, seed=4)[2]
    out = llm.generate(prompt, GREEDY)[0]
    follow = prompt + out.token_ids + [5, 6]
    hit = llm.generate(follow, GREEDY)[0]
    computed = len(prompt) + len(out.token_ids) - 1  # the last sampled token had no KV yet
    # recurrent layers: the finished sequence's state was checkpointed after `computed`
    reusable = computed if llm.engine.kv_cache.states is not None else computed // 4 * 4
    assert hit.num_cached_prompt_tokens == reusable


def test_forced_preemption_equals_no_preemption(model_dir):
    prompts = _prompts(6, seed=3)
    roomy = LLM(model_dir, block_size=4).generate(prompts, GREEDY)
    blocks = TIGHT_BLOCKS[Path(model_dir).name.rsplit("-", 1)[0]]
    if blocks is None:  # no KV blocks: two state slots, the other sequences wait for one
        tight = LLM(model_dir, block_size=4, max_num_seqs=2, max_num_batched_tokens=32)
    else:
        tight = LLM(model_dir, block_size=4, num_kv_blocks=blocks, max_num_batched_tokens=32)
    squeezed = tight.generate(prompts, GREEDY)
    engine = tight.engine
    if blocks is not None:
        assert engine.scheduler.num_preemptions > 0
        assert engine.pool.num_free == blocks  # everything released at the end
    if engine.kv_cache.states is not None:  # every state slot back too
        assert engine.kv_cache.states.num_free == engine.kv_cache.states.num_slots
    for a, b in zip(squeezed, roomy, strict=True):
        assert_greedy_equivalent(a, b)


def test_reserving_admission_equals_optimistic(model_dir):
    """Admission reserving each request's whole KV (the same tight pool): never preempts,
    releases every reservation, and generates what optimistic admission generates."""
    prompts = _prompts(6, seed=3)
    blocks = TIGHT_BLOCKS[Path(model_dir).name.rsplit("-", 1)[0]]
    tight = dict(num_kv_blocks=blocks, max_num_batched_tokens=32) if blocks else {}
    optimistic = LLM(model_dir, block_size=4, **tight).generate(prompts, GREEDY)
    llm = LLM(model_dir, block_size=4, admission="reserve", **tight)
    reserved = llm.generate(prompts, GREEDY)
    scheduler = llm.engine.scheduler
    assert scheduler.num_preemptions == 0 and scheduler.reserved_blocks == 0
    for a, b in zip(reserved, optimistic, strict=True):
        assert_greedy_equivalent(a, b)


def test_seeded_sampling_is_independent_of_batch(model_dir):
    llm = LLM(model_dir)
    prompts = _prompts(5, seed=5)
    params = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, seed=1234, ignore_eos=True)
    alone = llm.generate(prompts[0], params)[0]
    together = llm.generate(
        prompts, [params] + [SamplingParams(max_tokens=9, seed=i) for i in range(4)]
    )
    assert together[0].token_ids == alone.token_ids
    again = llm.generate(prompts[0], params)[0]
    assert again.token_ids == alone.token_ids
    other = llm.generate(
        prompts[0], SamplingParams(max_tokens=16, temperature=0.9, seed=99, ignore_eos=True)
    )[0]
    assert other.token_ids != alone.token_ids


def test_max_tokens_and_stop_token_ids(model_dir):
    llm = LLM(model_dir)
    prompt = _prompts(1)[0]
    free = llm.generate(prompt, GREEDY)[0]
    assert len(free.token_ids) == 24 and free.finish_reason == "length"
    stop_at = free.token_ids[5]
    first = free.token_ids.index(stop_at)
    stopped = llm.generate(
        prompt, SamplingParams(max_tokens=24, temperature=0, stop_token_ids=[stop_at])
    )[0]
    assert stopped.token_ids == free.token_ids[: first + 1]
    assert stopped.finish_reason == "stop"
