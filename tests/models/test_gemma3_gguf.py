"""The real sliding-window model: Gemma-3-270M (Q4_K_M GGUF, packaged) against transformers on
the same GGUF file.

transformers dequantizes the GGUF itself and runs its own Gemma-3 (five 512-token sliding
layers per global layer, local RoPE base, QK-norm, GeGLU, sandwich norms, scaled embeddings):
an independent oracle. The text is 3× the window long and scored in chunks, so the windowed
cache groups release blocks while the prompt is read.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from infergen import LLM
from infergen.io.packaged_models import gemma3_270m_path

pytestmark = pytest.mark.slow
TOKENS = 1536


@pytest.fixture(scope="module")
def path():
    return gemma3_270m_path()


def test_teacher_forced_top1_agrees_with_transformers(path):
    from transformers import AutoModelForCausalLM

    llm = LLM(str(path), kv_cache_memory="256MiB", max_num_batched_tokens=256)
    text = (Path(__file__).parents[2] / "data" / "python_docs.txt").read_text(encoding="utf-8")
    tokens = llm.tokenizer.encode(text)[:TOKENS]
    assert len(tokens) == TOKENS
    got = llm.engine.prompt_logits(tokens, chunk=256).argmax(-1)
    assert llm.engine.pool.num_free == llm.engine.pool.num_blocks  # all released after
    del llm
    hf = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    assert hf.config.sliding_window == 512
    with torch.no_grad():
        expected = hf(torch.tensor([tokens])).logits[0].argmax(-1)
    agreement = (got == expected).double().mean().item()
    assert agreement >= 0.995, f"top-1 agreement {agreement:.4f}"
