"""Where the engine runs: the `device` option resolved against this machine, the "auto"
defaults that depend on it, and the KV budget of a GPU.

`resolve(config)` turns "auto" into concrete choices, once, as the engine is built:

| option   | on the CPU                  | on CUDA                                              |
|----------|-----------------------------|------------------------------------------------------|
| device   | "cpu" (no CUDA GPU)         | "cuda" (torch sees a CUDA GPU)                       |
| kernels  | "native" (the C kernels)    | "triton" (Triton installed), else "torch"            |
| dtype    | "float32"                   | "bfloat16"; "float32" where quantization calibrates  |
|          |                             | or the weight scheme quantizes from fp32 only        |

and refuses what cannot run there (the C kernels on a GPU, the compiled layers there without
the Triton kernel set, CUDA on a machine without one).
The KV pool on a GPU takes what `gpu_memory_utilization` of the device's memory leaves after
what the process already holds (the weights) and an activation reserve for the largest step
(`kv_budget`); `kv_cache_memory` given explicitly wins.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import torch

from infergen.config import ModelConfig
from infergen.config.sections import SchedulerConfig
from infergen.engine.config import EngineConfig
from infergen.errors import ConfigError
from infergen.quant.schemes import WEIGHT_SCHEMES

# KV formats the GPU path stores and reads (the engine dtype and per-head scaled FP8); the
# block-quantized ones (KIVI, NVFP4) run their reads on the CPU only for now
GPU_KV_FORMATS = (None, "fp8_e4m3")
# what a step needs beside the weights and the KV pool that torch does not account to
# tensors: cuBLAS / Triton workspaces, the CUDA context's allocator slack
WORKSPACE_BYTES = 512 << 20


def cuda_devices() -> int:
    """How many CUDA GPUs torch sees (0 with a CPU-only torch)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve(config: EngineConfig, cuda_count: int | None = None) -> EngineConfig:
    """`config` with device, kernels and dtype concrete for this machine (`cuda_count`: the
    CUDA GPUs it has; None asks torch). Raises ConfigError for what cannot run here."""
    count = cuda_devices() if cuda_count is None else cuda_count
    device = _device(config.device, count)
    on_gpu = device != "cpu"
    kernels = config.kernels
    if kernels == "auto":
        kernels = "triton" if on_gpu and has_triton() else "torch" if on_gpu else "native"
    if on_gpu and kernels == "native":
        raise ConfigError(
            "kernels='native' are C kernels for the CPU",
            where="kernels",
            found=f"native on {device}",
            expected="'triton' (or 'torch', or 'auto') on a GPU, or device='cpu'",
        )
    dtype = config.dtype
    if dtype == "auto":
        dtype = "bfloat16" if on_gpu and _bf16_fits(config) else "float32"
    if on_gpu:
        _check_gpu(config, device, kernels)
    return dataclasses.replace(config, device=device, kernels=kernels, dtype=dtype)


def _device(name: str, count: int) -> str:
    """The device as 'cpu' or 'cuda:N' (with its index: everything placed knows which GPU)."""
    if name == "auto":
        return "cuda:0" if count else "cpu"
    if name == "cpu":
        return name
    index = int(name.partition(":")[2] or 0)
    if count == 0:
        raise ConfigError(
            f"device {name!r} needs a CUDA GPU, and torch sees none",
            where="device",
            found=f"{name} (torch {torch.__version__}, CUDA available: "
            f"{torch.cuda.is_available()})",
            expected="'cpu' or 'auto' on this machine",
        )
    if index >= count:
        raise ConfigError(
            f"device {name!r} is not one of this machine's GPUs",
            where="device",
            found=name,
            expected=f"cuda:0 .. cuda:{count - 1}",
        )
    return f"cuda:{index}"


def has_triton() -> bool:
    """Whether the optional Triton extra is installed (nothing is imported)."""
    return importlib.util.find_spec("triton") is not None


def _bf16_fits(config: EngineConfig) -> bool:
    """bf16 unless calibration runs (fp32 only) or the weight scheme quantizes from fp32."""
    quant = config.quant
    if quant.calibrated:
        return False
    return quant.weights is None or "bfloat16" in WEIGHT_SCHEMES.get(quant.weights).dtypes


