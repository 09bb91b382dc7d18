"""Weight schemes: a row per scheme (WEIGHT_SCHEMES) names the LINEAR_BACKENDS row its
projections use and the projections it keeps at the engine's precision (module-name globs,
e.g. "lm_head"). The engine applies the scheme to the model before loading the checkpoint,
so each projection's backend quantizes its own weight as it loads (`prepare`). A projection
runs its kernel set's row of the scheme's format where one exists (kernels="triton":
"int8:triton" ..., ops/linear_triton_rows.py), else the scheme's row.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import torch
from torch import nn

from infergen.layers.linear import Linear
from infergen.layers.probe import FALLBACK_FACTOR
from infergen.ops import linear_bf16, linear_grouped, linear_quantized
from infergen.ops.linear import LINEAR_BACKENDS, backend_for
from infergen.registry import Registry


@dataclass(frozen=True)
class WeightScheme:
    linear_backend: str  # a LINEAR_BACKENDS row
    description: str
    keep: tuple[str, ...] = ()  # module-name globs left at the engine's precision
    dtypes: tuple[str, ...] = ("float32",)  # engine dtypes the backend quantizes from
    # True: nothing is quantized here; a GGUF file's Q4_0 / Q4_1 / Q8_0 blocks are kept as
    # loaded and each projection runs its blocks' backend (ops/linear_grouped.py)
    keep_blocks: bool = False
    # the load-time check (layers/probe.py): probe_error on Gaussian weights; a projection
    # FALLBACK_FACTOR times above it falls back to full precision (None: not checked)
    expected_error: float | None = None
    # the weights sharing a scale, for clipping searches (quant/clipping.py): a group size
    # along the inputs, PER_CHANNEL (-1: a row) or PER_TENSOR (0); asymmetric: a scale and an
    # offset (a group's range is [min, max], not ±amax)
    scale_group: int = 32
    asymmetric: bool = False
    gpu: bool = True  # False: the backend has no GPU (Triton) row; refused on a GPU


WEIGHT_SCHEMES: Registry[WeightScheme] = Registry("weight scheme")
WEIGHT_SCHEMES.register(
    "int8",
    WeightScheme(
        "int8",
        "weight-only int8, one fp32 scale per output channel (formats 'int8'); every "
        "projection, the LM head (and a tied embedding) included",
        expected_error=0.008,
        scale_group=-1,
    ),
)


WEIGHT_SCHEMES.register(
    "fp8_e4m3",
    WeightScheme(
        "fp8_e4m3",
        "weight-only FP8 E4M3, one fp32 scale per projection as the engine holds it (formats "
        "'fp8_e4m3'; q/k/v share one, gate/up share one); every projection, the LM head (and "
        "a tied embedding) included",
        expected_error=0.027,
        scale_group=0,
    ),
)


WEIGHT_SCHEMES.register(
    "bf16",
    WeightScheme(
        "bf16",
        "bf16 weights (rounded to nearest even) and bf16 products: each projection's input "
        "rounded to bf16, products summed in fp32 (AVX-512 BF16's vdpbf16ps where the CPU has "
        "it); every projection, the LM head (and a tied embedding) included; the rest fp32",
        expected_error=0.0025,
        scale_group=-1,
        gpu=False,  # (on a GPU: dtype="bfloat16")
    ),
)


# name → (description, probe error on Gaussian weights: layers/probe.py)
_GROUPED = {
    "int4": ("formats 'int4': symmetric, one fp32 scale (amax / 7) per group of 32 inputs", 0.10),
    "int4_asym": (
        "formats 'int4_asym': min-max, one fp32 scale and uint8 zero point per group of 32 inputs",
        0.084,
    ),
    "q4_0": ("llama.cpp's Q4_0 blocks (gguf.quants): one fp16 scale per 32 inputs, 4.5 bits", 0.09),
    "q4_1": (
        "llama.cpp's Q4_1 blocks (gguf.quants): fp16 scale and minimum per 32 inputs, 5 bits",
        0.081,
    ),
    "q8_0": (
        "llama.cpp's Q8_0 blocks (gguf.quants): one fp16 scale per 32 int8 inputs, 8.5 bits",
        0.0055,
    ),
    "mxfp4": (
        "formats 'mxfp4' (OCP MX): E2M1 codes, one E8M0 scale per 32 inputs, 4.25 bits",
        0.12,
    ),
    "nvfp4": (
        "formats 'nvfp4': E2M1 codes, one E4M3 scale per 16 inputs and an fp32 scale per "
        "projection as the engine holds it (q/k/v share one, gate/up share one), 4.5 bits",
        0.10,
    ),
}
for _name, (_what, _error) in _GROUPED.items():
    WEIGHT_SCHEMES.register(
        _name,
        WeightScheme(
            _name,
            f"weight-only {_what}; every projection, the LM head (and a tied embedding) "
            "included (input features must be a multiple of 32)",
            expected_error=_error,
            scale_group=linear_grouped.GROUP_FORMATS[_name].scale_group,
            asymmetric=linear_grouped.GROUP_FORMATS[_name].asymmetric,
        ),
    )

WEIGHT_SCHEMES.register(
    "gguf",
    WeightScheme(
        "native",
        "a GGUF file's own Q4_0 / Q4_1 / Q8_0 blocks, computed on as loaded (no re-quantization: "
        "the same values the unquantized engine dequantizes them to); other tensor types are "
        "dequantized to fp32",
        keep_blocks=True,
    ),
)


def apply_weight_scheme(model: nn.Module, name: str, keep: tuple[str, ...] = ()) -> list[str]:
    """Point the model's projections at the scheme's backend (before `load_weights`); those
    matching the scheme's or `keep`'s globs stay as they are. Returns the names changed."""
    scheme = WEIGHT_SCHEMES.get(name, where="weights")
    LINEAR_BACKENDS.get(scheme.linear_backend, where="weight scheme backend")  # registered
    kept = scheme.keep + tuple(keep)
    changed = []
    for module_name, module in model.named_modules():
        if not isinstance(module, Linear):
            continue
        if any(fnmatch.fnmatch(module_name, g) for g in kept):
            module.keep_blocks = False  # blocks of a kept projection are dequantized
            continue
        module.backend = backend_for(scheme.linear_backend, module.kernels)
        if scheme.expected_error is not None:
            module.max_error = scheme.expected_error * FALLBACK_FACTOR
        changed.append(module_name)
    return changed


def dequantized_weight(name: str, weight: torch.Tensor) -> torch.Tensor:
    """The fp32 weight [out, in] scheme `name` computes with for fp32 `weight` (the values its
    backend's product uses: quantize, then dequantize by the format's reference)."""
    backend = WEIGHT_SCHEMES.get(name, where="weights").linear_backend
    if backend in linear_quantized.CODE_FORMATS:
        return linear_quantized.dequantized(weight, backend)
    if backend in linear_grouped.GROUP_FORMATS:
        return linear_grouped.dequantized(weight, backend)
    if backend == "bf16":
        return linear_bf16.dequantized(weight)
    raise ValueError(f"weight scheme {name!r} does not quantize fp32 weights")
