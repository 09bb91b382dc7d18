"""StreamingLLM (EngineConfig.streaming_window / streaming_sinks): every attention layer reads
the last W positions and the first S. Oracle: transformers' own Llama run with the same rule as
an explicit 4-D attention mask. The blocks between the sinks and the window go back to the pool:
a sequence's cache stays flat however long it runs."""

from __future__ import annotations

import pytest
import torch

from infergen import LLM, SamplingParams
from infergen.errors import ConfigError
from infergen.kvcache.groups import NO_BLOCK
from tests.hf_models import build_hf_model

WINDOW, SINKS = 12, 3


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama_gqa")
    hf = build_hf_model("llama_gqa", directory)
    return hf, str(directory)


def _streaming_mask(length: int) -> torch.Tensor:
    """[1, 1, length, length] additive mask: key k visible to query q when k ≤ q and
    (q − W < k or k < S)."""
    q = torch.arange(length)[:, None]
    k = torch.arange(length)[None, :]
    allowed = (k <= q) & ((k > q - WINDOW) | (k < SINKS))
    return torch.zeros(length, length).masked_fill(~allowed, float("-inf"))[None, None]


def test_logits_match_transformers_with_the_streaming_mask(pair):
    hf, directory = pair
    llm = LLM(directory, block_size=4, streaming_window=WINDOW, streaming_sinks=SINKS)
    tokens = torch.randint(0, 211, (50,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        expected = hf(torch.tensor([tokens]), attention_mask=_streaming_mask(50)).logits[0]
    for chunk in (50, 16, 1):  # one prefill; chunks over released blocks; decode steps
        got = llm.engine.prompt_logits(tokens, chunk=chunk)
        assert (got - expected).abs().max() <= 1e-4 * expected.abs().max(), chunk


def test_cache_stays_flat_and_is_released(pair):
    _, directory = pair
    llm = LLM(directory, block_size=4, max_num_batched_tokens=16, num_kv_blocks=64,
              streaming_window=WINDOW, streaming_sinks=SINKS)  # fmt: skip
    engine = llm.engine
    engine.add_request(list(range(1, 30)), SamplingParams(max_tokens=120, ignore_eos=True))
    seq = engine.scheduler.waiting[0]
    held = []
    while engine.has_unfinished():
        engine.step()
        if seq.blocks:
            held.append(sum(b != NO_BLOCK for b in seq.blocks[0]))
            assert seq.blocks[0][0] != NO_BLOCK  # the sink block stays
    bound = engine.kv_cache.groups[0].blocks_held(10**6, 16, 4)
    assert max(held) <= bound < 12  # 149 tokens would take 38 blocks without the window
    assert engine.pool.num_free == 64


def test_models_with_their_own_windows_are_refused(tmp_path):
    build_hf_model("gemma3", tmp_path)
    with pytest.raises(ConfigError, match="own sliding windows"):
        LLM(str(tmp_path), streaming_window=64)
