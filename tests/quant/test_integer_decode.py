"""W8A8 / W4A8 integer products in the fused decode step (kernels/decode_layers_f32.c formats
11-15: the projection kernel quantizes its input itself): bit for bit the per-op path, which
calls the same kernels one op at a time (tests/ops/test_linear_w8a8.py and test_linear_w4a8.py
check those against float64 oracles); a static int8 input scale keeps the per-op path."""

from __future__ import annotations

import pytest
import torch

from infergen import LLM
from tests.hf_models import build_hf_model


@pytest.mark.parametrize("weights", ["int8", "q4_0", "q4_1", "int4", "int4_asym"])
def test_fused_integer_decode_equals_the_per_op_path(weights, tmp_path, fused_steps):
    build_hf_model("llama_gqa", tmp_path, intermediate_size=128)  # (whole groups of 32)
    engine = LLM(str(tmp_path), kv_cache_memory="16MiB", weights=weights,
                 activations="int8").engine  # fmt: skip
    tokens = torch.randint(0, 211, (20,), generator=torch.Generator().manual_seed(3)).tolist()
    fused = engine.prompt_logits(tokens, chunk=1)
    assert sum(fused_steps) == len(tokens)
    engine.runner.model.fast_path = None
    assert torch.equal(fused, engine.prompt_logits(tokens, chunk=1)), weights


def test_a_static_input_scale_keeps_the_per_op_path(tmp_path, fused_steps):
    build_hf_model("llama_gqa", tmp_path, intermediate_size=128)
    engine = LLM(str(tmp_path), kv_cache_memory="16MiB", weights="int8",
                 activations="int8_static").engine  # fmt: skip
    engine.prompt_logits([5, 6, 7, 8], chunk=1)
    assert fused_steps and not any(fused_steps)
