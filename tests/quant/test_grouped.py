"""Group-quantized weights: int4 / int4_asym (infergen.formats) and llama.cpp's Q4_0 / Q4_1 /
Q8_0 blocks, quantized from fp32 or kept as a GGUF file holds them (ops/linear_grouped.py,
kernels/gemm_packed_g_f32.c, the "gguf" weight scheme).

Oracles: the dequantized weight comes from gguf.quants (llama.cpp's reference codec, for the
GGUF formats) or infergen.formats (checked against torchao in tests/formats); each product
equals the fp32 "native" backend on that weight bit for bit and a float64 matmul within
rounding; an engine running a GGUF file's blocks equals the engine running the same file
dequantized, bit for bit; the quantizing schemes equal transformers with fake-quantized
weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from infergen import LLM
from infergen.errors import InfergenError
from infergen.formats import dequantize, quantize
from infergen.formats.block_weight import BlockWeight
from infergen.io.checkpoint import load_checkpoint
from infergen.ops import linear_grouped as lg
from infergen.ops.linear import LINEAR_BACKENDS
from tests.hf_models import build_hf_model, fake_quantize
from tests.kernel_isa import assert_ok_with_isa
from tests.quant.oracle import assert_equals_dequantized

FORMATS = sorted(lg.GROUP_FORMATS)
GGUF = {"q4_0": "Q4_0", "q4_1": "Q4_1", "q8_0": "Q8_0"}


def _oracle(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """The weight the format's own reference codec reconstructs."""
    if fmt in GGUF:
        from gguf import GGMLQuantizationType, quants

        qtype = GGMLQuantizationType[GGUF[fmt]]
        values = quants.dequantize(quants.quantize(w.numpy(), qtype), qtype)
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(w.shape)
    per_group = {"block_size": 32} if fmt.startswith("int") else {}  # FP4: the format's own
    return dequantize(quantize(w, fmt, axis=-1, **per_group))


def _weight(out_features: int, in_features: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=gen)
    w[0] = 0.0  # an all-zero row: scale 0
    w[1, 3] = 40.0  # an outlier group
    w[2, :32] = 1.5  # a constant group (min = max)
    return w


