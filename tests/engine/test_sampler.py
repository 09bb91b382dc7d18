"""Sampler: processed logits against transformers' logits processors, OpenAI penalties against
a plain-Python formula, greedy = argmax, seeded reproducibility independent of the batch,
empirical frequencies against the truncated distribution, logprobs = log_softmax(raw)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from infergen.engine.sampler import Sampler, SamplingState, TokenLogprobs, process_logits
from infergen.engine.sampling_params import SamplingParams

VOCAB = 64


def random_logits(batch: int, vocab: int = VOCAB, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def make_state(params: SamplingParams, prompt=(1, 5, 9), output=(), index: int = 0):
    state = SamplingState(params, list(prompt), engine_seed=123, request_index=index)
    for token in output:
        state.append(token)
    return state


def hf_oracle(row: torch.Tensor, state: SamplingState) -> torch.Tensor:
    """transformers' chain (its generate() order) for one row, default min_tokens_to_keep=1."""
    p = state.params
    chain = LogitsProcessorList()
    if p.repetition_penalty != 1.0:
        chain.append(RepetitionPenaltyLogitsProcessor(p.repetition_penalty))
    if p.temperature != 1.0:
        chain.append(TemperatureLogitsWarper(p.temperature))
    if p.top_k >= 1:
        chain.append(TopKLogitsWarper(p.top_k))
    if p.top_p < 1.0:
        chain.append(TopPLogitsWarper(p.top_p))
    if p.min_p > 0.0:
        chain.append(MinPLogitsWarper(p.min_p))
    input_ids = torch.tensor([state.prompt_token_ids + state.output_token_ids])
    return chain(input_ids, row.clone().unsqueeze(0)).squeeze(0)


HF_CASES = [
    dict(repetition_penalty=1.3),
    dict(repetition_penalty=0.7),
    dict(temperature=0.6),
    dict(temperature=1.7),
    dict(top_k=1),
    dict(top_k=5),
    dict(top_k=VOCAB + 10),
    dict(top_p=0.9),
    dict(top_p=0.3),
    dict(top_p=1e-4),
    dict(min_p=0.05),
    dict(min_p=0.5),
    dict(min_p=1.0),
    dict(top_k=10, top_p=0.8),
    dict(repetition_penalty=1.2, temperature=0.8, top_k=12, top_p=0.9, min_p=0.02),
    dict(repetition_penalty=1.5, temperature=1.3, top_p=0.95, min_p=0.1),
    dict(),
]


def test_process_logits_matches_transformers_per_row_in_one_batch():
    # every case is one row of the same batch, so per-row parameters are exercised together
    states = [
        make_state(SamplingParams(**case), prompt=(3, 7, 7, i), output=(11, 3, i + 20), index=i)
        for i, case in enumerate(HF_CASES)
    ]
    logits = random_logits(len(states))
    original = logits.clone()
    processed = process_logits(logits, states)
    assert torch.equal(logits, original), "process_logits must not modify its input"
    for i, state in enumerate(states):
        expected = hf_oracle(logits[i], state)
        torch.testing.assert_close(processed[i], expected, msg=f"case {HF_CASES[i]}")


def test_top_k_keeps_ties_like_transformers():
    logits = torch.tensor([[1.0, 3.0, 2.0, 2.0, 0.5]])
    state = make_state(SamplingParams(top_k=2))
    processed = process_logits(logits, [state])
    torch.testing.assert_close(processed[0], hf_oracle(logits[0], state))
    assert torch.isfinite(processed[0]).tolist() == [False, True, True, True, False]


def test_top_p_boundary_drops_cumulative_equal_to_one_minus_p():
    # uniform over 4: ascending cumulative .25 .5 .75 1 (exact); 1 - 0.75 = .25 -> drop one
    logits = torch.zeros(1, 4)
    state = make_state(SamplingParams(top_p=0.75))
    processed = process_logits(logits, [state])[0]
    expected = hf_oracle(logits[0], state)
    assert int(torch.isfinite(processed).sum()) == int(torch.isfinite(expected).sum()) == 3


def test_repetition_penalty_uses_prompt_and_output_sign_rule():
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 0.0]])
    state = make_state(SamplingParams(repetition_penalty=2.0), prompt=(0, 4), output=(1,))
    processed = process_logits(logits, [state])
    assert processed[0].tolist() == [1.0, -4.0, 2.0, -2.0, 0.0]


def openai_penalties(row: list[float], output: list[int], freq: float, pres: float) -> list[float]:
    """The OpenAI rule written out: mu[j] -= c[j] * freq + (c[j] > 0) * pres (output only)."""
    result = []
    for token, logit in enumerate(row):
        count = output.count(token)
        result.append(logit - count * freq - (1.0 if count > 0 else 0.0) * pres)
    return result


