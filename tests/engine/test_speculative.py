"""Speculative decoding in the engine (issue 24: engine/spec/speculator.py): greedy outputs with
drafts verified equal those decoded one token at a time — the default model on copy-heavy
prompts (drafts are accepted: the check is not vacuous), tiny random models of the attention
families (GQA, sliding windows, MLA), mixed with sampled requests, through preemption — and
no KV block is left held; models with recurrent layers are refused.

The two runs compute the same positions in different batch shapes (a verifying step is a
(k + 1)-token chunk; one at a time, decodes), which round differently in the last bits: a
split is accepted only at a near-tie of the reference run's top two tokens (`tie`)."""

from __future__ import annotations

from collections import Counter

import pytest

from infergen import LLM, SamplingParams
from infergen.errors import ConfigError
from tests.hf_models import build_hf_model

TIE = 1e-3


def _assert_same_or_tie(spec, ref) -> None:
    """`spec` (no logprobs: speculating requests take none) equals `ref` (logprobs=2), or
    splits from it only where ref's two best tokens were within TIE, and not after."""
    for i, (x, y) in enumerate(zip(spec.token_ids, ref.token_ids, strict=False)):
        if x != y:
            top = dict(ref.logprobs[i].top)
            assert x in top and abs(top[x] - top[y]) < TIE, (
                f"diverged at token {i}: {spec.token_ids} vs {ref.token_ids}"
            )
            return
    assert spec.token_ids == ref.token_ids
    assert spec.finish_reason == ref.finish_reason


def _copy_prompts(vocab: int) -> list[list[int]]:
    """Prompts that repeat a passage: greedy continuations of them tend to copy it."""
    passage = [(37 * i + 11) % (vocab - 10) + 5 for i in range(40)]
    return [passage * 3, [7, 8, 9] + passage[:25] + [3] + passage[:30], passage[::-1] * 2]


def _run_both(path, proposer: str, prompts, max_tokens: int = 24, **options):
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    ref_params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=2)
    ref = LLM(path, **options).generate(prompts, ref_params)
    llm = LLM(path, speculative=proposer, num_speculative_tokens=4, **options)
    got = llm.generate(prompts, greedy)
    return llm, got, ref


def _assert_no_block_held(llm: LLM) -> None:
    pool = llm.engine.scheduler.pool
    assert all(pool.refcount(b) == 0 for b in range(pool.num_blocks))
    assert not llm.engine.scheduler.running and not llm.engine.scheduler.waiting


@pytest.mark.parametrize("proposer", ["ngram", "suffix"])
def test_default_model_greedy_outputs_are_unchanged_and_drafts_accepted(proposer):
    vocab = 49152
    llm, got, ref = _run_both(None, proposer, _copy_prompts(vocab), num_kv_blocks=128)
    for g, r in zip(got, ref, strict=True):
        _assert_same_or_tie(g, r)
        assert len(g.token_ids) == 24  # max_tokens exactly, however many a step accepted
    stats = llm.engine.speculator.summary()
    assert stats["accepted"] > 0 and stats["steps"] > 0
    assert stats["tokens_per_step"] > 1.0
    _assert_no_block_held(llm)


@pytest.mark.parametrize("name", ["llama_gqa", "gemma3", "deepseek_v2"])
def test_tiny_models_of_each_attention_family(name, tmp_path):
    vocab = build_hf_model(name, tmp_path).config.vocab_size
    prompts = _copy_prompts(vocab)
    llm, got, ref = _run_both(str(tmp_path), "ngram", prompts, block_size=4, num_kv_blocks=256)
    for g, r in zip(got, ref, strict=True):
        _assert_same_or_tie(g, r)
    assert llm.engine.speculator.stats["steps"] > 0
    _assert_no_block_held(llm)