def _check_gpu(config: EngineConfig, device: str, kernels: str) -> None:
    """What the GPU path does not run yet: a clear error instead of a CPU kernel on CUDA. The
    compiled layers run there with the Triton kernel set only (its fused groups rendered by
    the Triton renderer; the C target's kernels are for the CPU)."""
    compiled_without_triton = config.compile.mode != "off" and kernels != "triton"
    quant = config.quant
    # the quantized projections' GPU rows are Triton's (ops/linear_triton_rows.py); of the
    # activation schemes, dynamic FP8 with FP8 weights (W8A8 through torch._scaled_mm)
    w8a8 = quant.weights == "fp8_e4m3" and quant.activations == "fp8_e4m3"
    unsupported = {
        "weights": (quant.weights is not None
                    and (kernels != "triton" or not WEIGHT_SCHEMES.get(quant.weights).gpu),
                    quant.weights, "kernels='triton' with a weight scheme that has a GPU row "
                    "(for bf16 weights: dtype='bfloat16')"),
        "activations": (quant.activations is not None and not w8a8, quant.activations,
                        "None, or 'fp8_e4m3' with weights='fp8_e4m3' (W8A8)"),
        "kv_format": (config.cache.kv_format not in GPU_KV_FORMATS, config.cache.kv_format,
                      "None or 'fp8_e4m3'"),
        "sparse_decode_blocks": (config.cache.sparse_decode_blocks is not None,
                                 config.cache.sparse_decode_blocks, "None (dense decode)"),
        "compile": (compiled_without_triton, config.compile.mode,
                    f"'off' (kernels={kernels!r}), or kernels='triton'"),
        "attention": (config.attention.operands not in (None, "fp32"),
                      config.attention.operands, "None"),
    }  # fmt: skip
    for where, (bad, found, expected) in unsupported.items():
        if bad:
            raise ConfigError(
                f"{where}={found!r} runs on the CPU only for now",
                where=where,
                found=f"{found!r} with device {device!r}",
                expected=f"{expected} on a GPU, or device='cpu'",
            )


def activation_bytes(model: ModelConfig, scheduler: SchedulerConfig, dtype_bytes: int) -> int:
    """An upper estimate of a step's transient memory: the widest per-token activations of
    a full step (the MLP's gate+up and their product, the QKV output, the residual stream
    and its pending delta) at `max_num_batched_tokens`, plus the fp32 logits of
    `max_num_seqs` rows (three copies: the logits, the sampler's processed ones, their
    softmax)."""
    widest = max(2 * model.intermediate_size, model.q_size + 2 * model.kv_size)
    per_token = (widest + model.intermediate_size + 4 * model.hidden_size) * dtype_bytes
    logits = 3 * scheduler.max_num_seqs * model.vocab_size * 4
    return scheduler.max_num_batched_tokens * per_token + logits + WORKSPACE_BYTES


def kv_budget(
    total: int, free: int, utilization: float, activations: int, where: str = "device"
) -> int:
    """Bytes for the KV pool: `utilization` of the device's `total` memory, less what is in
    use already (total − free: the weights, other processes) and the activation reserve."""
    budget = int(total * utilization) - (total - free) - activations
    if budget <= 0:
        raise ConfigError(
            "no GPU memory left for the KV cache",
            where="gpu_memory_utilization",
            found=f"{utilization:.2f} of {total / 2**30:.1f} GiB on {where}, "
            f"{(total - free) / 2**30:.1f} GiB in use, {activations / 2**30:.1f} GiB "
            "reserved for activations",
            expected="a higher gpu_memory_utilization, a smaller max_num_batched_tokens, "
            "or an explicit kv_cache_memory",
        )
    return budget


def gpu_kv_budget(config: EngineConfig, model: ModelConfig, dtype_bytes: int) -> int:
    """kv_budget for the engine's GPU, measured now (after the weights moved there)."""
    device = torch.device(config.device)
    free, total = torch.cuda.mem_get_info(device)
    reserve = activation_bytes(model, config.scheduler, dtype_bytes)
    return kv_budget(total, free, config.cache.gpu_memory_utilization, reserve, str(device))
