"""The engine on a CUDA GPU (issue 22), run by benchmarks/device_check.sh where a GPU is lent
(skipped elsewhere: tests/engine/test_device.py checks the device rules without one).

- The default model in bf16 on the GPU (Triton kernels, CUDA graphs) against the CPU fp32
  path: top-1 agreement of teacher-forced logits >= 99 % over the shipped corpus.
- Tiny random transformers models (llama GQA, qwen2, qwen3, mistral with a window, gemma3)
  in fp32 on the GPU against the native CPU path: greedy tokens and their logprobs equal
  (within fp32 tolerance), with continuous batching, chunked prefill, prefix hits,
  preemption and CUDA-graph decode; and graphs on vs `enforce_eager`.
"""

from __future__ import annotations

import pathlib

import pytest
import torch

from infergen import LLM, SamplingParams
from tests.engine.greedy import assert_greedy_equivalent
from tests.hf_models import build_hf_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CORPUS = pathlib.Path(__file__).resolve().parents[2] / "data" / "shakespeare.txt"
TIGHT_BLOCKS = {"llama_gqa": 24, "qwen2_qkv_bias": 24, "qwen3_qk_norm": 24, "mistral_window": 12,
                "gemma3": 36}  # fmt: skip
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2)


def test_default_model_on_the_gpu_agrees_with_the_cpu_fp32_path():
    cpu = LLM(device="cpu", dtype="float32")
    gpu = LLM(device="cuda")
    assert gpu.engine.config.dtype == "bfloat16" and gpu.engine.config.kernels == "triton"
    assert gpu.engine.graph_capture is not None  # decode graphs were recorded at start
    tokens = cpu.engine.encode(CORPUS.read_text()[:6000])[:1024]
    want = cpu.engine.prompt_logits(tokens).argmax(-1)
    got = gpu.engine.prompt_logits(tokens).argmax(-1).cpu()
    agreement = (want == got).float().mean().item()
    assert agreement >= 0.99, agreement
    # generation through the graphs: the first tokens agree with the CPU's
    prompt = "The capital of France is"
    params = SamplingParams(max_tokens=8, temperature=0)
    assert (
        gpu.generate(prompt, params)[0].token_ids[:3]
        == cpu.generate(prompt, params)[0].token_ids[:3]
    )


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    shared = torch.randint(3, 200, (20,), generator=gen).tolist()
    tails = [torch.randint(3, 200, (n,), generator=gen).tolist() for n in (5, 30, 11)]
    return [shared + tails[0], shared + tails[1], tails[2], shared + tails[0]]


@pytest.mark.parametrize("name", list(TIGHT_BLOCKS))
def test_tiny_models_on_the_gpu_equal_the_native_cpu_path(name, tmp_path):
    build_hf_model(name, tmp_path)
    limits = dict(block_size=4, max_num_batched_tokens=16, num_kv_blocks=TIGHT_BLOCKS[name],
                  max_num_seqs=4, dtype="float32")  # fmt: skip
    native = LLM(str(tmp_path), device="cpu", kernels="native", **limits)
    want = native.generate(_prompts(), GREEDY)
    for eager in (False, True):
        gpu = LLM(str(tmp_path), device="cuda", enforce_eager=eager, **limits)
        got = gpu.generate(_prompts(), GREEDY)
        for a, b in zip(got, want, strict=True):
            assert_greedy_equivalent(a, b)
            for x, y in zip(a.logprobs, b.logprobs, strict=False):
                if x.token_id != y.token_id:
                    break
                assert abs(x.logprob - y.logprob) < 1e-3
        assert gpu.engine.scheduler.num_preemptions > 0
