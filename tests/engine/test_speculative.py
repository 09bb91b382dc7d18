"""Speculative decoding in the engine (issue 24: engine/spec/speculator.py): outputs with drafts
verified equal those decoded one token at a time — greedy ones on the default model on
copy-heavy prompts (drafts are accepted: the check is not vacuous), with a fixed k and the
cost model's choice; sampled, penalised and logprob requests token for token (their seeded
draws are the same); tiny random models of the attention families (GQA, sliding windows,
MLA), hybrid and recurrent models (their state rolled back after a rejection), mixed sampled
and greedy requests, through preemption — and no KV block is left held.

The two runs compute the same positions in different batch shapes (a verifying step has
k + 1 rows a sequence; one at a time, one), which may round differently in the last bits: a
greedy split is accepted only at a near-tie of the reference run's top two tokens (`tie`)."""

from __future__ import annotations

import pytest
import torch

from infergen import LLM, SamplingParams
from infergen.engine.spec.cost import TOGETHER_SHARE, StepTimes
from infergen.errors import ConfigError
from tests.hf_models import build_hf_model
from tests.triton_env import HAS_TRITON, INTERPRETED

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


def _run_both(path, proposer: str, prompts, k=4, max_tokens: int = 24, **options):
    """Greedy outputs with `proposer` speculating, checked equal to the same engine's without
    it (or split at a near-tie), no block left held: (the speculating LLM, its outputs, the
    reference outputs)."""
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    ref_params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=2)
    plain = {k: v for k, v in options.items() if k != "draft_model"}  # (the draft proposer's)
    ref = LLM(path, **plain).generate(prompts, ref_params)
    llm = LLM(path, speculative=proposer, num_speculative_tokens=k, **options)
    got = llm.generate(prompts, greedy)
    for g, r in zip(got, ref, strict=True):
        _assert_same_or_tie(g, r)
    _assert_no_block_held(llm)
    return llm, got, ref


def _record_drafts(llm: LLM) -> list[tuple[list[int], list[int]]]:
    """(the sequence's tokens, the drafts) of every drafting pass the model-based proposer
    makes from now on."""
    proposer, seen = llm.engine.speculator.proposer, []
    draft = proposer.draft

    def recording(seqs, counts):
        drafts = draft(seqs, counts)
        seen.extend((list(s.token_ids), d) for s, d in zip(seqs, drafts, strict=True))
        return drafts

    proposer.draft = recording
    return seen


class _FixedTimes(StepTimes):
    """Step times the engine's measurements leave alone."""

    def observe(self, tokens: int, seconds: float) -> None:
        pass


def _fixed_times(seconds: dict[int, float]) -> StepTimes:
    times = _FixedTimes()
    for tokens, t in seconds.items():
        StepTimes.observe(times, tokens, t)
    return times


def _assert_no_block_held(llm: LLM) -> None:
    pool = llm.engine.scheduler.pool
    assert all(pool.refcount(b) == 0 for b in range(pool.num_blocks))
    assert not llm.engine.scheduler.running and not llm.engine.scheduler.waiting


@pytest.mark.parametrize("proposer,k", [("ngram", 4), ("suffix", 4), ("ngram", "auto")])
def test_default_model_greedy_outputs_are_unchanged_and_drafts_accepted(proposer, k):
    vocab = 49152
    llm, got, ref = _run_both(None, proposer, _copy_prompts(vocab), k, num_kv_blocks=128)
    assert all(len(g.token_ids) == 24 for g in got)  # max_tokens, however many a step kept
    stats = llm.engine.speculator.summary()
    assert stats["accepted"] > 0 and stats["steps"] > 0
    assert stats["tokens_per_step"] > 1.0
    _assert_no_block_held(llm)


@pytest.mark.parametrize("name", ["llama_gqa", "gemma3", "deepseek_v2"])
def test_tiny_models_of_each_attention_family(name, tmp_path):
    vocab = build_hf_model(name, tmp_path).config.vocab_size
    prompts = _copy_prompts(vocab)
    llm, got, ref = _run_both(str(tmp_path), "ngram", prompts, block_size=4, num_kv_blocks=256)
    assert llm.engine.speculator.stats["steps"] > 0
    _assert_no_block_held(llm)


