"""Weight-only int8 (ops/linear_int8.py, kernels/gemm_packed_i8_f32.c, quant/schemes.py).

Oracles: the op equals the fp32 "native" backend on the weight formats.dequantize gives (bit
for bit: the kernel uses exactly those values) and a plain torch matmul on it (float
tolerance); the engine with weights="int8" equals transformers running the same model with
every projection's weight replaced by its dequantized int8 value (fake quantization)."""

from __future__ import annotations

import pytest
import torch

from infergen import LLM
from infergen.errors import InfergenError
from infergen.formats import dequantize, quantize
from infergen.ops import linear_int8
from infergen.ops.linear import LINEAR_BACKENDS
from tests.hf_models import build_hf_model

INT8 = LINEAR_BACKENDS.get("int8")
NATIVE = LINEAR_BACKENDS.get("native")


def _fake_quant(w: torch.Tensor) -> torch.Tensor:
    return dequantize(quantize(w.float(), "int8", axis=-1))


@pytest.mark.parametrize("out_features,in_features", [(48, 64), (50, 37), (7, 8), (1536, 576)])
@pytest.mark.parametrize("tokens", [1, 2, 3, 4, 5, 9, 16, 130])
@pytest.mark.parametrize("bias", [False, True])
def test_int8_linear_equals_dequantized_weight(out_features, in_features, tokens, bias):
    gen = torch.Generator().manual_seed(out_features + tokens)
    w = torch.randn(out_features, in_features, generator=gen)
    w[0] = 0.0  # an all-zero channel: scale 0
    w[1, 3] = 50.0  # an outlier channel
    b = torch.randn(out_features, generator=gen) if bias else None
    x = torch.randn(tokens, in_features, generator=gen)
    deq = _fake_quant(w)
    ours = INT8.apply(x, INT8.prepare(w), b, out_features)
    assert torch.equal(ours, NATIVE.apply(x, NATIVE.prepare(deq), b, out_features))
    expected = x.double() @ deq.double().t() + (b.double() if bias else 0)
    torch.testing.assert_close(ours.double(), expected, rtol=1e-5, atol=1e-4)


def test_int8_pack_round_trip_and_rows():
    w = torch.randn(50, 37)
    codes, scales = linear_int8.quantize_weight(w)
    got_codes, got_scales = linear_int8.unpack(linear_int8.pack(codes, scales))
    assert torch.equal(got_codes[:50], codes) and torch.equal(got_scales[:50], scales)
    assert (got_codes[50:] == 0).all() and (got_scales[50:] == 0).all()  # padding channels
    ids = torch.tensor([0, 23, 24, 49])
    assert torch.equal(INT8.rows(INT8.prepare(w), ids), _fake_quant(w)[ids])


@pytest.mark.parametrize("name", ["llama_gqa", "llama_mqa_tied", "llama_bias", "qwen3_qk_norm"])
def test_engine_int8_equals_fake_quantized_transformers(name, tmp_path):
    hf_model = build_hf_model(name, tmp_path)
    with torch.no_grad():  # the oracle: every projection (and the LM head) fake-quantized
        for module in hf_model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(_fake_quant(module.weight))
    llm = LLM(str(tmp_path), kv_cache_memory="16MiB", weights="int8")
    torch.manual_seed(3)
    tokens = torch.randint(0, hf_model.config.vocab_size, (20,)).tolist()
    engine = llm.engine
    decode_steps = engine.prompt_logits(tokens, chunk=1)  # the fused decode path where covered
    prefill = engine.prompt_logits(tokens)
    engine.runner.model.fused_decode = False
    per_op = engine.prompt_logits(tokens, chunk=1)
    assert torch.equal(decode_steps, per_op), name  # fused int8 decode = per-op int8
    with torch.no_grad():
        expected = hf_model(torch.tensor([tokens])).logits[0]
    for got in (decode_steps, prefill):
        assert (got - expected).abs().max() <= 1e-4 * expected.abs().max(), name


def test_weight_scheme_errors():
    with pytest.raises(InfergenError, match="unknown weight scheme 'int3'"):
        LLM(weights="int3")
    with pytest.raises(InfergenError, match="dtype"):
        LLM(weights="int8", dtype="bfloat16")
