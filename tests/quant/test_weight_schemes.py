"""Weight-only schemes int8 and fp8_e4m3 (ops/linear_quantized.py, kernels/gemm_packed_q_f32.c,
quant/schemes.py).

Oracles: each op equals the fp32 "native" backend on the weight formats.dequantize gives (bit
for bit: the kernel uses exactly those values) and a plain torch matmul on it (float
tolerance); the engine with weights=<scheme> equals transformers running the same model with
every projection's weight replaced by its dequantized value (fake quantization)."""

from __future__ import annotations

import pytest
import torch

from infergen import LLM
from infergen.errors import InfergenError
from infergen.formats import dequantize, quantize
from infergen.ops import linear_quantized as lq
from infergen.ops.linear import LINEAR_BACKENDS
from tests.hf_models import BASE, build_hf_model, fake_quantize
from tests.quant.oracle import assert_equals_dequantized

NATIVE = LINEAR_BACKENDS.get("native")
SCHEMES = ["int8", "fp8_e4m3"]


def _fake_quant(w: torch.Tensor, fmt: str) -> torch.Tensor:
    return dequantize(quantize(w.float(), fmt, axis=-1))


@pytest.mark.parametrize("out_features,in_features", [(48, 64), (50, 37), (7, 8), (1536, 576)])
@pytest.mark.parametrize("tokens", [1, 2, 3, 4, 5, 9, 16, 130])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("fmt", SCHEMES)
def test_linear_equals_dequantized_weight(fmt, out_features, in_features, tokens, bias):
    gen = torch.Generator().manual_seed(out_features + tokens)
    w = torch.randn(out_features, in_features, generator=gen)
    w[0] = 0.0  # an all-zero channel: scale 0
    w[1, 3] = 50.0  # an outlier channel
    w[2, :4] = torch.tensor([1e-4, -1e-4, 3e-3, -0.0])  # FP8 subnormals and -0
    b = torch.randn(out_features, generator=gen) if bias else None
    x = torch.randn(tokens, in_features, generator=gen)
    assert_equals_dequantized(fmt, w, _fake_quant(w, fmt), x, b)


@pytest.mark.parametrize("fmt", SCHEMES)
def test_pack_round_trip_and_rows(fmt):
    w = torch.randn(50, 37)
    codes, scales = lq.quantize_weight(w, fmt)
    dtype = lq.CODE_FORMATS[fmt].dtype
    got_codes, got_scales = lq.unpack(lq.pack(codes, scales, dtype))
    assert torch.equal(got_codes[:50], codes) and torch.equal(got_scales[:50], scales)
    assert (got_codes[50:] == 0).all() and (got_scales[50:] == 0).all()  # padding channels
    ids = torch.tensor([0, 23, 24, 49])
    backend = LINEAR_BACKENDS.get(fmt)
    assert torch.equal(backend.rows(backend.prepare(w), ids), _fake_quant(w, fmt)[ids])


@pytest.mark.parametrize("name", ["llama_gqa", "llama_mqa_tied", "llama_bias", "qwen3_qk_norm"])
@pytest.mark.parametrize("fmt", SCHEMES)
def test_engine_equals_fake_quantized_transformers(fmt, name, tmp_path):
    hf_model = build_hf_model(name, tmp_path)
    # the oracle: every projection and the LM head fake-quantized, fused as the engine holds them
    fake_quantize(hf_model, lambda w: _fake_quant(w, fmt))
    llm = LLM(str(tmp_path), kv_cache_memory="16MiB", weights=fmt)
    torch.manual_seed(3)
    tokens = torch.randint(0, hf_model.config.vocab_size, (20,)).tolist()
    engine = llm.engine
    decode_steps = engine.prompt_logits(tokens, chunk=1)  # the fused decode path where covered
    prefill = engine.prompt_logits(tokens)
    engine.runner.model.fast_path = None
    per_op = engine.prompt_logits(tokens, chunk=1)
    assert torch.equal(decode_steps, per_op), name  # fused decode = per-op path
    with torch.no_grad():
        expected = hf_model(torch.tensor([tokens])).logits[0]
    for got in (decode_steps, prefill):
        assert (got - expected).abs().max() <= 1e-4 * expected.abs().max(), name


def test_weight_scheme_errors():
    with pytest.raises(InfergenError, match="unknown weight scheme 'int3'"):
        LLM(weights="int3")
    with pytest.raises(InfergenError, match="dtype"):
        LLM(weights="int8", dtype="bfloat16")


def test_scheme_keeps_matching_projections():
    from infergen.config import ModelConfig
    from infergen.models.transformer import Transformer
    from infergen.quant import apply_weight_scheme

    config = ModelConfig(architecture="llama", head_dim=16, num_key_value_heads=2, **BASE)
    model = Transformer(config, torch.float32, "native")
    changed = apply_weight_scheme(model, "int8", keep=("lm_head", "layers.1.*"))
    projections = ("attn.qkv", "attn.o", "mlp.gate_up", "mlp.down")
    assert changed == [f"layers.{i}.{name}" for i in (0, 2) for name in projections]  # 3 layers
    assert model.lm_head.backend is NATIVE and model.layers[1].mlp.down.backend is NATIVE
    assert model.layers[0].mlp.down.backend is LINEAR_BACKENDS.get("int8")