@pytest.mark.parametrize(("freq", "pres"), [(0.5, 0.0), (0.0, 1.5), (1.1, -0.4), (-2.0, 2.0)])
def test_presence_frequency_penalties_match_openai_formula(freq, pres):
    prompt, output = [0, 1, 2, 3], [4, 4, 4, 7, 2, 9, 9]
    other = make_state(SamplingParams(), prompt=prompt, output=[5, 5], index=1)
    state = make_state(
        SamplingParams(frequency_penalty=freq, presence_penalty=pres), prompt, output
    )
    logits = random_logits(2, vocab=12)
    processed = process_logits(logits, [state, other])
    expected = openai_penalties(logits[0].tolist(), output, freq, pres)
    torch.testing.assert_close(processed[0], torch.tensor(expected))
    torch.testing.assert_close(processed[1], logits[1])  # no penalties on the neighbour row


def test_penalties_order_repetition_then_openai():
    logits = torch.tensor([[3.0, -1.0, 1.0]])
    params = SamplingParams(repetition_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.25)
    state = make_state(params, prompt=(1,), output=(0, 0))
    processed = process_logits(logits, [state])[0].tolist()
    assert processed == pytest.approx([3.0 / 1.5 - 2 * 0.5 - 0.25, -1.0 * 1.5, 1.0])


def test_greedy_is_argmax_and_uses_fast_path_batch():
    logits = random_logits(6)
    states = [make_state(SamplingParams(temperature=0.0), index=i) for i in range(6)]
    out = Sampler()(logits, states)
    assert out.token_ids == logits.argmax(dim=-1).tolist()
    assert out.logprobs == [None] * 6
    assert all(s.generator is None for s in states)


def test_greedy_fast_path_ties_and_nan_match_torch_argmax():
    """The fast path's numpy argmax picks what torch's does: the first index on ties, a NaN
    as the largest (the first NaN), -inf rows, and a non-contiguous batch."""
    logits = torch.full((5, 49152), -1.0)
    logits[0, [7, 30000]] = 4.0  # a tie: the first wins
    logits[1, [12, 40000]] = float("nan")
    logits[1, 5] = float("inf")
    logits[2] = -float("inf")
    logits[3, 49151] = 0.5
    logits[4] = torch.randn(49152, generator=torch.Generator().manual_seed(1))
    for batch in (logits, logits[::2], logits.t().contiguous().t()):
        states = [make_state(SamplingParams(temperature=0.0), index=i) for i in range(len(batch))]
        assert Sampler()(batch, states).token_ids == batch.argmax(dim=-1).tolist()


def test_greedy_with_penalty_is_argmax_of_penalised_logits():
    logits = torch.tensor([[5.0, 4.0, 1.0]])
    state = make_state(SamplingParams(temperature=0.0, repetition_penalty=2.0), prompt=(0,))
    assert Sampler()(logits, [state]).token_ids == [1]


def test_mixed_batch_greedy_rows_still_argmax():
    logits = random_logits(4)
    states = [
        make_state(SamplingParams(temperature=0.0), index=0),
        make_state(SamplingParams(temperature=1.0, seed=3), index=1),
        make_state(SamplingParams(temperature=0.0, logprobs=2), index=2),
        make_state(SamplingParams(temperature=0.9, top_k=3), index=3),
    ]
    out = Sampler()(logits, states)
    argmax = logits.argmax(dim=-1).tolist()
    assert out.token_ids[0] == argmax[0] and out.token_ids[2] == argmax[2]
    top3 = logits[3].topk(3).indices.tolist()
    assert out.token_ids[3] in top3


def draw_sequence(params: SamplingParams, logits_rows: list[torch.Tensor], neighbours: int):
    """Draw len(logits_rows) tokens for one seeded request sharing each step with others."""
    state = make_state(params, index=0)
    others = [make_state(SamplingParams(temperature=1.3), index=i + 1) for i in range(neighbours)]
    tokens = []
    for step, row in enumerate(logits_rows):
        noise = random_logits(neighbours, seed=1000 + step) if neighbours else None
        batch = torch.cat([noise, row[None]]) if neighbours else row[None]
        out = Sampler()(batch, others + [state])
        tokens.append(out.token_ids[-1])
        state.append(out.token_ids[-1])
    return tokens


def test_seeded_reproducible_and_independent_of_batch_composition():
    rows = [random_logits(1, seed=50 + s)[0] / 3 for s in range(12)]  # flat-ish distributions
    params = SamplingParams(temperature=1.0, seed=2024, top_p=0.95)
    alone = draw_sequence(params, rows, neighbours=0)
    assert draw_sequence(params, rows, neighbours=0) == alone
    assert draw_sequence(params, rows, neighbours=5) == alone
    assert draw_sequence(params, rows, neighbours=2) == alone
    other_seed = draw_sequence(SamplingParams(temperature=1.0, seed=7, top_p=0.95), rows, 0)
    assert other_seed != alone


