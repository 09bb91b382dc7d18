"""The engine with kernels="triton" (issue 22): on the CPU its Triton kernels run in Triton's
interpreter (TRITON_INTERPRET=1, tests/conftest.py). On tiny random transformers models of
llama (GQA), qwen2, qwen3, mistral and gemma3 (sliding windows), the greedy tokens and the
chosen tokens' logprobs equal the native CPU path's, with continuous batching, chunked
prefill, prefix-cache hits and preemption (a pool that forces it). The ops without a Triton
kernel yet run their torch row; decode and prefill attention, add + RMSNorm, RoPE, RoPE + KV
store (the models without QK-norm), SiLU-mul and GELU-mul (gemma3) run the Triton ones
(checked)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import pytest
import torch

from infergen import LLM, SamplingParams
from infergen.engine.engine import Engine
from infergen.engine.options import engine_config
from infergen.errors import ConfigError
from infergen.io.checkpoint import load_checkpoint
from infergen.ops import rope_kv_store_triton
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
ACTIVATION = dict.fromkeys(MODELS, "silu_mul_triton") | {"gemma3": "gelu_mul_triton"}
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2)


# (Gemma-3's run, the longest, only with the slow tests)
SLOW = {"gemma3"}


@pytest.fixture(
    scope="module",
    params=[pytest.param(m, marks=pytest.mark.slow) if m in SLOW else m for m in MODELS],
)
def model(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param + "-")
    build_hf_model(request.param, directory)
    return request.param, str(directory)


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    shared = torch.randint(3, 200, (20,), generator=gen).tolist()
    tails = [torch.randint(3, 200, (n,), generator=gen).tolist() for n in (5, 30, 11)]
    return [shared + tails[0], shared + tails[1], tails[2], shared + tails[0]]  # a repeat: hits


def _no_fallback(monkeypatch) -> None:
    """From here on, RoPE + KV store falling back to its torch row fails the test."""

    def fallback(*args, **kwargs):
        raise AssertionError("rope_kv_store_triton took the torch row")

    monkeypatch.setattr(rope_kv_store_triton, "rope_kv_store", fallback)


def test_greedy_and_logprobs_equal_the_native_path(model, monkeypatch):
    name, model_dir = model
    _no_fallback(monkeypatch)
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
    assert layer.attn.rope_store.__name__ == "rope_kv_store_triton"  # runs without QK-norm
    assert layer.mlp.act.__name__ == ACTIVATION[name]
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


@pytest.mark.slow
def test_fp8_kv_cache_codes_written_by_the_fused_kernel(tmp_path, monkeypatch):
    """kv_format="fp8_e4m3": the Triton RoPE + KV store writes the E4M3 codes (and the
    engine-dtype scratch cache of calibration); greedy tokens and logprobs equal the native
    path's, which encodes them with kv_format.encode."""
    build_hf_model("llama_gqa", tmp_path)
    options = dict(kv_format="fp8_e4m3", block_size=4, max_num_batched_tokens=16)
    native = LLM(str(tmp_path), kernels="native", **options)
    _no_fallback(monkeypatch)
    triton = LLM(str(tmp_path), kernels="triton", **options)
    assert triton.engine.runner.model.layers[0].attn.rope_store.__name__ == "rope_kv_store_triton"
    want = native.generate(_prompts()[:3], GREEDY)
    got = triton.generate(_prompts()[:3], GREEDY)
    for a, b in zip(got, want, strict=True):
        assert_greedy_equivalent(a, b)
        for x, y in zip(a.logprobs, b.logprobs, strict=False):
            if x.token_id != y.token_id:
                break
            assert abs(x.logprob - y.logprob) < 1e-3


def test_triton_kernels_without_the_interpreter_are_a_clear_error(model, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ConfigError, match="TRITON_INTERPRET=1"):
        LLM(model[1], kernels="triton")


def _default_model_slice(layers: int = 2):
    """The default model (SmolLM2-135M) cut to its first `layers` decoder layers."""
    checkpoint = load_checkpoint()
    keep = {f"model.layers.{i}." for i in range(layers)}
    tensors = {
        name: t
        for name, t in checkpoint.tensors.items()
        if not name.startswith("model.layers.") or any(name.startswith(k) for k in keep)
    }
    config = checkpoint.config.replace(num_hidden_layers=layers)
    return dataclasses.replace(checkpoint, config=config, tensors=tensors)


@pytest.mark.slow
def test_a_slice_of_the_default_model_equals_the_native_path():
    """Two layers of the real default model (GQA 9:3, head_dim 64, tied embeddings): the
    teacher-forced logits of a chunked prompt equal the native path's within fp32 tolerance
    and the greedy tokens of a batch (a prefix hit among them) are identical."""
    options = dict(block_size=4, max_num_batched_tokens=16, max_num_seqs=4)
    native = Engine(engine_config(kernels="native", **options), _default_model_slice())
    triton = Engine(engine_config(kernels="triton", **options), _default_model_slice())
    tokens = native.encode("The quick brown fox jumps over the lazy dog. " * 3)[:40]
    want, got = native.prompt_logits(tokens), triton.prompt_logits(tokens)
    assert torch.allclose(got, want, atol=2e-4, rtol=1e-4), (got - want).abs().max()
    prompts = [tokens[:23], tokens[:31], tokens[5:17], tokens[:23]]
    short = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logprobs=2)
    for engine in (native, triton):
        for i, prompt in enumerate(prompts):
            engine.add_request(prompt, short, request_id=f"r{i}")
        while engine.has_unfinished():
            engine.step()
    for i in range(len(prompts)):
        assert_greedy_equivalent(triton.output(f"r{i}"), native.output(f"r{i}"))
    assert triton.output("r3").num_cached_prompt_tokens > 0