def test_mixed_with_sampled_requests_and_through_preemption(tmp_path):
    """A tiny pool preempts sequences mid-speculation; sampled requests beside them keep their
    seeded streams (they take no drafts)."""
    vocab = build_hf_model("llama_gqa", tmp_path).config.vocab_size
    prompts = _copy_prompts(vocab) * 2

    def params(logprobs):
        return [
            SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, logprobs=logprobs)
            if i % 2 == 0
            else SamplingParams(max_tokens=30, temperature=0.8, seed=i, ignore_eos=True)
            for i in range(len(prompts))
        ]

    options = dict(block_size=4, num_kv_blocks=70, max_num_batched_tokens=64)
    ref = LLM(str(tmp_path), **options).generate(prompts, params(2))
    llm = LLM(str(tmp_path), speculative="ngram", **options)
    got = llm.generate(prompts, params(None))
    again = LLM(str(tmp_path), speculative="ngram", **options).generate(prompts, params(None))
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.speculator.stats["steps"] > 0
    for i, (g, r) in enumerate(zip(got, ref, strict=True)):
        if i % 2:  # sampled (speculative sampling): seeded runs repeat
            assert g.token_ids == again[i].token_ids and len(g.token_ids) == 30
        else:
            _assert_same_or_tie(g, r)
    _assert_no_block_held(llm)


def _chi2_critical(df: int, z: float = 3.719) -> float:
    """chi-square's quantile at 1 - 1e-4 (z: the normal's), Wilson-Hilferty's approximation."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * a**0.5) ** 3


def test_sampled_requests_keep_the_target_distribution(tmp_path):
    """Speculative sampling is lossless: the joint distribution of three sampled tokens (top-3
    at temperature 1, 1,500 seeded requests) with drafts verified equals that of decoding
    token by token (a chi-square test of homogeneity of the two samples, false alarm 1e-4)."""
    vocab = build_hf_model("llama_gqa", tmp_path).config.vocab_size
    prompt = _copy_prompts(vocab)[0][:60]
    n = 1500
    params = [SamplingParams(max_tokens=3, temperature=1.0, top_k=3, seed=i, ignore_eos=True)
              for i in range(n)]  # fmt: skip
    plain = LLM(str(tmp_path), block_size=4).generate([prompt] * n, params)
    # suffix: the drafts follow earlier requests' answers, so both ways are taken — drafts kept
    # (the target likes them) and rejected (a residual draw)
    llm = LLM(str(tmp_path), block_size=4, speculative="suffix", num_speculative_tokens=2)
    spec = llm.generate([prompt] * n, params)
    stats = llm.engine.speculator.stats
    assert stats["steps"] > 500 and 0.1 < stats["accepted"] / stats["drafted"] < 0.9
    a = Counter(tuple(o.token_ids) for o in plain)
    b = Counter(tuple(o.token_ids) for o in spec)
    cells = sorted(set(a) | set(b))
    stat = sum(
        (a[c] - (a[c] + b[c]) / 2) ** 2 / ((a[c] + b[c]) / 2)
        + (b[c] - (a[c] + b[c]) / 2) ** 2 / ((a[c] + b[c]) / 2)
        for c in cells
    )
    assert len(cells) > 3 and stat < _chi2_critical(len(cells) - 1), (stat, len(cells))


def test_stop_tokens_end_a_verified_run_of_tokens(tmp_path):
    """A stop token inside the tokens a step accepts ends the request there."""
    vocab = build_hf_model("llama_gqa", tmp_path).config.vocab_size
    prompt = _copy_prompts(vocab)[0]
    free = LLM(str(tmp_path), block_size=4).generate(
        [prompt], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    )[0]
    stop = free.token_ids[9]
    want = free.token_ids[: free.token_ids.index(stop) + 1]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop_token_ids=[stop])
    llm = LLM(str(tmp_path), block_size=4, speculative="ngram")
    got = llm.generate([prompt], params)[0]
    assert got.token_ids == want and got.finish_reason == "stop"
    _assert_no_block_held(llm)


def test_recurrent_models_are_refused(tmp_path):
    build_hf_model("mamba2", tmp_path)
    with pytest.raises(ConfigError, match="recurrent layers"):
        LLM(str(tmp_path), speculative="ngram")