@pytest.mark.parametrize("out_features,in_features", [(48, 64), (50, 32), (7, 96), (1536, 576)])
@pytest.mark.parametrize("tokens", [1, 2, 3, 5, 16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("fmt", FORMATS)
def test_linear_equals_dequantized_weight(fmt, out_features, in_features, tokens, bias):
    w = _weight(out_features, in_features, out_features + tokens)
    gen = torch.Generator().manual_seed(tokens)
    b = torch.randn(out_features, generator=gen) if bias else None
    x = torch.randn(tokens, in_features, generator=gen)
    deq = _oracle(w, fmt)
    assert torch.equal(lg.dequantized(w, fmt), deq)  # the values the kernel uses
    assert_equals_dequantized(fmt, w, deq, x, b)


@pytest.mark.parametrize("fmt", FORMATS)
def test_pack_round_trip_and_rows(fmt):
    w = _weight(50, 64, 1)
    spec = lg.GROUP_FORMATS[fmt]
    grouped = spec.encode(w)
    back = lg.unpack(lg.pack(grouped, spec), spec)
    assert torch.equal(back.codes[:50], grouped.codes) and (back.codes[50:] == 0).all()
    for got, field in zip(back.fields, grouped.fields, strict=True):
        assert torch.equal(got[:50], field)
    assert back.scalar == grouped.scalar
    backend = LINEAR_BACKENDS.get(fmt)
    ids = torch.tensor([0, 23, 24, 49, 23])
    assert torch.equal(backend.rows(backend.prepare(w), ids), _oracle(w, fmt)[ids])


@pytest.mark.parametrize("fmt", sorted(GGUF))
def test_blocks_as_loaded_equal_quantized_from_fp32(fmt):
    from gguf import GGMLQuantizationType, quants

    w = _weight(30, 64, 2)
    raw = quants.quantize(w.numpy(), GGMLQuantizationType[GGUF[fmt]])
    blocks = BlockWeight(GGUF[fmt], torch.from_numpy(raw), (30, 64))
    assert torch.equal(blocks.dequantize(), _oracle(w, fmt))
    backend = LINEAR_BACKENDS.get(fmt)
    assert torch.equal(backend.prepare(blocks), backend.prepare(w))
    other = "q4_1" if fmt == "q8_0" else "q8_0"
    with pytest.raises(TypeError, match=f"{other} backend got {GGUF[fmt]} blocks"):
        LINEAR_BACKENDS.get(other).prepare(blocks)


@pytest.mark.parametrize("name", ["native", "int8", "fp8_e4m3", *FORMATS])
def test_zero_tokens(name):
    """A step may compute no logits rows: every backend returns an empty product."""
    backend = LINEAR_BACKENDS.get(name)
    prepared = backend.prepare(torch.randn(48, 64))
    out = backend.apply(torch.randn(0, 64), prepared, torch.randn(48), 48)
    assert out.shape == (0, 48)


def test_input_features_must_be_whole_groups():
    with pytest.raises(InfergenError, match="a whole number of groups") as err:
        LINEAR_BACKENDS.get("int4").prepare(torch.randn(8, 40))
    assert "40 input features" in str(err.value) and "multiple of 32" in str(err.value)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_blocks_as_loaded_equal_dequantized_engine(tmp_path, qtype):
    """A GGUF file run on its blocks gives the logits of the same file dequantized at load,
    bit for bit (prefill, decode steps and the fused decode path), holding ~1/6 of the bytes."""
    import gguf

    from infergen.eval.quality import weight_bytes
    from tests.io.test_gguf import _write_gguf, tiny_llama

    path = tmp_path / f"tiny-{qtype}.gguf"
    _write_gguf(path, tiny_llama(), gguf.GGMLQuantizationType[qtype])
    blocks = load_checkpoint(path, keep_blocks=True)
    held = blocks.tensors["model.layers.0.self_attn.q_proj.weight"]
    assert isinstance(held, BlockWeight) and held.ggml_type == qtype
    dense = load_checkpoint(path)
    for name, t in blocks.tensors.items():  # rows in Hugging Face order, values unchanged
        got = t.dequantize() if isinstance(t, BlockWeight) else t
        assert torch.equal(got, dense.tensors[name]), name

    quantized = LLM(checkpoint=blocks, kv_cache_memory="8MiB", weights="gguf")
    model = quantized.engine.runner.model
    assert model.layers[0].attn.qkv.backend is LINEAR_BACKENDS.get(qtype.lower())
    assert model.lm_head.backend is LINEAR_BACKENDS.get(qtype.lower())  # untied "output"
    reference = LLM(checkpoint=dense, kv_cache_memory="8MiB")
    assert weight_bytes(model) * 3 < weight_bytes(reference.engine.runner.model)
    tokens = torch.randint(0, 96, (30,)).tolist()
    for chunk in (None, 1):  # prefill; then one token a step (the fused decode path)
        got = quantized.engine.prompt_logits(tokens, chunk=chunk)
        assert torch.equal(got, reference.engine.prompt_logits(tokens, chunk=chunk))
    model.fast_path = None
    assert torch.equal(
        quantized.engine.prompt_logits(tokens, chunk=1),
        reference.engine.prompt_logits(tokens, chunk=1),
    )


def test_gguf_scheme_needs_gguf_blocks(tmp_path):
    build_hf_model("llama_gqa", tmp_path)
    with pytest.raises(InfergenError, match="has none") as err:
        LLM(str(tmp_path), kv_cache_memory="8MiB", weights="gguf")
    assert "'q4_1', 'int4'" in str(err.value)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", ["llama_gqa", "qwen2_qkv_bias"])
def test_engine_equals_fake_quantized_transformers(fmt, name, tmp_path):
    """Every projection and the LM head quantized in groups of 32 inputs of a row, q/k/v and
    gate/up as the engine holds them, fused (NVFP4's per-tensor scale is then shared): the
    engine's logits equal transformers' on the fake-quantized weights."""
    hf_model = build_hf_model(name, tmp_path, intermediate_size=128)
    fake_quantize(hf_model, lambda w: _oracle(w, fmt))
    llm = LLM(str(tmp_path), kv_cache_memory="16MiB", weights=fmt)
    torch.manual_seed(3)
    tokens = torch.randint(0, hf_model.config.vocab_size, (20,)).tolist()
    with torch.no_grad():
        expected = hf_model(torch.tensor([tokens])).logits[0]
    engine = llm.engine
    decode_steps = engine.prompt_logits(tokens, chunk=1)
    engine.runner.model.fast_path = None
    assert torch.equal(decode_steps, engine.prompt_logits(tokens, chunk=1))
    for got in (decode_steps, engine.prompt_logits(tokens)):
        assert (got - expected).abs().max() <= 1e-4 * expected.abs().max(), (fmt, name)


_SCALAR_CHECK = """
import sys, torch
from infergen.ops import linear_grouped as lg
from infergen.ops.linear import LINEAR_BACKENDS
from tests.quant.test_grouped import _oracle, _weight
for fmt in lg.GROUP_FORMATS:
    w, x = _weight(50, 96, 5), torch.randn(3, 96)
    backend = LINEAR_BACKENDS.get(fmt)
    for tokens in (1, 2, 3):
        got = backend.apply(x[:tokens], backend.prepare(w), None, 50)
        want = x[:tokens].double() @ _oracle(w, fmt).double().t()
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
        native = LINEAR_BACKENDS.get("native")  # the fp32 kernel of the same ISA
        fp32 = native.apply(x[:tokens], native.prepare(_oracle(w, fmt)), None, 50)
        assert torch.equal(got, fp32), (fmt, tokens)
print("ok")
"""


@pytest.mark.parametrize("isa", ["generic", "avx2"])
def test_portable_kernels(isa, tmp_path):
    """The kernels' other ISA paths — scalar (INFERGEN_KERNEL_ISA=generic) and AVX2 without
    AVX-512's FP4 decode (avx2; the same as the default where the CPU lacks AVX-512) — give
    the same products."""
    assert_ok_with_isa(isa, _SCALAR_CHECK, tmp_path)