def test_unseeded_states_differ_by_request_index_but_repeat_by_engine_seed():
    params = SamplingParams()
    logits = torch.zeros(1, 1000)
    draws = {}
    for index in range(3):
        state = SamplingState(params, [], engine_seed=9, request_index=index)
        draws[index] = [Sampler()(logits, [state]).token_ids[0] for _ in range(5)]
    again = SamplingState(params, [], engine_seed=9, request_index=1)
    assert [Sampler()(logits, [again]).token_ids[0] for _ in range(5)] == draws[1]
    assert draws[0] != draws[1] != draws[2]


# chi-square 0.999 quantiles by degrees of freedom (the test is seeded, so not flaky)
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47}


@pytest.mark.parametrize(
    ("params", "kept"),
    [
        (SamplingParams(), [0, 1, 2, 3, 4]),
        (SamplingParams(top_p=0.8), [0, 1, 2]),  # cumulative ascending: .05 .15 .30 -> drop <=.2
        (SamplingParams(top_k=2), [0, 1]),
        # top-p sees the renormalised top-4: .1/.95 = .105 <= .15 is dropped, .263 is not
        (SamplingParams(top_k=4, top_p=0.85), [0, 1, 2]),
        (SamplingParams(min_p=0.3), [0, 1, 2]),  # 0.3 * 0.4 = 0.12 > 0.1
    ],
)
def test_empirical_frequencies_match_truncated_distribution(params, kept):
    probs = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    draws = 20_000
    states = [SamplingState(params, [], engine_seed=11, request_index=i) for i in range(draws)]
    out = Sampler()(probs.log().repeat(draws, 1), states)
    counts = torch.bincount(torch.tensor(out.token_ids), minlength=5).double()
    dropped = [t for t in range(5) if t not in kept]
    assert counts[dropped].sum() == 0, "a truncated token was drawn"
    expected = probs[kept].double() / probs[kept].sum() * draws
    chi2 = float(((counts[kept] - expected) ** 2 / expected).sum())
    assert chi2 < CHI2_999[len(kept) - 1], (counts.tolist(), expected.tolist())


def test_temperature_sharpens_empirical_distribution():
    probs = torch.tensor([0.5, 0.3, 0.2])
    draws = 6_000
    params = SamplingParams(temperature=0.5)
    states = [SamplingState(params, [], engine_seed=3, request_index=i) for i in range(draws)]
    out = Sampler()(probs.log().repeat(draws, 1), states)
    counts = torch.bincount(torch.tensor(out.token_ids), minlength=3).double()
    sharpened = probs**2 / (probs**2).sum()
    assert torch.allclose(counts / draws, sharpened.double(), atol=0.02)


def test_logprobs_are_log_softmax_of_raw_logits_with_sorted_top():
    logits = random_logits(4)
    states = [
        make_state(SamplingParams(logprobs=5, temperature=0.7, repetition_penalty=1.4), index=0),
        make_state(SamplingParams(), index=1),
        make_state(SamplingParams(logprobs=0, temperature=0.0), index=2),
        make_state(SamplingParams(logprobs=20, top_k=3, seed=1), index=3),
    ]
    out = Sampler()(logits, states)
    reference = torch.log_softmax(logits, dim=-1)
    assert out.logprobs[1] is None
    for i, k in [(0, 5), (2, 0), (3, 20)]:
        entry = out.logprobs[i]
        assert isinstance(entry, TokenLogprobs)
        assert entry.token_id == out.token_ids[i]
        assert entry.logprob == pytest.approx(reference[i, entry.token_id].item(), abs=1e-6)
        assert len(entry.top) == k
        values = [v for _, v in entry.top]
        assert values == sorted(values, reverse=True)
        top_ids = reference[i].topk(k).indices.tolist() if k else []
        assert [t for t, _ in entry.top] == top_ids
        for token, value in entry.top:
            assert value == pytest.approx(reference[i, token].item(), abs=1e-6)
    assert out.logprobs[2].logprob == pytest.approx(reference[2].max().item(), abs=1e-6)


def test_sampled_tokens_have_finite_probability_with_extreme_logits():
    logits = torch.full((3, 50), -1e4)
    logits[:, 7] = 10.0
    states = [make_state(SamplingParams(seed=s), index=s) for s in range(3)]
    assert Sampler()(logits, states).token_ids == [7, 7, 7]
    assert not math.isnan(process_logits(logits, states).max().item())


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="states"):
        Sampler()(torch.zeros(2, 4), [make_state(SamplingParams())])
