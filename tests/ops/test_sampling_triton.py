"""The batched sampling op (ops/sampling.py) and its Triton row (ops/sampling_triton.py):
processed logits bit-identical to the reference (penalties, temperature, top-k, top-p, min-p)
on a grid of vocab sizes (1 to 50257) and batches with greedy and sampled rows; tokens equal to
the reference's (its Philox written in torch); greedy = argmax; a seeded row's token the same
alone and in a batch; draw frequencies against softmax of the processed logits (chi-square);
dropped tokens never drawn. The reference itself against the engine's generator-path rule
(engine/sampler.process_logits, tested against transformers)."""

from __future__ import annotations

import pytest
import torch

from infergen.engine.sampler import SamplingState, process_logits, sampling_inputs
from infergen.engine.sampling_params import SamplingParams
from infergen.ops import sampling
from infergen.ops.sampling import SamplingInputs
from tests.triton_env import DEVICE, HAS_TRITON, INTERPRETED, runnable

FEATURES = ["all", "temperature", "min_p", "truncation"]
GRID = [(b, v, f) for b, v in [(1, 1), (3, 5), (5, 1000)] for f in FEATURES] + [(2, 50257, "all")]


def make_inputs(batch: int, vocab: int, features: str, seed: int = 0, device=DEVICE):
    """Random per-row parameters; row 0 greedy when batch > 1 (mixed batches)."""
    gen = torch.Generator().manual_seed(seed)
    uniform = lambda low, high: low + (high - low) * torch.rand(batch, generator=gen)  # noqa: E731
    temperature = uniform(0.3, 2.0)
    if batch > 1:
        temperature[0] = 0.0
    fields = dict(
        temperature=temperature,
        seeds=torch.randint(-(2**62), 2**62, (batch,), generator=gen),
        draws=torch.randint(0, 2**34, (batch,), generator=gen),
    )
    if features in ("all", "truncation"):
        fields.update(top_k=torch.randint(-1, vocab + 3, (batch,), generator=gen),
                      top_p=torch.where(uniform(0, 1) < 0.3, 1.0, uniform(0.05, 1.0)))  # fmt: skip
    if features in ("all", "min_p"):
        fields.update(min_p=torch.where(uniform(0, 1) < 0.3, 0.0, uniform(0.0, 0.6)))
    if features == "all":
        fields.update(
            repetition_penalty=torch.where(uniform(0, 1) < 0.3, 1.0, uniform(0.5, 2.0)),
            seen=torch.rand(batch, vocab, generator=gen) < 0.1,
            frequency_penalty=uniform(-2, 2),
            presence_penalty=uniform(-2, 2),
            counts=torch.randint(0, 4, (batch, vocab), generator=gen).float()
            * (torch.rand(batch, vocab, generator=gen) < 0.1),
        )
    inputs = SamplingInputs(**{k: v.to(device) for k, v in fields.items()})
    logits = torch.randn(batch, vocab, generator=gen) * 4
    return logits.to(device), inputs


@runnable
@pytest.mark.parametrize(("batch", "vocab", "features"), GRID)
def test_processed_logits_and_tokens_equal_reference(batch, vocab, features):
    from infergen.ops.sampling_triton import processed_logits_triton, sample_triton

    logits, inputs = make_inputs(batch, vocab, features, seed=batch * vocab)
    original = logits.clone()
    want = sampling.processed_logits(logits, inputs)  # the reference on the same device
    got = processed_logits_triton(logits, inputs)
    assert torch.equal(got, want), (got != want).nonzero()[:5]
    tokens = sample_triton(logits, inputs)
    assert torch.equal(logits, original), "the op must not modify its input"
    assert tokens.tolist() == sampling.reference(logits, inputs).tolist()
    assert torch.isfinite(want.gather(1, tokens.unsqueeze(1))).all(), "a dropped token drawn"
    greedy = (inputs.temperature <= 0).nonzero().squeeze(1)
    assert tokens[greedy].tolist() == sampling.penalize(logits, inputs)[greedy].argmax(-1).tolist()


@runnable
def test_greedy_rows_take_the_first_argmax():
    from infergen.ops.sampling_triton import sample_triton

    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [5.0, 0.0, 5.0, 5.0]], device=DEVICE)
    seeds = draws = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    inputs = SamplingInputs(torch.zeros(2, device=DEVICE), seeds, draws)
    assert sample_triton(logits, inputs).tolist() == [1, 0]


@runnable
def test_seeded_row_is_deterministic_and_independent_of_the_batch():
    from infergen.ops.sampling_triton import sample_triton

    logits, inputs = make_inputs(5, 300, "all", seed=7)
    logits = logits / 4  # flat-ish rows: the draw is far from the argmax
    batched = sample_triton(logits, inputs).tolist()
    assert sample_triton(logits, inputs).tolist() == batched
    for row in range(5):
        alone = SamplingInputs(*(None if v is None else v[row : row + 1] for v in inputs))
        assert sample_triton(logits[row : row + 1], alone).tolist() == [batched[row]]
    # the draw count and the seed change the stream
    rows = torch.zeros(8, 300, device=DEVICE)  # uniform: every draw is a fresh token
    one = torch.ones(8, device=DEVICE)
    seed = torch.full((8,), 42, dtype=torch.int64, device=DEVICE)
    counter = torch.arange(8, device=DEVICE)
    by_draw = sample_triton(rows, SamplingInputs(one, seed, counter)).tolist()
    by_seed = sample_triton(rows, SamplingInputs(one, counter, seed)).tolist()
    assert len(set(by_draw)) > 4 and len(set(by_seed)) > 4 and by_draw != by_seed


CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47}  # chi-square 0.999 quantiles by dof
PROBS = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
TRITON_ROWS = 40


@runnable
@pytest.mark.parametrize(
    ("params", "want"),
    [
        (dict(), PROBS),
        # T = 0.5 squares the probabilities; min-p 0.3 · max drops those below 0.3
        (dict(temperature=0.5, min_p=0.3), torch.tensor([0.16, 0.09, 0, 0, 0])),
        (dict(top_k=4, top_p=0.85), torch.tensor([0.4, 0.3, 0.15, 0, 0])),
        # p^(2/3) = .543 .448 .282 .215 .136: min-p keeps those >= 0.3 · .543
        (dict(temperature=1.5, min_p=0.3), PROBS ** (2 / 3) * (PROBS ** (2 / 3) >= 0.163)),
    ],
)
def test_draw_frequencies_match_softmax_of_processed_logits(params, want):
    from infergen.ops.sampling_triton import sample_triton

    draws = 4000
    full = lambda v, dtype=torch.float32: torch.full((draws,), v, dtype=dtype, device=DEVICE)  # noqa: E731
    inputs = SamplingInputs(
        temperature=full(params.get("temperature", 1.0)),
        seeds=torch.arange(draws, device=DEVICE) * 7919 + 3,
        draws=full(5, torch.int64),
        top_k=full(params["top_k"], torch.int64) if "top_k" in params else None,
        top_p=full(params["top_p"]) if "top_p" in params else None,
        min_p=full(params["min_p"]) if "min_p" in params else None,
    )
    logits = PROBS.log().repeat(draws, 1).to(DEVICE)
    expected = want.double() / want.sum() * draws
    softmax = sampling.processed_logits(logits, inputs)[0].softmax(-1).double().cpu()
    torch.testing.assert_close(softmax * draws, expected, rtol=1e-5, atol=1e-6)
    tokens = sampling.reference(logits, inputs)
    # the Triton row draws the reference's tokens (all of them on a GPU; the interpreter runs
    # one program per row slowly: the first rows there), so the frequencies are the row's
    rows = TRITON_ROWS if INTERPRETED else draws
    row_inputs = SamplingInputs(*(None if v is None else v[:rows] for v in inputs))
    assert torch.equal(sample_triton(logits[:rows], row_inputs), tokens[:rows])
    counts = torch.bincount(tokens.cpu(), minlength=5).double()
    kept = expected > 0
    assert counts[~kept].sum() == 0, "a dropped token was drawn"
    chi2 = float(((counts[kept] - expected[kept]) ** 2 / expected[kept]).sum())
    assert chi2 < CHI2_999[int(kept.sum()) - 1], (counts.tolist(), expected.tolist())


ENGINE_CASES = [
    dict(repetition_penalty=1.3),
    dict(temperature=0.6, top_k=5),
    dict(top_p=0.7),
    dict(min_p=0.2, temperature=1.4),
    dict(top_k=10, top_p=0.8, frequency_penalty=0.7, presence_penalty=-0.5),
    dict(temperature=0.0, repetition_penalty=1.5),
    dict(),
]


def test_reference_equals_the_generator_path_rule():
    gen = torch.Generator().manual_seed(1)
    states = []
    for i, case in enumerate(ENGINE_CASES):
        state = SamplingState(SamplingParams(**case), [3, 7, 7, i], engine_seed=5, request_index=i)
        for token in (11, 3, 11, i + 20):
            state.append(token)
        states.append(state)
    logits = torch.randn(len(states), 64, generator=gen) * 3
    inputs = sampling_inputs(states, 64, torch.device("cpu"))
    got = sampling.processed_logits(logits, inputs)
    want = process_logits(logits, states)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    torch.testing.assert_close(got, want)


@pytest.mark.skipif(not INTERPRETED or not HAS_TRITON, reason="needs Triton's interpreter")
def test_engine_with_triton_kernels_samples_seeded_rows_reproducibly(tmp_path):
    from infergen import LLM
    from infergen.ops.sampling_triton import sample_triton
    from tests.hf_models import build_hf_model

    build_hf_model("llama_gqa", tmp_path)
    llm = LLM(str(tmp_path), kernels="triton")
    assert llm.engine.sampler.batched is sample_triton
    params = SamplingParams(max_tokens=4, temperature=1.3, top_p=0.95, min_p=0.02, seed=11,
                            repetition_penalty=1.2, ignore_eos=True)  # fmt: skip
    others = SamplingParams(max_tokens=2, temperature=0.8, top_k=20, ignore_eos=True)
    prompt = [5, 17, 42, 99, 3]
    alone = llm.generate([prompt], params)[0].token_ids
    assert llm.generate([prompt], params)[0].token_ids == alone
    outs = llm.generate([[7, 8, 9], prompt, [100, 101]], [others, params, others])
    assert outs[1].token_ids == alone
    assert len(set(alone)) > 1  # a real draw, not a constant