def test_default_model_sampled_penalised_and_logprob_requests_are_unchanged():
    """Sampled requests (top-p, a repetition penalty, logprobs) speculate too: each emitted
    token is the target's own seeded draw at its position, so the output equals decoding one
    token at a time token for token — and so do the logprobs (the target's, per token)."""
    prompts = _copy_prompts(49152)
    params = [
        SamplingParams(max_tokens=30, temperature=0.8, top_p=0.95, seed=7, ignore_eos=True),
        SamplingParams(max_tokens=30, temperature=0.5, seed=8, logprobs=3, ignore_eos=True,
                       repetition_penalty=1.1),
        SamplingParams(max_tokens=30, temperature=0, frequency_penalty=0.3, logprobs=1,
                       ignore_eos=True),
    ]  # fmt: skip
    ref = LLM(num_kv_blocks=128).generate(prompts, params)
    llm = LLM(num_kv_blocks=128, speculative="ngram", num_speculative_tokens=4)
    got = llm.generate(prompts, params)
    for g, r in zip(got, ref, strict=True):
        assert g.token_ids == r.token_ids
        if r.logprobs is not None:
            assert [x.token_id for x in g.logprobs] == r.token_ids
            for x, y in zip(g.logprobs, r.logprobs, strict=True):
                assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
                assert [t for t, _ in x.top] == [t for t, _ in y.top]
    stats = llm.engine.speculator.summary()
    assert stats["accepted"] > 10 and stats["tokens_per_step"] > 1.5
    _assert_no_block_held(llm)


def test_mixed_with_sampled_requests_and_through_preemption(tmp_path):
    """A tiny pool preempts sequences mid-speculation; sampled requests beside them are
    reproducible and equal decoding one token at a time."""
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
        if i % 2:  # sampled: seeded runs repeat, the target's own draws
            assert g.token_ids == again[i].token_ids == r.token_ids and len(g.token_ids) == 30
        else:
            _assert_same_or_tie(g, r)
    _assert_no_block_held(llm)


def test_sampled_requests_are_the_targets_own_draws(tmp_path):
    """Lossless and reproducible: 400 seeded sampled requests (top-3 at temperature 1) with
    drafts verified give the tokens decoding one at a time gives, request for request — with
    drafts both kept and rejected (the suffix proposer follows earlier requests' answers)."""
    vocab = build_hf_model("llama_gqa", tmp_path).config.vocab_size
    prompt = _copy_prompts(vocab)[0][:60]
    n = 400
    params = [SamplingParams(max_tokens=3, temperature=1.0, top_k=3, seed=i, ignore_eos=True)
              for i in range(n)]  # fmt: skip
    plain = LLM(str(tmp_path), block_size=4).generate([prompt] * n, params)
    llm = LLM(str(tmp_path), block_size=4, speculative="suffix", num_speculative_tokens=2)
    spec = llm.generate([prompt] * n, params)
    stats = llm.engine.speculator.stats
    assert stats["steps"] > 100 and 0.1 < stats["accepted"] / stats["drafted"] < 0.9
    assert len({tuple(o.token_ids) for o in plain}) > 3  # the draws differ between seeds
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]


def test_sampled_pairs_follow_the_targets_distribution(tmp_path):
    """Chi-square: the second and third tokens of 4,000 seeded requests at temperature 0.6 on a
    12-token vocabulary, drawn in steps verifying drafts (the suffix proposer's: the
    earlier requests' most frequent answers), against transformers' own
    probabilities Σ_a p(a) p(b | a) p(c | a, b) (cells expected < 5 pooled; the 0.1 %
    critical value)."""
    hf = build_hf_model("llama_gqa", tmp_path, vocab_size=12, initializer_range=0.3)
    prompt, n, vocab = [1, 2, 3, 4, 5] * 4, 4000, 12
    params = [SamplingParams(max_tokens=3, temperature=0.6, seed=i, ignore_eos=True)
              for i in range(n)]  # fmt: skip
    llm = LLM(str(tmp_path), block_size=4, speculative="suffix", num_speculative_tokens=2)
    counts: dict[tuple[int, ...], int] = {}
    for out in llm.generate([prompt] * n, params):
        counts[tuple(out.token_ids[1:])] = counts.get(tuple(out.token_ids[1:]), 0) + 1
    stats = llm.engine.speculator.stats
    assert stats["steps"] > n // 4 and 0.1 < stats["accepted"] / stats["drafted"] < 0.9
    with torch.no_grad():
        first = hf(torch.tensor([prompt])).logits[0, -1].div(0.6).softmax(-1)
        second = (
            hf(torch.tensor([prompt + [a] for a in range(vocab)]))
            .logits[:, -1]
            .div(0.6)
            .softmax(-1)
        )
        pairs = [prompt + [a, b] for a in range(vocab) for b in range(vocab)]
        third = hf(torch.tensor(pairs)).logits[:, -1].div(0.6).softmax(-1).view(vocab, vocab, vocab)
    joint = torch.einsum("a,ab,abc->bc", first, second, third)  # p(b, c)
    cells = [(n * float(joint[b, c]), counts.get((b, c), 0))
             for b in range(vocab) for c in range(vocab)]  # fmt: skip
    big = [(e, o) for e, o in cells if e >= 5]
    pooled = (sum(e for e, o in cells if e < 5), sum(o for e, o in cells if e < 5))
    bins = big + ([pooled] if pooled[0] > 0 else [])
    stat = sum((o - e) ** 2 / e for e, o in bins)
    df = len(bins) - 1
    critical = df * (1 - 2 / (9 * df) + 3.09 * (2 / (9 * df)) ** 0.5) ** 3  # Wilson–Hilferty
    assert df > 20 and stat < critical, (stat, critical)


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


