"""The engine on a CUDA GPU (issue 22), run by benchmarks/device_check.sh where a GPU is lent
(skipped elsewhere: tests/engine/test_device.py checks the device rules without one, and
tests/models/test_cuda_graphs.py the graph path's buckets and padding).

The GPU machine has no transformers and no model files, so the models are built here from
random tensors (infergen/io/random_checkpoint.py; test_random_checkpoint.py checks them against
transformers on the CPU):

- the default model on the corpus (where its file is installed; else a random model of its
  shapes on random tokens, with a large embedding so its logits are peaked as a trained
  model's are) on the GPU (Triton kernels, CUDA graphs) against the CPU fp32 path: top-1
  agreement of teacher-forced logits >= 99 % in fp32, >= 95 % in bf16, and the same greedy
  tokens through the graphs;
- tiny random models of llama (GQA), qwen2, qwen3, mistral (window) and gemma3 in fp32 on
  the GPU against the native CPU path: greedy tokens and their logprobs equal (within fp32
  tolerance), with continuous batching, chunked prefill, prefix hits, preemption, and CUDA
  graphs on and off.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from infergen.engine.engine import Engine
from infergen.engine.options import engine_config
from infergen.engine.sampling_params import SamplingParams
from infergen.errors import CheckpointError
from infergen.io.checkpoint import load_checkpoint
from infergen.io.random_checkpoint import CONFIGS, SMOLLM2_135M, random_checkpoint
from tests.engine.greedy import assert_greedy_equivalent

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
TIGHT_BLOCKS = {"llama_gqa": 24, "qwen2_qkv_bias": 24, "qwen3_qk_norm": 24, "mistral_window": 12,
                "gemma3": 36}  # fmt: skip
CORPUS = Path(__file__).resolve().parents[2] / "data" / "shakespeare.txt"
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2)


def _default_model():
    """The default model's checkpoint, or a random one of its shapes where it is absent."""
    try:
        return load_checkpoint()
    except (CheckpointError, ImportError):
        return random_checkpoint(SMOLLM2_135M, head_std=1.0)


def _generate(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> list:
    ids = [engine.add_request(prompt, params) for prompt in prompts]
    while engine.has_unfinished():
        engine.step()
    return [engine.output(i) for i in ids]


def _tokens(engine: Engine) -> list[int]:
    """1024 tokens of the shipped corpus (random ids for a random model: no tokenizer)."""
    if engine.tokenizer is None:
        gen = torch.Generator().manual_seed(0)
        return torch.randint(3, engine.model_config.vocab_size, (1024,), generator=gen).tolist()
    return engine.encode(CORPUS.read_text()[:8000])[:1024]


@pytest.mark.parametrize(("dtype", "least"), [("float32", 0.99), ("bfloat16", 0.95)])
def test_default_model_on_the_gpu_agrees_with_the_cpu_fp32_path(dtype, least):
    """fp32 on the GPU: top-1 >= 99 % (the issue's bar); bf16 weights and activations lose
    mantissa bits a small model's close logits feel: >= 95 % (on the CPU, the same model in
    bf16 agrees with fp32 on 97.6 % of 1024 corpus tokens)."""
    cpu = Engine(engine_config(device="cpu", dtype="float32"), _default_model())
    gpu = Engine(engine_config(device="cuda", dtype=dtype), _default_model())
    assert gpu.config.kernels == "triton"
    assert gpu.graph_capture is not None  # decode graphs were recorded at start
    tokens = _tokens(cpu)
    want = cpu.prompt_logits(tokens).argmax(-1)
    got = gpu.prompt_logits(tokens).argmax(-1).cpu()
    agreement = (want == got).float().mean().item()
    assert agreement >= least, agreement
    prompts = [tokens[:40], tokens[100:117], tokens[:40]]  # the third: a prefix hit
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=2)
    for a, b in zip(_generate(gpu, prompts, params), _generate(cpu, prompts, params), strict=True):
        if dtype == "float32":
            assert_greedy_equivalent(a, b)
        else:
            assert a.token_ids[:2] == b.token_ids[:2]


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    shared = torch.randint(3, 200, (20,), generator=gen).tolist()
    tails = [torch.randint(3, 200, (n,), generator=gen).tolist() for n in (5, 30, 11)]
    return [shared + tails[0], shared + tails[1], tails[2], shared + tails[0]]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_tiny_models_on_the_gpu_equal_the_native_cpu_path(name):
    limits = dict(block_size=4, max_num_batched_tokens=16, num_kv_blocks=TIGHT_BLOCKS[name],
                  max_num_seqs=4, dtype="float32")  # fmt: skip
    native = Engine(
        engine_config(device="cpu", kernels="native", **limits), random_checkpoint(name)
    )
    want = _generate(native, _prompts(), GREEDY)
    for eager in (False, True):
        options = engine_config(device="cuda", enforce_eager=eager, **limits)
        gpu = Engine(options, random_checkpoint(name))
        got = _generate(gpu, _prompts(), GREEDY)
        for a, b in zip(got, want, strict=True):
            assert_greedy_equivalent(a, b)
            for x, y in zip(a.logprobs, b.logprobs, strict=False):
                if x.token_id != y.token_id:
                    break
                assert abs(x.logprob - y.logprob) < 1e-3
        assert gpu.scheduler.num_preemptions > 0
        assert (gpu.graph_capture is None) == eager
