"""The compiled layers with the Triton kernel set (compile="jit", kernels="triton": the fused
groups rendered by codegen_triton.py, the gate/up GEMM with its SiLU-mul as one fused
Triton GEMM, codegen_triton_gemm.py; the other ops on the engine's Triton / torch rows)
against the native CPU engine: greedy tokens identical and logprobs within fp32 rounding, with
chunked prefill and a prefix-cache hit; the fused groups really ran as Triton kernels, and a
second start finds them in the JIT cache. "eager" with the Triton rows too. In Triton's
interpreter on the CPU (TRITON_INTERPRET=1, tests/conftest.py), or compiled for a GPU with
TRITON_INTERPRET=0 (benchmarks/device_check.sh: fp32 there, the renderer's dtype; the
reference is then the torch kernels on the CPU)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from infergen import LLM, SamplingParams
from infergen.compiler import runtime
from infergen.compiler.codegen_triton import TritonGroupKernel
from infergen.compiler.codegen_triton_gemm import TritonGemmEpilogueKernel
from infergen.compiler.jit_cache import JitCache
from tests.engine.greedy import assert_greedy_equivalent
from tests.hf_models import build_hf_model
from tests.triton_env import INTERPRETED, runnable

pytestmark = [
    runnable,
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None, reason="builds models with transformers"
    ),
]
GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=2)
# blocks of 4, chunks of 16 tokens: the 25- and 30-token prompts are prefilled in chunks
LIMITS = dict(block_size=4, max_num_batched_tokens=16, max_num_seqs=4, kv_cache_memory="1MiB")
TRITON = dict(kernels="triton", dtype="float32", device="cpu" if INTERPRETED else "cuda")
# the oracle: the native C kernels on the CPU (the torch ones where the device check runs)
REFERENCE = dict(kernels="native" if INTERPRETED else "torch", device="cpu")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama_gqa-")
    build_hf_model("llama_gqa", directory)
    return str(directory)


@pytest.fixture(autouse=True)
def private_jit_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "JitCache", lambda: JitCache(tmp_path / "jit"))


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    shared = torch.randint(3, 200, (16,), generator=gen).tolist()
    tails = [torch.randint(3, 200, (n,), generator=gen).tolist() for n in (9, 14, 3)]
    return [shared + tails[0], shared + tails[1], tails[2]]


def _layers(llm: LLM):
    engine = llm.engine
    return engine.runner.model.fast_path_for(engine.kv_cache)


def _assert_same(got, want) -> None:
    for a, b in zip(got, want, strict=True):
        assert_greedy_equivalent(a, b)
        for x, y in zip(a.logprobs, b.logprobs, strict=False):
            if x.token_id != y.token_id:
                break
            assert abs(x.logprob - y.logprob) < 1e-4


def test_jit_runs_the_fused_groups_as_triton_kernels(model_dir):
    reference = LLM(model_dir, **REFERENCE, **LIMITS)
    compiled = LLM(model_dir, compile="jit", **TRITON, **LIMITS)
    layers = _layers(compiled)
    report = compiled.engine.compile_report
    kernels = [k for variants in layers.kernels.values() for k in variants.values()]
    # the two RMSNorm groups, RoPE (inside the KV store group), SiLU-mul (after the GEMM)
    assert len(kernels) == 4, report.groups_op_by_op
    assert all(isinstance(k, TritonGroupKernel) for k in kernels)
    # the gate/up GEMM and its SiLU-mul: one fused Triton GEMM (its tail's group unused) —
    # though its 136 columns a part are no whole number of the C template's 24-column panels
    (fused,) = layers.gemm_epilogues.values()
    assert isinstance(fused, TritonGemmEpilogueKernel), report.epilogues_unfused
    tail = fused.epilogue.tail
    assert report.target == "triton" and layers.program is None  # no C layer program
    assert report.kernels_built + report.kernels_cached == len(kernels) + 1
    assert report.kernels_built >= 4 and report.compile_seconds > 0
    assert layers.ops.prefill.__name__ == "prefill_attention_triton"
    assert layers.ops.decode.__name__ == "decode_attention_triton"

    want = reference.generate(_prompts(), GREEDY)
    got = compiled.generate(_prompts(), GREEDY)
    _assert_same(got, want)
    # every fused group ran as its Triton kernel, the fused GEMM's tail inside it
    assert all((k.calls > 0) != (k.graph is tail) for k in kernels)
    assert fused.calls > 0
    # the first prompt again: its prefix comes from the cache (a prefill of the tail only)
    again = compiled.generate(_prompts()[0], GREEDY)[0]
    assert again.num_cached_prompt_tokens > 0
    _assert_same([again], want[:1])

    second = LLM(model_dir, compile="jit", **TRITON, **LIMITS).engine.compile_report
    assert second.kernels_built == 0 and second.kernels_cached == len(kernels) + 1


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_prompt_logits_equal_the_native_path(model_dir, mode):
    """Prefill in chunks then decode steps, through the captured graph with the Triton rows."""
    reference = LLM(model_dir, **REFERENCE, **LIMITS)
    compiled = LLM(model_dir, compile=mode, **TRITON, **LIMITS)
    tokens = _prompts()[1][:19]
    for chunk in (7, 1):
        expected = reference.engine.prompt_logits(tokens, chunk=chunk)
        got = compiled.engine.prompt_logits(tokens, chunk=chunk).cpu()
        assert (got - expected).abs().max() <= 1e-4 * expected.abs().max(), chunk


def test_a_quantized_projection_runs_its_gemm_then_the_tail(model_dir):
    """int8 weights (the "int8:triton" row's layout, not a dense fp32 [N, K]): the fused
    GEMM is not built, the compile report says why, and the gate/up GEMM and its SiLU-mul
    run one after the other — logits equal the native int8 engine's."""
    reference = LLM(model_dir, weights="int8", **REFERENCE, **LIMITS)
    compiled = LLM(model_dir, compile="jit", weights="int8", **TRITON, **LIMITS)
    layers = _layers(compiled)
    assert layers.gemm_epilogues == {}
    assert any("dense fp32" in why for why in layers.report.epilogues_unfused)
    tokens = _prompts()[0][:12]
    for chunk in (12, 1):
        expected = reference.engine.prompt_logits(tokens, chunk=chunk)
        got = compiled.engine.prompt_logits(tokens, chunk=chunk).cpu()
        assert (got - expected).abs().max() <= 1e-4 * expected.abs().max(), chunk
