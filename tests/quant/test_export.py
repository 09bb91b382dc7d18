"""`infergen quantize` and compressed-tensors checkpoints (engine/export.py,
io/compressed_tensors.py).

Oracles: the packing of the compressed-tensors library (its documented bit layout: int4 values
stored + 8, element i of a row in bits 4i..4i+3 of its int32 word; int8 + 128, 8 bits each;
FP4 even columns in the low nibble), checked on the library's own example vectors; a written
checkpoint loaded back equals transformers with every decoder projection fake-quantized
(infergen.formats, checked against torchao) — the LM head in full precision; the load-time
check refuses corrupt weight scales and missing / unit / non-finite KV scales."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from infergen import LLM
from infergen.cli import main
from infergen.engine.export import EXPORTS, export
from infergen.errors import InfergenError
from infergen.formats import dequantize, quantize
from infergen.io.compressed_tensors import pack_int32, unpack_int32
from infergen.io.model_config import read_model_config
from infergen.ops.linear import LINEAR_BACKENDS
from infergen.ops.stored_weights import dense
from tests.hf_models import build_hf_model, fake_quantize


def test_int32_packing_matches_compressed_tensors_vectors():
    int4 = torch.arange(-8, 8).reshape(1, 16) + 8  # stored unsigned
    assert pack_int32(int4, 4).tolist() == [[0x76543210, 0xFEDCBA98 - (1 << 32)]]
    int8 = torch.tensor([[1, 2, -128, 127]]) + 128
    assert pack_int32(int8, 8).tolist() == [[0xFF008281 - (1 << 32)]]
    for bits, values in ((4, int4), (8, int8)):
        assert torch.equal(
            unpack_int32(pack_int32(values, bits), bits, values.shape[1]).long(), values
        )


def test_fp4_nibbles_match_compressed_tensors_vector():
    """The library packs FP4 [0.5, -1, 6, -0] as bytes 0xA1, 0x87 (even column low)."""
    row = torch.zeros(1, 32)
    row[0, :4] = torch.tensor([0.5, -1.0, 6.0, -0.0])  # amax 6: the E8M0 scale is 2^0
    stored = EXPORTS["mxfp4"].write(row)
    assert stored["weight_packed"][0, :2].tolist() == [0xA1, 0x87]
    assert stored["weight_scale"][0, 0].item() == 127


def _fake_quant(w: torch.Tensor, scheme: str) -> torch.Tensor:
    per_group = {"block_size": 32} if scheme.startswith("int4") else {}
    return dequantize(quantize(w, scheme, axis=-1, **per_group))


@pytest.mark.parametrize("scheme", sorted(EXPORTS))
def test_exported_checkpoint_equals_fake_quantized_transformers(scheme, tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    hf_model = build_hf_model("llama_gqa", src, intermediate_size=128)
    export(str(src), scheme, out)
    qconfig = json.loads((out / "config.json").read_text())["quantization_config"]
    assert (
        qconfig["quant_method"] == "compressed-tensors" and qconfig["format"] == EXPORTS[scheme][0]
    )
    assert read_model_config(out).stored_weights.weights == scheme  # the format it runs in
    stored = load_file(str(out / "model.safetensors"))
    key = "model.layers.0.self_attn.q_proj.weight"
    assert (key if scheme == "fp8_e4m3" else key + "_packed") in stored

    llm = LLM(str(out), kv_cache_memory="8MiB")
    model = llm.engine.runner.model
    assert model.layers[0].attn.qkv.backend is LINEAR_BACKENDS.get(scheme)  # fused again
    assert model.lm_head.backend is LINEAR_BACKENDS.get("native")
    # the oracle, fused as the engine (and the export) quantize; the LM head in fp32
    fake_quantize(hf_model, lambda w: _fake_quant(w, scheme), lm_head=False)
    with torch.no_grad():
        tokens = torch.randint(0, 211, (20,), generator=torch.Generator().manual_seed(1)).tolist()
        expected = hf_model(torch.tensor([tokens])).logits[0]
    got = llm.engine.prompt_logits(tokens)
    assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()


def _fp8_kv_checkpoint(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    build_hf_model("llama_gqa", src, intermediate_size=128)
    export(str(src), "int8", out, kv_format="fp8_e4m3")
    return out


def test_exported_kv_scales_are_used(tmp_path):
    out = _fp8_kv_checkpoint(tmp_path)
    stored = load_file(str(out / "model.safetensors"))
    llm = LLM(str(out), kv_cache_memory="8MiB")
    cache = llm.engine.kv_cache
    assert cache.kv_format == "fp8_e4m3" and torch.equal(
        cache.k_shift, torch.zeros_like(cache.k_shift)
    )
    k_scale = stored["model.layers.2.self_attn.k_scale"]
    assert k_scale.shape == (2, 1, 1)  # per KV head
    assert torch.equal(cache.scales[2, 0], k_scale.reshape(-1))


@pytest.mark.parametrize(
    "damage,message",
    [
        ("drop", "scale is missing"),
        ("ones", "all 1.0: uncalibrated"),
        ("nan", "non-finite or not positive"),
        ("weight_nan", "non-finite values"),
    ],
)
def test_load_check_refuses_bad_scales(tmp_path, damage, message):
    out = _fp8_kv_checkpoint(tmp_path)
    path = out / "model.safetensors"
    tensors = load_file(str(path))
    kv_names = [n for n in tensors if n.endswith(("k_scale", "v_scale"))]
    if damage == "drop":
        del tensors["model.layers.1.self_attn.v_scale"]
    elif damage == "ones":
        for name in kv_names:
            tensors[name] = torch.ones_like(tensors[name])
    elif damage == "nan":
        tensors["model.layers.0.self_attn.k_scale"][1] = float("nan")
    else:
        tensors["model.layers.1.mlp.down_proj.weight_scale"][3] = float("inf")
    save_file(tensors, str(path))
    with pytest.raises(InfergenError, match=message):
        LLM(str(out), kv_cache_memory="8MiB")


def test_quantize_cli_and_errors(tmp_path, capsys):
    src = tmp_path / "src"
    build_hf_model("llama_gqa", src, intermediate_size=128)
    assert (
        main(["quantize", "--model", str(src), "--weights", "int4", "--out", str(tmp_path / "q")])
        == 0
    )
    assert "wrote" in capsys.readouterr().out
    assert (
        main(["quantize", "--model", str(src), "--weights", "q4_1", "--out", str(tmp_path / "x")])
        == 2
    )
    assert "no compressed-tensors layout" in capsys.readouterr().err


@pytest.mark.parametrize(
    "arch, what", [("gpt_oss", "mixture-of-experts"), ("mamba2", "recurrent layers")]
)
def test_quantize_refuses_an_architecture_it_cannot_write(arch, what, tmp_path, capsys):
    """Exit 2 naming what the layout cannot hold, before anything is written."""
    src = tmp_path / "src"
    build_hf_model(arch, src)
    out = tmp_path / "q"
    argv = ["quantize", "--model", str(src), "--weights", "int8", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"cannot write {arch}" in err and what in err
    assert not out.exists()


@pytest.mark.parametrize("scheme", sorted(EXPORTS))
def test_nonfinite_scales_are_found_without_decoding(scheme):
    """QuantWeight.nonfinite (the load check) flags exactly the weights whose decoded values
    (the backend's own dequantization) hold NaN / Inf."""
    from infergen.io.compressed_tensors import read_weight

    w = torch.randn(24, 64, generator=torch.Generator().manual_seed(2))
    fmt, args = EXPORTS[scheme].format, EXPORTS[scheme].args
    for corrupt in (False, True):
        stored = {f"p.{k}": v.clone() for k, v in EXPORTS[scheme].write(w).items()}
        if corrupt:
            if scheme == "fp8_e4m3":
                stored["p.weight"].view(torch.uint8)[3, 5] = 0x7F  # a NaN code
            elif scheme == "mxfp4":
                stored["p.weight_scale"][2, 1] = 0xFF  # E8M0 NaN
            elif scheme == "nvfp4":
                stored["p.weight_scale"].view(torch.uint8)[2, 1] = 0x7F  # E4M3 NaN
            else:
                stored["p.weight_scale"][2] = float("nan")
        weight = read_weight(stored, "p", fmt, args, "test")
        decoded_bad = not bool(torch.isfinite(dense(weight)).all())
        assert (weight.nonfinite() > 0) == decoded_bad == corrupt


@pytest.mark.parametrize(
    "scheme,options",
    [("int4", dict(activations="int8_static", smoothing="smoothquant", calibration="mse")),
     ("fp8_e4m3", dict(activations="fp8_e4m3")),
     ("nvfp4", dict(activations="nvfp4", smoothing="awq")),
     ("int4_asym", dict(calibration="mse"))],
)  # fmt: skip
def test_exported_calibrated_checkpoint_equals_the_engine(scheme, options, tmp_path):
    """Smoothing, clipping and static input scales are written as the engine chose them: the
    checkpoint runs as the engine calibrating the source itself (the LM head kept fp32)."""
    src, out = tmp_path / "src", tmp_path / "out"
    build_hf_model("llama_gqa", src, intermediate_size=128)
    export(str(src), scheme, out, **options)
    stored = load_file(str(out / "model.safetensors"))
    qconfig = json.loads((out / "config.json").read_text())["quantization_config"]
    activations = options.get("activations")
    group = qconfig["config_groups"]["group_0"]
    assert (group["input_activations"] is None) == (activations is None)
    static = {"int8_static": ".input_scale", "nvfp4": ".input_global_scale"}.get(activations)
    if static:
        assert "model.layers.1.mlp.down_proj" + static in stored

    source = LLM(str(src), kv_cache_memory="8MiB", weights=scheme, keep=["lm_head"], **options)
    loaded = LLM(str(out), kv_cache_memory="8MiB")
    assert loaded.engine.config.quant.activations == activations
    assert loaded.engine.calibration is None  # nothing recalibrated: the scales are stored
    tokens = torch.randint(0, 211, (20,), generator=torch.Generator().manual_seed(2)).tolist()
    expected = source.engine.prompt_logits(tokens)
    got = loaded.engine.prompt_logits(tokens)
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max(), (scheme, options)
    plain = LLM(str(src), kv_cache_memory="8MiB", weights=scheme, keep=["lm_head"])
    assert not torch.allclose(plain.engine.prompt_logits(tokens), expected)  # options mattered


def test_static_input_scales_missing_or_corrupt_are_refused(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    build_hf_model("llama_gqa", src, intermediate_size=128)
    export(str(src), "int8", out, activations="int8_static")
    stored = load_file(str(out / "model.safetensors"))
    stored["model.layers.0.self_attn.o_proj.input_scale"] = torch.tensor([float("nan")])
    save_file(stored, str(out / "model.safetensors"))
    with pytest.raises(InfergenError, match="input activation scale is not usable"):
        LLM(str(out), kv_cache_memory="8MiB")
    del stored["model.layers.0.self_attn.o_proj.input_scale"]
    save_file(stored, str(out / "model.safetensors"))
    with pytest.raises(InfergenError, match="has no input scale"):
        LLM(str(out), kv_cache_memory="8MiB")
