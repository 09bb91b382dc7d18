"""The "bf16" weight scheme in the engine (ops/linear_bf16.py): every projection (the LM head
included) with bf16 weights and its input rounded to bf16, the rest fp32. Oracle: transformers'
fp32 model with every projection weight rounded to bf16 by torch and every projection input
rounded to bf16 by a pre-hook (the kernel's exact order is checked in
tests/ops/test_linear_bf16.py)."""

from __future__ import annotations

import pytest
import torch

from infergen import LLM
from infergen.quant.schemes import dequantized_weight
from tests.hf_models import build_hf_model, fake_quantize
from tests.quant.test_calibration import ALL_PROJECTIONS, _pre_hooks


def _round_input(module, args):
    return (args[0].to(torch.bfloat16).float(),)


def test_engine_equals_transformers_with_bf16_weights_and_inputs(tmp_path):
    hf_model = build_hf_model("llama_gqa", tmp_path)
    llm = LLM(str(tmp_path), kv_cache_memory="16MiB", weights="bf16")
    tokens = torch.randint(0, 211, (24,), generator=torch.Generator().manual_seed(5)).tolist()
    got = llm.engine.prompt_logits(tokens)
    with torch.no_grad():
        unrounded = hf_model(torch.tensor([tokens])).logits[0]
    fake_quantize(hf_model, lambda w: dequantized_weight("bf16", w.float()))
    hooks = _pre_hooks(hf_model, ALL_PROJECTIONS, lambda name: _round_input)
    hooks.append(hf_model.lm_head.register_forward_pre_hook(_round_input))
    with torch.no_grad():
        expected = hf_model(torch.tensor([tokens])).logits[0]
    for h in hooks:
        h.remove()
    # mean, not max: an input within fp32 noise of a bf16 rounding boundary rounds either way
    # (engine and transformers sum in different orders), and a few such flips set the max
    tolerance = 2e-5 * expected.abs().max()
    assert (got - expected).abs().mean() <= tolerance
    assert (got - unrounded).abs().mean() > 10 * tolerance  # the test can tell them apart


@pytest.mark.parametrize("name", ["llama_gqa", "llama_mqa_tied", "llama_bias"])
def test_fused_decode_step_equals_the_per_op_path(name, tmp_path, fused_steps):
    """decode_format 10: the fused decode step (kernels/decode_layers_f32.c) runs the bf16
    panels with the same kernel, bit for bit the per-op path (a tied LM head and biases too)."""
    build_hf_model(name, tmp_path)
    engine = LLM(str(tmp_path), kv_cache_memory="16MiB", weights="bf16").engine
    tokens = torch.randint(0, 211, (20,), generator=torch.Generator().manual_seed(3)).tolist()
    fused = engine.prompt_logits(tokens, chunk=1)
    assert sum(fused_steps) == len(tokens)
    engine.runner.model.fast_path = None
    assert torch.equal(fused, engine.prompt_logits(tokens, chunk=1)), name
