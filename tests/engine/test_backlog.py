"""The wait estimate behind the server's admission by cost (engine/backlog.py), against the
engine itself: counted in steps (StepCost(1, 0)), requests that cannot stop early
(ignore_eos), admitted by the reserving policy, are admitted after exactly the estimated number
of steps, whether seats (max_num_seqs) or KV blocks are what they wait for; a request that may
stop early is estimated as if it generated the recent requests' typical length, i.e. as the
engine runs a request of that length. Prompt tokens share one budget: at a cost per prompt
token only, a request waits for every prompt token ahead of it. The step costs are fitted
from measured steps."""

from __future__ import annotations

import random

import numpy as np
import pytest

from infergen import LLM, SamplingParams
from infergen.engine.backlog import OutputLengths, StepCost
from infergen.engine.request import Status
from tests.hf_models import build_hf_model

STEPS = StepCost(decode_step=1.0, prefill_token=0.0)  # the estimate in engine steps


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama_gqa-")
    build_hf_model("llama_gqa", directory)
    return str(directory)


def _admission_steps(engine, request_ids) -> dict[str, int]:
    """Run the engine; the steps each request waited before the step that admitted it."""
    seqs = {rid: engine._requests[rid] for rid in request_ids}
    admitted, steps = {}, 0
    while engine.has_unfinished():
        engine.step()
        for rid, seq in seqs.items():
            if rid not in admitted and seq.status is not Status.WAITING:
                admitted[rid] = steps
        steps += 1
    return admitted


@pytest.mark.parametrize(
    "limits",
    [
        dict(max_num_seqs=3),  # plenty of KV: requests wait for a seat
        dict(max_num_seqs=16, num_kv_blocks=40),  # seats to spare: they wait for KV blocks
        dict(max_num_seqs=2, num_kv_blocks=30),  # both
    ],
)
def test_estimate_is_the_engines_admission_step(model_dir, limits):
    llm = LLM(model_dir, block_size=4, admission="reserve", max_num_batched_tokens=512, **limits)
    engine, rng = llm.engine, random.Random(7)
    ids = []
    for _ in range(9):
        prompt = [rng.randrange(3, 200) for _ in range(rng.randrange(3, 30))]
        params = SamplingParams(max_tokens=rng.randrange(1, 40), temperature=0, ignore_eos=True)
        ids.append(engine.add_request(prompt, params))
    estimated = {rid: engine.seconds_until_admitted(rid, STEPS) for rid in ids}
    assert max(estimated.values()) > 0  # the case waits
    assert _admission_steps(engine, ids) == estimated


def test_estimate_mid_run_counts_what_running_requests_have_left(model_dir):
    llm = LLM(model_dir, block_size=4, admission="reserve", max_num_seqs=2)
    engine = llm.engine
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (12, 20, 5)]
    ids = [engine.add_request([5, 6, 7, 8], p) for p in params]
    for _ in range(4):  # the first two run, partway
        engine.step()
    late = engine.add_request([9, 10], SamplingParams(max_tokens=3, ignore_eos=True))
    estimate = {rid: engine.seconds_until_admitted(rid, STEPS) for rid in (ids[2], late)}
    assert _admission_steps(engine, [ids[2], late]) == estimate


def test_requests_that_may_stop_early_are_estimated_at_the_typical_length(model_dir):
    """Estimated with typical length T, requests with max_tokens M that may stop at EOS wait
    as long as the engine makes requests of min(M, T) tokens wait."""
    typical, lengths = 6, [(4, 30), (5, 3), (6, 50), (3, 12)]  # (prompt length, max_tokens)
    may_stop = LLM(model_dir, block_size=4, admission="reserve", max_num_seqs=1)
    for n in [typical] * 10:
        may_stop.engine.output_lengths.add(n)
    assert may_stop.engine.output_lengths.typical() == typical
    exact = LLM(model_dir, block_size=4, admission="reserve", max_num_seqs=1)
    a, b = [], []
    for k, (prompt_len, max_tokens) in enumerate(lengths):
        prompt = list(range(10 + k, 10 + k + prompt_len))
        a.append(may_stop.engine.add_request(prompt, SamplingParams(max_tokens=max_tokens)))
        capped = SamplingParams(max_tokens=min(max_tokens, typical), ignore_eos=True)
        b.append(exact.engine.add_request(prompt, capped))
    estimated = [may_stop.engine.seconds_until_admitted(rid, STEPS) for rid in a]
    measured = _admission_steps(exact.engine, b)
    assert estimated == [measured[rid] for rid in b]


def test_typical_length_is_the_90th_percentile_of_the_recent_window():
    rng = np.random.default_rng(0)
    lengths = OutputLengths(window=50)
    assert lengths.typical() is None
    values = rng.integers(1, 500, size=120).tolist()
    for n in values:
        lengths.add(int(n))
    assert lengths.typical() == int(np.percentile(values[-50:], 90, method="higher"))


def test_estimate_refuses_a_request_that_is_not_waiting(model_dir):
    engine = LLM(model_dir, block_size=4).engine
    rid = engine.add_request([5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()
    with pytest.raises(ValueError, match="not waiting"):
        engine.seconds_until_admitted(rid, STEPS)


def test_prompts_ahead_are_waited_for_token_by_token(model_dir):
    """At a cost per prompt token only (decode steps free), with seats and KV to spare, a
    request can begin once every prompt token ahead of it (running or waiting) is computed."""
    engine = LLM(model_dir, block_size=4, max_num_seqs=16, max_num_batched_tokens=8).engine
    lengths = [20, 5, 13, 30, 9]
    ids = [engine.add_request(list(range(3, 3 + n)), SamplingParams(max_tokens=4)) for n in lengths]
    engine.step()  # the first prompt is partly computed (8 of its 20 tokens)
    cost = StepCost(decode_step=0.0, prefill_token=1.0)
    left = [20 - 8, *lengths[1:]]
    for k, rid in enumerate(ids[1:], 1):
        assert engine.seconds_until_admitted(rid, cost) == sum(left[:k])


def test_step_costs_are_fitted_from_measured_steps():
    """Steps that take a + b * (prompt tokens) seconds: the fit finds a and b."""
    a, b, cost = 0.03, 0.002, StepCost()
    assert not cost.known
    for k in range(200):
        tokens = 0 if k % 3 else 100 + k
        cost.observe(a + b * tokens, tokens)
    assert cost.known
    assert cost.decode_step == pytest.approx(a)
    assert cost.prefill_token == pytest.approx(b, rel=1e-3)  # (a moving average converging)
