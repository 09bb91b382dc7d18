"""Quest-style sparse decode inside the engine (CacheConfig.sparse_decode_blocks): with k at
least every block it equals dense decode; with a small k it reads a small, reported share of
the KV; block summaries follow block reuse; unsupported attention is refused clearly."""

from __future__ import annotations

import pytest
import torch

from infergen import LLM, SamplingParams
from infergen.errors import ConfigError
from tests.hf_models import build_hf_model

GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama_gqa")
    build_hf_model("llama_gqa", directory)
    return str(directory)


def _prompts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 211, (n,), generator=gen).tolist() for n in lengths]


def test_all_blocks_equals_dense(model_dir):
    prompts = _prompts([90, 7, 45])
    dense = LLM(model_dir, block_size=4).generate(prompts, GREEDY)
    sparse_llm = LLM(model_dir, block_size=4, sparse_decode_blocks=64)  # > any sequence's
    sparse = sparse_llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in sparse] == [o.token_ids for o in dense]
    assert sparse_llm.engine.sparse_read_fraction() == 1.0


def test_few_blocks_read_a_reported_share(model_dir):
    llm = LLM(model_dir, block_size=4, sparse_decode_blocks=3, sparse_keep_first=1)
    out = llm.generate(_prompts([160], seed=1), GREEDY)[0]
    assert len(out.token_ids) == 16
    fraction = llm.engine.sparse_read_fraction()
    # each decode reads 3 blocks of 4 of a 160-175 token context: about 7 %
    assert 0.05 < fraction < 0.09, fraction


def test_summaries_follow_block_reuse(model_dir):
    """Blocks freed by one request and handed to the next start with empty summaries: the
    second request's all-blocks decode still equals dense."""
    llm = LLM(model_dir, block_size=4, num_kv_blocks=40, sparse_decode_blocks=40,
              enable_prefix_caching=False)  # fmt: skip
    dense = LLM(model_dir, block_size=4, num_kv_blocks=40, enable_prefix_caching=False)
    for prompt in _prompts([100, 60, 120], seed=2):
        assert (
            llm.generate(prompt, GREEDY)[0].token_ids == dense.generate(prompt, GREEDY)[0].token_ids
        )


@pytest.mark.parametrize("name,why", [("gpt_oss", "sinks"), ("deepseek_v2", "per-head K and V")])
def test_unsupported_attention_is_refused(tmp_path, name, why):
    build_hf_model(name, tmp_path)
    with pytest.raises(ConfigError, match=why):
        LLM(str(tmp_path), sparse_decode_blocks=8)