@pytest.mark.slow
def test_stop_strings_with_the_fp8_kv_cache_and_compiled_layers():
    """A stop string inside a verified run of tokens ends the text there; the FP8 KV cache
    and compile="jit" (the compiled layers run the verifying steps) speculate with outputs
    equal to the same engine decoding one token at a time."""
    prompt = _copy_prompts(49152)[0]
    greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    for options in ({"kv_format": "fp8_e4m3"}, {"compile": "jit"}):
        want = LLM(num_kv_blocks=128, **options).generate([prompt], greedy)[0]
        llm = LLM(num_kv_blocks=128, speculative="ngram", num_speculative_tokens=4, **options)
        got = llm.generate([prompt], greedy)[0]
        assert got.token_ids == want.token_ids, options
        assert llm.engine.speculator.stats["accepted"] > 0
        _assert_no_block_held(llm)
    stop = want.text[len(want.text) // 2 :][:6]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop=[stop])
    got = llm.generate([prompt], params)[0]
    assert got.text == want.text[: want.text.index(stop)] and got.finish_reason == "stop"


@pytest.mark.parametrize("name", ["qwen3_next", "mamba2", "falcon_h1"])
def test_recurrent_states_roll_back_after_a_rejection(name, tmp_path):
    """Hybrid and recurrent models speculate: a step that rejects a draft restores the
    sequence's recurrent state (spec/rollback.py) and its tokens are computed again; greedy
    outputs equal decoding one token at a time, both paths taken (kept and rolled back)."""
    vocab = build_hf_model(name, tmp_path).config.vocab_size
    # two at a time: the later requests repeat earlier prompts, so the suffix proposer drafts
    # their answers (kept), beside its drafts from the requests' own tokens (often rejected)
    prompts = _copy_prompts(vocab) * 2
    llm, got, ref = _run_both(str(tmp_path), "suffix", prompts, max_tokens=30, block_size=4,
                              num_kv_blocks=256, max_num_seqs=2)  # fmt: skip
    stats = llm.engine.speculator.stats
    assert stats["rollbacks"] > 0 and stats["accepted"] > 0, stats
    _assert_no_block_held(llm)


@pytest.mark.slow
@pytest.mark.skipif(not INTERPRETED or not HAS_TRITON, reason="needs Triton's interpreter")
def test_batched_triton_sampler_draws_the_same_tokens(tmp_path):
    """With kernels="triton" the batched sampler's Philox stream is keyed by the draw count:
    verification draws each row at its position's count, so a seeded request's tokens equal
    the same engine's without speculation."""
    vocab = build_hf_model("llama_gqa", tmp_path).config.vocab_size
    prompts = [_copy_prompts(vocab)[0][:40]] * 6  # in waves of 2: later ones draft from earlier
    params = [
        SamplingParams(max_tokens=8, temperature=0.3, seed=i % 2, ignore_eos=True,
                       repetition_penalty=1.05 if i % 3 else 1.0)
        for i in range(6)
    ]  # fmt: skip
    options = dict(kernels="triton", block_size=4, max_num_seqs=2)
    ref = LLM(str(tmp_path), **options).generate(prompts, params)
    llm = LLM(str(tmp_path), speculative="suffix", num_speculative_tokens=3, **options)
    got = llm.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    assert llm.engine.speculator.stats["accepted"] > 0  # rows past the first were drawn


@pytest.mark.parametrize("name", ["llama_gqa", "gemma3", "deepseek_v2"])
def test_layerskip_drafts_are_the_first_layers_argmax(name, tmp_path):
    """layerskip's drafts are the greedy tokens of the target's first L layers, final norm and
    LM head: equal to transformers' model cut to L layers (the oracle) at the same positions;
    the outputs equal decoding one token at a time."""
    hf = build_hf_model(name, tmp_path)
    vocab = hf.config.vocab_size
    prompts = _copy_prompts(vocab)[:2]
    llm, got, ref = _run_both(str(tmp_path), "layerskip", prompts, k=2, max_tokens=8,
                              block_size=4, draft_layers=1)  # fmt: skip
    # the drafts of a fresh run, recorded, against the cut model on the same tokens
    llm = LLM(str(tmp_path), block_size=4, speculative="layerskip", num_speculative_tokens=2,
              draft_layers=1)  # fmt: skip
    seen = _record_drafts(llm)
    llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    assert seen and llm.engine.speculator.stats["drafted"] > 0
    hf.model.layers = hf.model.layers[:1]
    hf.config.num_hidden_layers = 1
    for tokens, drafts in seen:
        with torch.no_grad():
            ids = torch.tensor([tokens + drafts[:-1]])
            logits = hf(ids).logits[0, len(tokens) - 1 :]
        assert logits.argmax(dim=-1).tolist() == drafts


def test_a_model_proposer_turned_off_still_verifies_a_draft_now_and_then():
    """With "auto", a model-based proposer's sequence that the cost model gave no drafts for
    EXPLORE decodes in a row verifies one (its acceptance is measured only from drafts it
    made), then waits twice as long after each: layerskip with the default
    model's first 4 layers (drafts never kept) drafts after 16, 32, 64 decodes — one draft
    at a time. The step times are fixed (a draft adds 60 % to a step: it pays only when kept
    more often than that), not measured: on a host where the step's fixed overhead dwarfs
    the 4 layers a draft costs, even a rarely kept draft pays and drafting stays on."""
    llm = LLM(speculative="layerskip", draft_layers=4)
    llm.engine.speculator.times = _fixed_times({n: 1.0 + 0.6 * (n - 1) for n in range(1, 10)})
    llm.generate(["Write a short story about a lighthouse keeper."],
                 SamplingParams(max_tokens=160, temperature=0, ignore_eos=True))  # fmt: skip
    stats = llm.engine.speculator.summary()
    assert stats["per_token_acceptance"] < 0.1  # (drafting does not pay: turned off)
    assert stats["decodes"] > 16 + 32 + 64 and 2 <= stats["steps"] <= 6  # (not every 16)
    assert stats["drafted"] < 2 * stats["steps"]


def test_no_exploring_while_drafts_could_not_pay():
    """Measured step times that make any draft dearer than what it could emit, even kept
    every time (a draft model too slow for the host): no exploring draft is verified."""
    llm = LLM(speculative="layerskip", draft_layers=4)
    times = llm.engine.speculator.times
    times.observe(1, 0.02)  # (decode-only steps of one token keep being measured)
    for n in range(2, 10):
        times.observe(n, 10.0)
    llm.generate(["Write a short story about a lighthouse keeper."],
                 SamplingParams(max_tokens=80, temperature=0, ignore_eos=True))  # fmt: skip
    stats = llm.engine.speculator.summary()
    assert stats["decodes"] > 64 and stats["steps"] == 0


@pytest.mark.parametrize("per_position", [1e-6, 10.0])
@pytest.mark.parametrize("drafts_pay", [True, False])
def test_a_draft_models_catch_up_is_paid_only_where_it_is_earned(per_position, drafts_pay,
                                                                 tmp_path):  # fmt: skip
    """A draft model catches up on every position it lags (at first, the prompt) before it
    drafts. Where drafts pay (the target as its own draft, a draft adding 1 % to a step), a
    catch-up dearer than what they save over the tokens left (10 s a position) keeps them
    off; where drafts do not pay (another model's, rarely kept, a draft adding 60 %: turned
    off), exploring drafts are verified only while the catch-up costs at most EXPLORE_SHARE
    of the decoding since (cheap here: after 16, then 32 decodes), never when it is dear."""
    target, draft_dir = tmp_path / "target", tmp_path / "draft"
    vocab = build_hf_model("llama_gqa", target).config.vocab_size
    if drafts_pay:
        draft_dir = target
    else:
        build_hf_model("llama_mha", draft_dir, seed=1)
    llm = LLM(str(target), speculative="draft", draft_model=str(draft_dir),
              num_speculative_tokens="auto", block_size=4)  # fmt: skip
    speculator = llm.engine.speculator
    cost = 0.01 if drafts_pay else 0.6
    speculator.times = _fixed_times({n: 1.0 + cost * (n - 1) for n in range(1, 10)})
    speculator.catch_up.per_position = per_position
    speculator.catch_up.observe = lambda positions, seconds: None  # (kept as set)
    prompt = _copy_prompts(vocab)[0]
    llm.generate([prompt], SamplingParams(max_tokens=60, temperature=0, ignore_eos=True))
    stats = speculator.summary()
    if per_position > 1:
        assert stats["decodes"] > 16 + 32 and stats["steps"] == 0
    elif drafts_pay:  # (every decode verifies drafts, kept: 60 tokens in a few steps)
        assert stats["decodes"] < 20 and stats["steps"] >= stats["decodes"] - 1
    else:
        assert stats["decodes"] > 16 + 32
        assert 1 <= stats["steps"] <= 3 and stats["drafted"] == stats["steps"]


def test_a_draining_compute_bound_batch_drafts_only_for_the_last_to_finish(tmp_path):
    """No request waiting, three decoding with 30, 24 and 18 tokens still allowed, drafts
    proposed for each and (so the acceptance estimate says) kept every time: where a token
    costs 0.6 of the step's average (t(n) = 0.02 + 0.01 n s), or 0.375 (0.004 s: not
    compute-bound, not nearly free either), only the sequence that may generate the most
    drafts — the others would finish early, the batch not; where a token costs little
    beside the step (0.001 s, 0.13 of the average), or requests wait, every sequence
    drafts."""
    vocab = build_hf_model("llama_gqa", tmp_path).config.vocab_size
    llm = LLM(str(tmp_path), speculative="ngram", num_speculative_tokens="auto")
    engine, speculator = llm.engine, llm.engine.speculator
    speculator.acceptance.rate = lambda request_id: 1.0
    speculator.proposer.propose = lambda request_id, k: [5] * k  # (what is drafted: moot)
    prompts = _copy_prompts(vocab)
    for prompt, most in zip(prompts, (30, 24, 18), strict=True):
        engine.add_request(prompt, SamplingParams(max_tokens=most, temperature=0, ignore_eos=True))
    started = lambda seq: seq.num_tokens > len(seq.prompt_token_ids)  # noqa: E731
    while len(engine.scheduler.running) < 3 or not all(map(started, engine.scheduler.running)):
        engine.step()
    running = engine.scheduler.running
    assert len(running) == 3 and not engine.scheduler.waiting

    remaining = engine.scheduler.remaining

    def drafting(per_token: float, draining: bool) -> list[bool]:
        speculator.times = _fixed_times({n: 0.02 + per_token * n for n in range(1, 20)})
        speculator.draft(running, per_token, 64, remaining, draining=draining)
        return [bool(seq.drafts) for seq in running]

    last = [remaining(seq) == max(map(remaining, running)) for seq in running]
    assert sum(last) == 1
    assert drafting(0.01, True) == last
    assert drafting(0.01, False) == [True] * 3  # requests waiting: every sequence
    assert drafting(0.004, True) == last
    assert speculator.times.token_share(3, 0.004) == pytest.approx(0.375)
    assert not speculator.times.compute_bound(3, 0.004)
    assert drafting(0.001, True) == [True] * 3  # bound by reading the weights
    assert speculator.times.token_share(3, 0.001) < TOGETHER_SHARE


@pytest.mark.slow
def test_layerskip_on_the_default_model_and_its_errors(tmp_path):
    """The default model (the fused decode's first layers): outputs unchanged, drafts kept;
    a recurrent model and a draft depth that is not one are refused."""
    llm, got, ref = _run_both(None, "layerskip", _copy_prompts(49152), k=3, draft_layers=20,
                              num_kv_blocks=128)  # fmt: skip
    assert llm.engine.speculator.stats["accepted"] > 0
    _assert_no_block_held(llm)
    build_hf_model("mamba2", tmp_path)
    with pytest.raises(ConfigError, match="recurrent"):
        LLM(str(tmp_path), speculative="layerskip")
    with pytest.raises(ConfigError, match="draft_layers"):
        LLM(speculative="layerskip", draft_layers=30)


def test_a_draft_model_drafts_its_own_greedy_tokens(tmp_path):
    """`draft` with another checkpoint (same vocabulary): its KV cache follows every position
    the target computes (prefill chunks, plain decodes, drafting passes), so each draft is the
    draft model's own greedy token — transformers' draft model on the same tokens is the
    oracle; the outputs equal the target decoding one token at a time."""
    target, draft_dir = tmp_path / "target", tmp_path / "draft"
    build_hf_model("llama_gqa", target)
    hf_draft = build_hf_model("llama_mha", draft_dir, seed=1)
    prompts = _copy_prompts(hf_draft.config.vocab_size)
    options = dict(block_size=4, max_num_batched_tokens=32, draft_model=str(draft_dir))
    llm, got, ref = _run_both(str(target), "draft", prompts, k=3, max_tokens=12, **options)
    seen = _record_drafts(llm)
    llm.generate(prompts, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    assert len(seen) > 5
    # steps without drafts (every other one here, as the cost model may choose): the draft
    # model computes nothing then, and catches up on those positions when it drafts again
    speculator, steps = llm.engine.speculator, iter(range(10**6))
    choose = speculator.draft

    def every_other_step(running, *args, **kwargs):
        choose(running, *args, **kwargs)
        if next(steps) % 2:
            for seq in running:
                seq.drafts = []

    speculator.draft = every_other_step
    llm.generate(prompts, SamplingParams(max_tokens=14, temperature=0, ignore_eos=True))
    assert len(seen) > 10
    # prompts first run without a single draft (their blocks cached with no draft KV), then
    # again with drafts: the prefix-cache hits' draft KV is not trusted, it is caught up
    fresh, count = [[p + 1 for p in prompt] for prompt in prompts], len(seen)

    def never(running, *args, **kwargs):
        choose(running, *args, **kwargs)
        for seq in running:
            seq.drafts = []

    speculator.draft = never
    llm.generate(fresh, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    assert len(seen) == count and llm.engine.scheduler.pool.num_cached > 0
    speculator.draft = choose
    llm.generate(fresh, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    assert len(seen) > count + 3
    for tokens, drafts in seen:
        with torch.no_grad():
            logits = hf_draft(torch.tensor([tokens + drafts[:-1]])).logits[0, len(tokens) - 1 :]
        assert logits.argmax(dim=-1).tolist() == drafts


@pytest.mark.slow
def test_the_target_int4_as_its_own_draft_and_the_errors(tmp_path):
    """draft_model="self:int4" on the default model: drafts kept, outputs unchanged; no draft
    model, or one with another vocabulary, is a clear error."""
    llm, got, ref = _run_both(None, "draft", _copy_prompts(49152), k=3, num_kv_blocks=128,
                              draft_model="self:int4")  # fmt: skip
    assert llm.engine.speculator.summary()["per_token_acceptance"] > 0.5
    _assert_no_block_held(llm)
    with pytest.raises(ConfigError, match="needs a draft model"):
        LLM(speculative="draft")
    build_hf_model("llama_gqa", tmp_path / "small", vocab_size=300)
    with pytest.raises(ConfigError, match="vocabulary"):
        LLM(speculative="draft", draft_model=str(tmp_path / "small"))


def test_the_draft_models_kv_shares_the_cache_budget():
    """The draft model's cache has the target's blocks, both inside kv_cache_memory: with the
    target's own shape as draft ("self:int4"), half the blocks of the budget alone."""
    alone = LLM(kv_cache_memory="48MiB").engine.kv_cache
    llm = LLM(kv_cache_memory="48MiB", speculative="draft", draft_model="self:int4")
    target = llm.engine.kv_cache
    draft = llm.engine.speculator.proposer.runner.kv_cache
    assert draft.num_blocks == target.num_blocks == alone.num_blocks // 2
    assert target.nbytes + draft.nbytes <= 48 * 2**20
    with pytest.raises(ConfigError, match="draft proposer"):
        LLM(speculative="ngram", draft_model="self:int4")
