"""Prefix reuse for models with recurrent layers (issue 23, item 5): a prompt resumes from a
checkpointed state (kvcache/state_checkpoints.py) and the KV blocks before it.

Oracle: the same engine with prefix caching off (a cold, full run, itself checked against
transformers in tests/models/test_architectures_hf.py): greedy tokens identical and logprobs
within 1e-5, for Mamba2 (no attention), Qwen3-Next and Falcon-H1 (hybrids), resumed at block
boundaries and inside a block, at the end of a part two earlier prompts shared, after a finished
turn, from the KV tiers (host, disk, and disk after a restart). The tests on `any_model` run
on attention-only models too, whose checkpoints are partial-block tails (Llama, Gemma-3 with
sliding and full groups, DeepSeek-V2's MLA; tests/kvcache/test_prefix_tails.py has the rest)."""

from __future__ import annotations

import pytest
import torch

from infergen import LLM, SamplingParams
from tests.hf_models import build_hf_model

BLOCK = 4
HYBRIDS = ("mamba2", "qwen3_next", "falcon_h1")
ATTENTION = ("llama_gqa", "gemma3", "deepseek_v2")
GREEDY = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logprobs=2)


def _model_and_cold_run(name: str, tmp_path_factory) -> tuple[str, LLM]:
    directory = tmp_path_factory.mktemp(name)
    build_hf_model(name, directory)
    cold = LLM(str(directory), block_size=BLOCK, enable_prefix_caching=False)
    return str(directory), cold


@pytest.fixture(scope="module", params=HYBRIDS)
def model(request, tmp_path_factory):
    return _model_and_cold_run(request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=HYBRIDS + ATTENTION)
def any_model(request, tmp_path_factory):
    return _model_and_cold_run(request.param, tmp_path_factory)


def _llm(path: str, **options) -> LLM:
    return LLM(path, block_size=BLOCK, max_num_batched_tokens=64, **options)


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(3, 120, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _assert_same(out, ref) -> None:
    assert out.token_ids == ref.token_ids
    for x, y in zip(out.logprobs, ref.logprobs, strict=True):
        assert dict(x.top).keys() == dict(y.top).keys()
        for token, logprob in dict(x.top).items():
            assert abs(logprob - dict(y.top)[token]) < 1e-5


@pytest.mark.parametrize("shared", [BLOCK * 3, BLOCK * 3 + 1, BLOCK * 3 + 3, 3])
def test_resume_at_a_prompt_end_equals_a_full_run(any_model, shared):
    """A prompt's end is checkpointed (a block boundary, inside a block, or inside the first
    block); a longer prompt resumes there with the same tokens and logprobs as a cold run."""
    path, cold = any_model
    llm = _llm(path)
    first = _tokens(shared, 1)
    llm.generate(first, SamplingParams(max_tokens=1, temperature=0))
    prompt = first + _tokens(7, 2)
    out = llm.generate(prompt, GREEDY)[0]
    assert out.num_cached_prompt_tokens == shared
    _assert_same(out, cold.generate(prompt, GREEDY)[0])


def test_the_next_turn_resumes_after_the_answer(any_model):
    """A finished sequence is checkpointed after its last computed token: the next turn
    (prompt + answer + new tokens) resumes there."""
    path, cold = any_model
    llm = _llm(path)
    prompt = _tokens(9, 3)
    answer = llm.generate(prompt, GREEDY)[0].token_ids
    turn = prompt + answer + _tokens(6, 4)
    out = llm.generate(turn, GREEDY)[0]
    assert out.num_cached_prompt_tokens == len(prompt) + len(answer) - 1
    _assert_same(out, cold.generate(turn, GREEDY)[0])


def test_a_shared_part_gets_its_own_checkpoint(model):
    """Two prompts share a system part that ends inside a block and then differ: the second
    one's first chunk ends at the shared part's last block boundary, so a third prompt with
    the same system part resumes there (not only at a prompt's end)."""
    path, cold = model
    llm = _llm(path)
    system = _tokens(2 * BLOCK + 2, 5)
    prompts = [system + [200 + i] + _tokens(5, 6 + i) for i in range(3)]
    outs = [llm.generate(p, GREEDY)[0] for p in prompts]
    assert [o.num_cached_prompt_tokens for o in outs] == [0, 0, 2 * BLOCK]
    _assert_same(outs[2], cold.generate(prompts[2], GREEDY)[0])


@pytest.mark.parametrize(
    "options", [{}, dict(kv_offload_memory="64MiB", preemption_mode="swap")], ids=["pool", "swap"]
)
def test_preempted_sequences_resume_from_their_state(model, options):
    """A pool too small for two sequences preempts one; it resumes from the checkpoint taken
    when it was preempted (with preemption_mode "swap" too: recurrent layers are not swapped,
    their checkpoint is), and every output equals the cold run's."""
    path, cold = model
    llm = _llm(path, num_kv_blocks=9, max_num_seqs=2, **options)
    prompts = [_tokens(14, 7), _tokens(13, 8)]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2)
    outs = llm.generate(prompts, params)
    if llm.engine.kv_cache.groups:  # (Mamba2 holds no KV blocks: nothing runs short)
        assert llm.engine.scheduler.num_preemptions > 0
        assert llm.engine.scheduler.checkpoints.stats["hits"] > 0
    for out, ref in zip(outs, cold.generate(prompts, params), strict=True):
        _assert_same(out, ref)


