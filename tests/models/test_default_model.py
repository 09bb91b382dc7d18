"""The default model (SmolLM2-135M-Instruct, Q4_1 GGUF) against transformers on the same GGUF.

transformers dequantizes the GGUF itself (its own code path), so it is an independent oracle:
teacher-forced top-1 agreement ≥ 99.5 % and perplexity within 0.5 % on real text.
"""

from __future__ import annotations

import math

import pytest
import torch

from infergen import LLM, SamplingParams

pytestmark = pytest.mark.slow
WINDOW = 1024


@pytest.fixture(scope="module")
def hf_model(default_model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(default_model_path.parent), gguf_file=default_model_path.name, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module")
def llm():
    return LLM(kv_cache_memory="256MiB", max_num_batched_tokens=WINDOW)


def _nll(logits: torch.Tensor, tokens: list[int]) -> float:
    targets = torch.tensor(tokens[1:])
    return torch.nn.functional.cross_entropy(logits[:-1].double(), targets, reduction="sum").item()


@pytest.mark.parametrize("corpus", ["python_docs.txt", "shakespeare.txt"])
def test_logits_agree_with_transformers(hf_model, llm, corpus):
    from pathlib import Path

    text = (Path(__file__).parents[2] / "data" / corpus).read_text(encoding="utf-8")
    tokens = llm.tokenizer.encode(text)[:WINDOW]
    assert len(tokens) == WINDOW
    with torch.no_grad():
        expected = hf_model(torch.tensor([tokens])).logits[0].float()
    got = llm.engine.prompt_logits(tokens, chunk=256)
    agreement = (got.argmax(-1) == expected.argmax(-1)).double().mean().item()
    ppl_ours = math.exp(_nll(got, tokens) / (WINDOW - 1))
    ppl_ref = math.exp(_nll(expected, tokens) / (WINDOW - 1))
    assert agreement >= 0.995, f"top-1 agreement {agreement:.4f}"
    assert abs(ppl_ours / ppl_ref - 1) <= 0.005, f"ppl {ppl_ours:.3f} vs {ppl_ref:.3f}"


def test_greedy_capital_of_france(llm):
    out = llm.generate("The capital of France is", SamplingParams(max_tokens=4, temperature=0))
    assert out[0].text.startswith(" Paris")
