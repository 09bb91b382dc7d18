"""FP8 attention operands (ops/attention_operands.py).

Oracle: a float64 attention whose Q rows and softmax probabilities are rounded to E4M3 by
ml_dtypes (per (token, head) scale amax / 448 for Q; P · 448 for P): the op agrees to float
rounding (a score one ulp away can move a probability across an FP8 rounding boundary, so a
few elements may differ by one code), and lies much closer to it than fp32 attention does. The
engine's decode path (one query against the cache) equals its prefill path."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from infergen import LLM
from infergen.errors import InfergenError
from infergen.ops.attention_operands import ATTENTION_OPERANDS


def _e4m3(x: np.ndarray, scale) -> np.ndarray:
    y = np.clip(x / scale, -448, 448).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    return y.astype(np.float64) * scale


def _reference(q, k, v, scale, causal):
    """q [b, h, lq, d], k/v [b, kvh, lk, d] → float64 [b, h, lq, d]."""
    q, k, v = (t.double().numpy() for t in (q, k, v))
    b, h, lq, d = q.shape
    group, lk = h // k.shape[1], k.shape[2]
    out = np.zeros((b, h, lq, d))
    for i in range(b):
        for j in range(h):
            for t in range(lq):
                row = q[i, j, t]
                qs = np.abs(row).max() / 448 or 1.0
                scores = _e4m3(row, qs) @ k[i, j // group].T * scale
                if causal:
                    scores[np.arange(lk) > lk - lq + t] = -np.inf
                p = np.exp(scores - scores.max())
                p = _e4m3(p / p.sum(), 1 / 448)
                out[i, j, t] = p @ v[i, j // group]
    return torch.from_numpy(out)


@pytest.mark.parametrize("heads,kv_heads,lq,lk", [(4, 2, 1, 37), (4, 4, 9, 9), (6, 1, 5, 20)])
def test_fp8_attention_matches_float64_with_fp8_rounding(heads, kv_heads, lq, lk):
    gen = torch.Generator().manual_seed(heads + lk)
    q = torch.randn(2, heads, lq, 16, generator=gen) * 2
    k = torch.randn(2, kv_heads, lk, 16, generator=gen)
    v = torch.randn(2, kv_heads, lk, 16, generator=gen)
    causal = lq > 1
    fp8 = ATTENTION_OPERANDS.get("fp8_e4m3")
    got = fp8(q, k, v, is_causal=causal, scale=0.25, enable_gqa=True).double()
    expected = _reference(q, k, v, 0.25, causal)
    fp32 = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.25,
                                          enable_gqa=True).double()  # fmt: skip
    error, fp32_error = (got - expected).abs(), (fp32 - expected).abs()
    assert error.max() <= 0.02 * v.abs().max()
    assert error.mean() * 5 < fp32_error.mean()  # the FP8 rounding is there, and it is ours


def test_mask_and_causal_agree():
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=gen) for _ in range(3))
    fp8 = ATTENTION_OPERANDS.get("fp8_e4m3")
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    assert torch.equal(fp8(q, k, v, is_causal=True), fp8(q, k, v, attn_mask=mask))


def test_engine_decode_path_equals_prefill_and_needs_the_fp8_cache(tmp_path):
    from tests.hf_models import build_hf_model

    build_hf_model("llama_gqa", tmp_path)
    llm = LLM(str(tmp_path), kv_cache_memory="16MiB", kv_format="fp8_e4m3", attention="fp8_e4m3")
    tokens = torch.randint(0, 211, (24,), generator=torch.Generator().manual_seed(8)).tolist()
    prefill = llm.engine.prompt_logits(tokens)
    decode = llm.engine.prompt_logits(tokens, chunk=1)
    assert (prefill - decode).abs().max() <= 2e-3 * prefill.abs().max()
    plain = LLM(str(tmp_path), kv_cache_memory="16MiB", kv_format="fp8_e4m3")
    assert (plain.engine.prompt_logits(tokens) - prefill).abs().max() > 1e-2 * prefill.abs().max()
    with pytest.raises(InfergenError, match="read K and V as the KV cache stores them"):
        LLM(str(tmp_path), attention="fp8_e4m3")
    with pytest.raises(InfergenError, match="unknown attention operand format"):
        LLM(str(tmp_path), kv_format="fp8_e4m3", attention="fp4")