def test_states_spill_to_the_tiers_and_survive_a_restart(any_model, tmp_path):
    """With no memory of their own (every checkpoint goes straight down) the states are found
    in the host tier; with a disk tier written through, a restarted engine resumes from disk."""
    path, cold = any_model
    prompt = _tokens(11, 9)
    turn = prompt + _tokens(5, 10)
    ref = cold.generate(turn, GREEDY)[0]

    llm = _llm(path, state_checkpoint_memory="1B", kv_offload_memory="64MiB")
    llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0))
    out = llm.generate(turn, GREEDY)[0]
    assert out.num_cached_prompt_tokens == len(prompt)
    assert llm.engine.kv_tiers.states_loaded >= 1
    _assert_same(out, ref)

    for memory in ("1B", "1GiB"):  # spilled at once / kept, and written through to disk
        options = dict(state_checkpoint_memory=memory, kv_offload_dir=str(tmp_path / memory),
                       kv_offload_write_through=True)  # fmt: skip
        _llm(path, **options).generate(prompt, SamplingParams(max_tokens=1, temperature=0))
        restarted = _llm(path, **options)
        out = restarted.generate(turn, GREEDY)[0]
        assert out.num_cached_prompt_tokens == len(prompt), memory
        _assert_same(out, ref)


def test_no_checkpoint_memory_means_no_reuse(model):
    path, _ = model
    llm = _llm(path, state_checkpoint_memory="0")
    prompt = _tokens(10, 11)
    llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0))
    assert llm.generate(prompt + [5, 6, 7], GREEDY)[0].num_cached_prompt_tokens == 0


def test_checkpoint_counters_in_the_metrics_exposition(model):
    """/metrics' state-checkpoint families carry the store's counters (read back with
    prometheus_client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    from infergen.server.metrics import ServerMetrics

    path, _ = model
    llm = _llm(path)
    prompt = _tokens(10, 12)
    llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0))
    llm.generate(prompt + [5, 6], SamplingParams(max_tokens=1, temperature=0))
    store = llm.engine.scheduler.checkpoints
    metrics = ServerMetrics()
    metrics.set_checkpoints(dict(store.stats, nbytes=store.nbytes))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }
    assert samples[("infergen_state_checkpoints_total", (("event", "hits"),))] == 1
    assert samples[("infergen_state_checkpoint_resumed_tokens_total", ())] == len(prompt)
    assert samples[("infergen_state_checkpoint_bytes_held", ())] == store.nbytes > 0
