"""Fair under load: a huge prompt does not stall the requests already running. Every step
serves the running decodes first (one token each) and gives the long prompt only what is
left of the token budget, so it is prefilled in chunks across steps while the others keep
generating a token a step; requests are admitted first come, first served (README, "Serving
under load")."""

from __future__ import annotations

import pytest

from infergen import LLM, SamplingParams
from tests.hf_models import build_hf_model

BUDGET = 16  # max_num_batched_tokens


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama_gqa-")
    build_hf_model("llama_gqa", directory)
    return LLM(str(directory), max_num_batched_tokens=BUDGET, max_num_seqs=4).engine


def test_running_streams_get_a_token_every_step_while_a_huge_prompt_prefills(engine):
    greedy = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    short = [engine.add_request([5 + k, 6, 7, 8], greedy) for k in range(2)]
    engine.step()  # both prefilled: they decode from here on
    huge = engine.add_request(list(range(3, 203)), SamplingParams(max_tokens=2, ignore_eos=True))
    steps = 0
    while not engine.output(huge).token_ids:
        got = {delta.request_id for delta in engine.step() if delta.token_ids}
        steps += 1
        assert set(short) <= got  # no running stream skips a step
    # the 200-token prompt took the budget left beside the decodes, step after step
    assert steps == -(-200 // (BUDGET - len(short)))
    for rid in short:
        assert len(engine.output(rid).token_ids) == 1 + steps
    while engine.has_unfinished():
        engine.step()
