"""The load-time check (layers/probe.py, io/gguf.py): a projection quantized far worse than its
scheme's level falls back to full precision (or the engine refuses), a GGUF file with corrupt
block scales is refused, KV scales must be finite, positive and calibrated.

Oracle for the fallback: transformers with every projection fake-quantized except the one the
check kept at full precision."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from infergen import LLM
from infergen.errors import InfergenError
from infergen.formats import dequantize, quantize
from infergen.io.checkpoint import load_checkpoint
from infergen.layers.probe import check_kv_scales
from infergen.ops.linear import LINEAR_BACKENDS
from tests.hf_models import build_hf_model, fake_quantize


def _outlier_model(tmp_path):
    """A model whose layer-1 o_proj holds one 1e6 weight: per-tensor FP8 then flushes the
    rest of that projection to zero."""
    hf_model = build_hf_model("llama_gqa", tmp_path)
    with torch.no_grad():
        hf_model.model.layers[1].self_attn.o_proj.weight[3, 5] = 1e6
    hf_model.save_pretrained(tmp_path, safe_serialization=True)
    return hf_model


def test_outlier_projection_falls_back_to_full_precision(tmp_path):
    hf_model = _outlier_model(tmp_path)
    with pytest.warns(UserWarning, match=r"layers\.1\.attn\.o \("):
        llm = LLM(str(tmp_path), kv_cache_memory="8MiB", weights="fp8_e4m3")
    model = llm.engine.runner.model
    assert list(llm.engine.fallback_layers) == ["layers.1.attn.o"]
    error, limit = llm.engine.fallback_layers["layers.1.attn.o"]
    assert error > 0.9 and limit == pytest.approx(4 * 0.027)  # all but one weight lost
    assert model.layers[1].attn.o.backend is LINEAR_BACKENDS.get("native")
    assert model.layers[0].attn.o.backend is LINEAR_BACKENDS.get("fp8_e4m3")
    # the oracle: every other projection fake-quantized
    fake_quantize(
        hf_model, lambda w: dequantize(quantize(w, "fp8_e4m3", axis=-1)), skip={(1, "o_proj")}
    )
    with torch.no_grad():
        tokens = torch.randint(0, 211, (16,), generator=torch.Generator().manual_seed(0)).tolist()
        expected = hf_model(torch.tensor([tokens])).logits[0]
    got = llm.engine.prompt_logits(tokens)
    assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()


def test_outlier_projection_refused(tmp_path):
    _outlier_model(tmp_path)
    with pytest.raises(InfergenError, match="load-time probe") as err:
        LLM(str(tmp_path), kv_cache_memory="8MiB", weights="fp8_e4m3", on_bad_layer="refuse")
    assert "layers.1.attn.o" in str(err.value)


def test_clean_model_keeps_every_projection_quantized(tmp_path):
    build_hf_model("llama_gqa", tmp_path)
    llm = LLM(str(tmp_path), kv_cache_memory="8MiB", weights="int8")
    assert llm.engine.fallback_layers == {}


@pytest.mark.parametrize("keep_blocks", [False, True])
def test_gguf_with_corrupt_block_scale_is_refused(tmp_path, keep_blocks):
    import gguf

    from tests.io.test_gguf import _write_gguf, tiny_llama

    path = tmp_path / "tiny.gguf"
    _write_gguf(path, tiny_llama(num_hidden_layers=1), gguf.GGMLQuantizationType.Q4_1)
    reader = gguf.GGUFReader(str(path))
    target = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    data = bytearray(path.read_bytes())
    block = 3  # its fp16 scale d ← NaN
    at = int(target.data_offset) + block * 20
    data[at : at + 2] = np.array([np.nan], dtype=np.float16).tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(InfergenError, match="non-finite") as err:
        load_checkpoint(path, keep_blocks=keep_blocks)
    assert "blk.0.ffn_down.weight" in str(err.value) and "Q4_1" in str(err.value)


@pytest.mark.parametrize(
    "scales,message",
    [
        (torch.tensor([[0.1, float("nan")]]), "non-finite or not positive"),
        (torch.tensor([[0.1, 0.0]]), "non-finite or not positive"),
        (torch.tensor([[0.1, float("inf")]]), "non-finite or not positive"),
        (torch.ones(2, 3), "all 1.0: uncalibrated"),
    ],
)
def test_kv_scales_check(scales, message):
    with pytest.raises(InfergenError, match=message):
        check_kv_scales(scales, "test")
    check_kv_scales(torch.tensor([[0.1, 0.2]]), "test")  # fine ones pass
