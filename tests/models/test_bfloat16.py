"""A bfloat16 engine (`LLM(dtype="bfloat16")`) against transformers in bfloat16, both judged by
transformers in float32: our error may be no more than twice transformers' own bf16 error.

(A bf16 engine used to fail in RoPE: its fp32 tables promoted q / k to fp32.) GPT-OSS is left
out: its tiny model has a near-tie between the 2nd and 3rd expert of one token (router logits
0.1336 / 0.1327, under one bf16 step), which bf16 rounding flips either way.
"""

from __future__ import annotations

import pytest
import torch

from infergen import LLM
from tests.hf_models import build_hf_model

FAMILIES = ["llama_mqa_tied", "llama_gqa", "qwen3_qk_norm", "gemma3", "mistral_window",
            "deepseek_v3", "qwen3_next", "falcon_h1", "mamba2"]  # fmt: skip


@pytest.mark.parametrize("name", FAMILIES)
def test_bf16_prefill_logits_as_close_as_transformers_bf16(name, tmp_path):
    hf = build_hf_model(name, tmp_path)
    torch.manual_seed(1)
    tokens = torch.randint(0, hf.config.vocab_size, (40,)).tolist()
    with torch.no_grad():
        truth = hf(torch.tensor([tokens])).logits[0]
        theirs = hf.to(torch.bfloat16)(torch.tensor([tokens])).logits[0].float()
    ours = LLM(str(tmp_path), dtype="bfloat16").engine.prompt_logits(tokens, chunk=16)
    their_error = (theirs - truth).abs().max()
    assert their_error > 0  # bf16 really ran
    assert (ours - truth).abs().max() <= 2 * their_error, name
