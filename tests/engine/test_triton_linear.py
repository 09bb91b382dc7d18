"""Quantized projections of the engine with kernels="triton" (issue 22): a weight scheme's
projections run the "<format>:triton" rows (ops/linear_triton_rows.py: the weight-only Triton
kernel; W8A8 FP8 through torch._scaled_mm), the LM head and its tied embedding included. On
a tiny random tied Llama, greedy tokens and their logprobs equal kernels="torch" with the
same scheme (the CPU rows, the same dequantized weights); a GGUF file's blocks run as loaded
("gguf") give the CPU rows' logits. Kernels run in Triton's interpreter
(TRITON_INTERPRET=1, tests/conftest.py)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from infergen import LLM, SamplingParams
from infergen.io.checkpoint import load_checkpoint
from infergen.ops.linear import LINEAR_BACKENDS
from tests.engine.greedy import assert_greedy_equivalent
from tests.hf_models import build_hf_model

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs Triton and its interpreter",
)
GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=2)
PROMPTS = [[5, 9, 33, 100, 7, 61], [44, 12, 150]]
SMALL = dict(block_size=4, num_kv_blocks=16)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tied Llama (the LM head's rows are the embedding) whose inputs are whole groups."""
    directory = tmp_path_factory.mktemp("tied-")
    build_hf_model("llama_mqa_tied", directory, intermediate_size=128, num_hidden_layers=2)
    return str(directory)


@pytest.mark.parametrize(
    "weights,activations",
    [("int8", None), ("int4", None), ("nvfp4", None), ("fp8_e4m3", "fp8_e4m3")],
)
def test_greedy_and_logprobs_equal_the_cpu_rows(model_dir, weights, activations, monkeypatch):
    calls = []
    real = torch._scaled_mm
    monkeypatch.setattr(torch, "_scaled_mm", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    options = dict(weights=weights, activations=activations, **SMALL)
    triton = LLM(model_dir, kernels="triton", **options)
    model = triton.engine.runner.model
    row = LINEAR_BACKENDS.get(f"{weights}:triton")
    assert model.layers[0].attn.qkv.backend is row and model.lm_head.backend is row
    assert model.embed is None  # tied: the embedding lookup is lm_head.rows
    got = triton.generate(PROMPTS, GREEDY)
    # W8A8: the projections' products are torch._scaled_mm's (the LM head keeps fp32 inputs)
    assert bool(calls) == (activations is not None)
    want = LLM(model_dir, kernels="torch", **options).generate(PROMPTS, GREEDY)
    for a, b in zip(got, want, strict=True):
        assert_greedy_equivalent(a, b)
        for x, y in zip(a.logprobs, b.logprobs, strict=True):
            assert abs(x.logprob - y.logprob) < 1e-4
            top_a, top_b = dict(x.top), dict(y.top)
            assert all(abs(top_a[t] - top_b[t]) < 1e-4 for t in top_a.keys() & top_b.keys())


def test_gguf_blocks_as_loaded(tmp_path):
    gguf = pytest.importorskip("gguf")
    from tests.io.test_gguf import _write_gguf, tiny_llama

    path = tmp_path / "tiny-q4_0.gguf"
    _write_gguf(path, tiny_llama(num_hidden_layers=1), gguf.GGMLQuantizationType.Q4_0)
    triton = LLM(checkpoint=load_checkpoint(path, keep_blocks=True), kernels="triton",
                 weights="gguf", **SMALL)  # fmt: skip
    assert triton.engine.runner.model.layers[0].attn.qkv.backend is LINEAR_BACKENDS.get(
        "q4_0:triton"
    )
    cpu = LLM(checkpoint=load_checkpoint(path, keep_blocks=True), kernels="torch",
              weights="gguf", **SMALL)  # fmt: skip
    assert cpu.engine.runner.model.layers[0].attn.qkv.backend is LINEAR_BACKENDS.get("q4_0")
    tokens = [3, 17, 40, 8, 91, 2, 55]
    got = triton.engine.prompt_logits(tokens)
    torch.testing.assert_close(got, cpu.engine.prompt_logits(tokens), rtol=1e-4, atol=1e-4)
