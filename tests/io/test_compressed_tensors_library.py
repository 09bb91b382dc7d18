"""Checkpoints `infergen quantize` writes, read by the compressed-tensors library itself (the
package vLLM's loader uses): for every exported scheme and projection, the library's
`decompress` of the stored tensors equals the weight our reader (io/compressed_tensors.py)
runs, and the library parses the config's quantization arguments (weights, input activations,
KV cache scheme)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from infergen.engine.export import EXPORTS, export
from infergen.io.compressed_tensors import ACTIVATION_ARGS, read_weight
from infergen.ops.stored_weights import dense
from tests.hf_models import build_hf_model

ct = pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors import BaseCompressor  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # noqa: E402

PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")  # fmt: skip


def _library_weight(stored, prefix, qconfig) -> torch.Tensor:
    group = qconfig["config_groups"]["group_0"]
    scheme = QuantizationScheme(
        targets=group["targets"],
        weights=QuantizationArgs(**group["weights"]),
        input_activations=QuantizationArgs(**group["input_activations"])
        if group["input_activations"]
        else None,
        format=group["format"],
    )
    local = {k.removeprefix(prefix + "."): v for k, v in stored.items()
             if k.startswith(prefix + ".weight")}  # fmt: skip
    compressor = BaseCompressor.get_value_from_registry(qconfig["format"])
    return compressor.decompress(local, scheme)["weight"].float()


@pytest.mark.parametrize("scheme", sorted(EXPORTS))
def test_library_decompresses_what_we_run(scheme, tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    build_hf_model("llama_gqa", src, intermediate_size=128)
    export(str(src), scheme, out)
    stored = load_file(str(out / "model.safetensors"))
    qconfig = json.loads((out / "config.json").read_text())["quantization_config"]
    group = qconfig["config_groups"]["group_0"]
    for layer in range(2):
        for proj in PROJECTIONS:
            prefix = f"model.layers.{layer}.{proj}"
            theirs = _library_weight(stored, prefix, qconfig)
            ours = read_weight(dict(stored), prefix, qconfig["format"], group["weights"], "test")
            if scheme == "nvfp4":  # the library dequantizes NVFP4 in bfloat16
                close = dict(rtol=2**-8, atol=0.0)
                torch.testing.assert_close(dense(ours), theirs, **close)
                assert torch.equal(dense(ours).bfloat16(), theirs.bfloat16())
            else:
                assert torch.equal(dense(ours), theirs), (scheme, prefix)


@pytest.mark.parametrize("activations", sorted(ACTIVATION_ARGS))
def test_library_parses_our_activation_and_kv_arguments(activations, tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    build_hf_model("llama_gqa", src, intermediate_size=128)
    weights = "nvfp4" if activations == "nvfp4" else "fp8_e4m3"
    export(str(src), weights, out, activations=activations, kv_format="fp8_e4m3")
    qconfig = json.loads((out / "config.json").read_text())["quantization_config"]
    parsed = QuantizationArgs(**qconfig["config_groups"]["group_0"]["input_activations"])
    assert parsed.num_bits == ACTIVATION_ARGS[activations]["num_bits"]
    assert (
        str(getattr(parsed.strategy, "value", parsed.strategy))
        == ACTIVATION_ARGS[activations]["strategy"]
    )
    kv = QuantizationArgs(**qconfig["kv_cache_scheme"])
    assert kv.num_bits == 8 and str(getattr(kv.type, "value", kv.type)) == "float"
