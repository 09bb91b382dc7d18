"""The `device` option (engine/device.py): "auto" and the defaults that follow it, clear errors
for what cannot run where, and the KV budget of a GPU. The rules are checked for a machine
with and without a GPU (`cuda_count`); the engine on a real GPU runs in the device check
(tests/engine/test_gpu_engine.py)."""

from __future__ import annotations

import pytest
import torch

from infergen import LLM
from infergen.config.sections import SchedulerConfig
from infergen.engine.device import activation_bytes, kv_budget, resolve
from infergen.engine.options import engine_config
from infergen.errors import ConfigError
from infergen.io.model_config import read_model_config
from tests.hf_models import build_hf_model

NO_GPU = 0


def test_auto_is_the_cpu_with_native_kernels_and_float32_without_a_gpu():
    config = resolve(engine_config(), cuda_count=NO_GPU)
    assert (config.device, config.kernels, config.dtype) == ("cpu", "native", "float32")


def test_auto_is_cuda_with_triton_and_bfloat16_with_a_gpu():
    config = resolve(engine_config(), cuda_count=1)
    assert config.device == "cuda:0" and config.dtype == "bfloat16"
    assert config.kernels in ("triton", "torch")  # triton where it is installed


@pytest.mark.parametrize(
    ("options", "dtype"),
    [
        (dict(weights="int8"), "float32"),  # the scheme quantizes from fp32 weights
        (dict(weights="fp8_e4m3", activations="fp8_e4m3"), "float32"),  # calibrates in fp32
        (dict(dtype="float16"), "float16"),  # given: kept
    ],
)
def test_auto_dtype_on_a_gpu_is_float32_where_quantization_needs_it(options, dtype):
    assert resolve(engine_config(**options), cuda_count=1).dtype == dtype


@pytest.mark.parametrize(
    ("device", "count", "message"),
    [
        ("cuda", NO_GPU, "needs a CUDA GPU"),
        ("cuda:0", NO_GPU, "needs a CUDA GPU"),
        ("cuda:2", 2, "not one of this machine's GPUs"),
    ],
)
def test_a_gpu_that_is_not_there_is_a_clear_error(device, count, message):
    with pytest.raises(ConfigError, match=message):
        resolve(engine_config(device=device), cuda_count=count)


def test_an_unknown_device_is_refused_as_the_config_is_made():
    with pytest.raises(ConfigError, match="unknown device"):
        engine_config(device="tpu")


@pytest.mark.parametrize(
    ("options", "where"),
    [
        (dict(kernels="native"), "kernels"),
        (dict(kv_format="int4_kivi"), "kv_format"),
        (dict(weights="int8", kernels="torch"), "weights"),  # the CPU rows' C kernels
        (dict(weights="bf16", kernels="triton"), "weights"),  # no Triton row (dtype= there)
        (dict(activations="int8", kernels="triton"), "activations"),
        (dict(compile="jit", kernels="torch"), "compile"),
        (dict(compile="eager", kernels="torch"), "compile"),
    ],
)
def test_what_runs_on_the_cpu_only_is_refused_on_a_gpu(options, where):
    with pytest.raises(ConfigError, match=where):
        resolve(engine_config(device="cuda", **options), cuda_count=1)


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_the_compiled_layers_run_on_a_gpu_with_the_triton_kernels(mode):
    """compile != "off" on a GPU: with kernels="triton" (the compiler's Triton target)."""
    config = resolve(engine_config(device="cuda", kernels="triton", compile=mode), cuda_count=1)
    assert (config.kernels, config.compile.mode) == ("triton", mode)


def test_the_engine_without_a_gpu(tmp_path):
    """LLM(device="cpu") and "auto" build the same CPU engine; "cuda" is refused here."""
    build_hf_model("llama_gqa", tmp_path)
    llm = LLM(str(tmp_path), device="auto", num_kv_blocks=8)
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the device check runs the engine there")
    assert llm.engine.config.device == "cpu" and llm.engine.kv_cache.device.type == "cpu"
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        LLM(str(tmp_path), device="cuda")


def test_the_gpu_kv_budget_is_what_the_utilization_leaves():
    gib = 1 << 30
    # 0.9 of 100 GiB, less 20 GiB in use (the weights) and 5 GiB of activations
    assert kv_budget(100 * gib, 80 * gib, 0.9, 5 * gib) == 90 * gib - 20 * gib - 5 * gib
    with pytest.raises(ConfigError, match="no GPU memory left"):
        kv_budget(100 * gib, 20 * gib, 0.5, 0)


def test_the_activation_reserve_grows_with_the_step(tmp_path):
    build_hf_model("llama_gqa", tmp_path)
    model = read_model_config(tmp_path)
    small = activation_bytes(model, SchedulerConfig(max_num_batched_tokens=16), 2)
    large = activation_bytes(model, SchedulerConfig(max_num_batched_tokens=2048), 2)
    per_token = (large - small) / (2048 - 16)
    widest = max(2 * model.intermediate_size, model.q_size + 2 * model.kv_size)
    assert per_token >= widest * 2  # at least the widest activation, in bf16


@pytest.mark.parametrize("name", ["gpt_oss", "gemma3"])
def test_what_the_model_keeps_beside_its_tensors_moves_with_it(name, tmp_path):
    """A move of the model (to a GPU; here to another dtype, the same `_apply` walk) leaves
    nothing behind: the sink-logit cores read the moved sinks, the RoPE tables are the moved
    buffers."""
    build_hf_model(name, tmp_path)
    model = LLM(str(tmp_path), num_kv_blocks=8).engine.runner.model
    model.to(torch.float64)
    assert all(table.dtype == torch.float64 for table in model.rope_tables)
    for layer in model.layers:
        attn = layer.attn
        if getattr(attn, "sinks", None) is not None:
            core_sinks = attn.core.sinks  # (a SinkCore: ops/attention_sinks.py)
            assert core_sinks.data_ptr() == attn.sinks.data_ptr()
            assert core_sinks.dtype == torch.float64
            assert attn.decode.keywords["core"] is attn.core  # the decode row reads the same
