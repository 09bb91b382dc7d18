"""The checkpoint's stored weight formats (config/stored.py) as ModelConfig reads them: a
config.json's quantization_config, a GGUF file's tensor types.

Oracles: the published quantization_config of gpt-oss and DeepSeek-V3 (tests/perf/configs),
the compressed-tensors config groups `infergen quantize` writes (engine/export.py EXPORTS:
each must read back as the scheme it was written from), and the tensors of a real GGUF (its
types and byte sizes, read with the gguf package)."""

from __future__ import annotations

import json
import pathlib
from collections import Counter

import gguf
import pytest

from infergen.config import ModelConfig
from infergen.config.stored import StoredQuant, format_bits
from infergen.engine.export import EXPORTS
from infergen.errors import ConfigError
from infergen.io.model_config import read_model_config

CONFIGS = pathlib.Path(__file__).parents[1] / "perf" / "configs"
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 211}  # fmt: skip


def stored(qconfig: dict) -> StoredQuant | None:
    return ModelConfig.from_hf_dict(
        {**TINY, "quantization_config": qconfig}, source="x"
    ).stored_weights


def test_gpt_oss_stores_mxfp4_experts_and_bf16_elsewhere():
    path = CONFIGS / "gpt-oss-120b.json"
    assert json.loads(path.read_text())["quantization_config"] == {  # as openai publishes it
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"],
    }  # fmt: skip
    desc = read_model_config(path).describe()
    s = desc.stored_weights
    assert (s.weights, s.weight_bits, s.experts, s.expert_bits) == ("bf16", 16, "mxfp4", 4.25)
    experts = desc.routed_expert_params()
    assert desc.weight_bytes(s.weight_bits, s.expert_bits) == (
        (desc.params_total() - experts) * 2 + experts * 4.25 / 8
    )


def test_deepseek_v3_stores_fp8():
    s = read_model_config(CONFIGS / "deepseek-v3.json").stored_weights
    assert (s.method, s.weights, s.experts) == ("fp8", "fp8_e4m3", None)


def test_an_unquantized_config_has_no_stored_format():
    assert read_model_config(CONFIGS / "llama-3.1-8b.json").stored_weights is None


@pytest.mark.parametrize("scheme", sorted(EXPORTS))
def test_compressed_tensors_groups_read_back_as_the_scheme_written(scheme):
    fmt, args = EXPORTS[scheme].format, EXPORTS[scheme].args
    group = {"targets": ["Linear"], "weights": {**args, "dynamic": False}, "format": fmt}
    s = stored({"quant_method": "compressed-tensors", "format": fmt,
                "config_groups": {"group_0": group}})  # fmt: skip
    assert s.weights == scheme and s.experts is None
    group_size = args["group_size"] if args["strategy"] == "group" else None
    assert s.weight_bits == format_bits(scheme, group_size)


def test_gptq_and_awq_are_integer_formats():
    assert stored({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True}).weights == (
        "int4"
    )
    awq = stored({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True})
    assert awq.weights == "int4_asym" and awq.weight_bits == format_bits("int4_asym", 128)


def test_a_multimodal_config_keeps_its_top_level_quantization_config():
    text = {**TINY, "model_type": "gemma3_text"}
    config = {"model_type": "gemma3", "text_config": text,
              "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}}  # fmt: skip
    assert ModelConfig.from_hf_dict(config, source="x").stored_weights.weights == "fp8_e4m3"


@pytest.mark.parametrize(
    "qconfig, message",
    [
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method"),
        ({"quant_method": "fp8", "fmt": "e3m4"}, "fmt"),
        ({"quant_method": "gptq", "bits": 3}, "bits"),
        ({"quant_method": "compressed-tensors", "config_groups": {}}, "config_groups"),
        ({"quant_method": "compressed-tensors", "config_groups": {"g": {"format": "int-quantized",
          "weights": {"num_bits": 8, "type": "int"}}}}, "not supported"),
    ],
)  # fmt: skip
def test_unknown_quantization_is_named(qconfig, message):
    with pytest.raises(ConfigError, match=message):
        stored(qconfig)


@pytest.mark.parametrize("qtype", ["F16", "Q4_0"])
def test_a_gguf_stores_its_dominant_tensor_type_at_its_file_bits(qtype, tmp_path):
    """A tiny Llama's matrices in `qtype`, its norms in F32 (tests/io/test_gguf.py)."""
    from tests.io.test_model_config import tiny_gguf

    path = tiny_gguf(tmp_path / "tiny.gguf", qtype)
    config = read_model_config(path)
    reader = gguf.GGUFReader(str(path))
    elements, stored_bytes = Counter(), 0
    for t in reader.tensors:
        elements[t.tensor_type.name] += int(t.n_elements)
        stored_bytes += int(t.n_bytes)
    assert set(elements) == {qtype, "F32"}
    s = config.stored_weights
    assert s.method == "gguf" and s.weights == {"F16": "fp16"}.get(qtype, qtype.lower())
    weight_bytes = config.describe().weight_bytes(s.weight_bits)
    assert weight_bytes == pytest.approx(stored_bytes, rel=1e-12)
