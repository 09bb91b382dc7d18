"""The engine with kernels="triton" (issue 22): on the CPU its Triton kernels run in Triton's
interpreter (TRITON_INTERPRET=1, tests/conftest.py). On tiny random transformers models of
llama (GQA), qwen2, qwen3, mistral and gemma3 (sliding windows), the greedy tokens and the
chosen tokens' logprobs equal the native CPU path's, with continuous batching, chunked
prefill, prefix-cache hits and preemption (a pool that forces it). The ops without a Triton
kernel yet run their torch row; decode and prefill attention, add + RMSNorm, RoPE and SiLU-mul
run the Triton ones (checked)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from infergen import LLM, SamplingParams
from infergen.errors import ConfigError
from tests.engine.greedy import assert_greedy_equivalent
from tests.hf_models import build_hf_model

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs Triton and its interpreter",
)
# the model → a pool of blocks of 4 that forces preemption but fits every request alone (a
# windowed model lets blocks go as its window moves: it needs a tighter pool)
TIGHT_BLOCKS = {"llama_gqa": 24, "qwen2_qkv_bias": 24, "qwen3_qk_norm": 24, "mistral_window": 12,
                "gemma3": 36}  # fmt: skip
MODELS = list(TIGHT_BLOCKS)
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2)


@pytest.fixture(scope="module", params=MODELS)
def model(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param + "-")
    build_hf_model(request.param, directory)
    return request.param, str(directory)


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    shared = torch.randint(3, 200, (20,), generator=gen).tolist()
    tails = [torch.randint(3, 200, (n,), generator=gen).tolist() for n in (5, 30, 11)]
    return [shared + tails[0], shared + tails[1], tails[2], shared + tails[0]]  # a repeat: hits


def test_greedy_and_logprobs_equal_the_native_path(model):
    name, model_dir = model
    # chunks of 16 tokens and a tight pool: long prompts are chunked, sequences get preempted
    limits = dict(block_size=4, max_num_batched_tokens=16, num_kv_blocks=TIGHT_BLOCKS[name],
                  max_num_seqs=4)  # fmt: skip
    native = LLM(model_dir, kernels="native", **limits)
    triton = LLM(model_dir, kernels="triton", **limits)
    layer = triton.engine.runner.model.layers[0]
    assert layer.attn.decode.__name__ == "decode_attention_triton"
    assert layer.attn.prefill.__name__ == "prefill_attention_triton"
    assert layer.attn_norm.fn.__name__ == "add_rms_norm_triton"
    assert layer.attn.rope.__name__ == "apply_rope_triton"
    want = native.generate(_prompts(), GREEDY)
    got = triton.generate(_prompts(), GREEDY)
    for a, b in zip(got, want, strict=True):
        assert_greedy_equivalent(a, b)
        for x, y in zip(a.logprobs, b.logprobs, strict=False):
            if x.token_id != y.token_id:
                break
            assert abs(x.logprob - y.logprob) < 1e-4
    assert triton.engine.scheduler.num_preemptions > 0
    # a prompt twice in a roomy pool: the second reads its prefix from the cache
    roomy = LLM(model_dir, kernels="triton", block_size=4)
    first, again = (roomy.generate(_prompts()[0], GREEDY)[0] for _ in range(2))
    assert again.num_cached_prompt_tokens > 0
    assert_greedy_equivalent(first, want[0])
    assert_greedy_equivalent(again, want[0])


def test_triton_kernels_without_the_interpreter_are_a_clear_error(model, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ConfigError, match="TRITON_INTERPRET=1"):
        LLM(model[1], kernels="triton")
