"""A quantization configuration in one string, for `infergen eval` and the benchmarks:

    WEIGHTS[/ACTIVATIONS][+OPTION...]

WEIGHTS is a WEIGHT_SCHEMES row or "none", ACTIVATIONS an ACTIVATION_SCHEMES row, and each
OPTION a smoothing (SMOOTHINGS: "awq", "smoothquant"), a calibration method (CLIP_METHODS:
"max", "percentile", "mse") or "fp8_attention" (Q, K, V and P in FP8: the FP8 KV cache and
FP8 attention operands). Examples: "int4+awq+mse", "fp8_e4m3/fp8_e4m3" (W8A8 FP8, per-token
scales), "int8/int8_static+smoothquant", "nvfp4/nvfp4" (W4A4), "int4/int8" (W4A8),
"fp8_e4m3/fp8_e4m3+fp8_attention" (every matmul operand in FP8).
"""

from __future__ import annotations

from infergen.errors import ConfigError
from infergen.quant.activations import ACTIVATION_SCHEMES
from infergen.quant.clipping import CLIP_METHODS
from infergen.quant.schemes import WEIGHT_SCHEMES
from infergen.quant.smoothing import SMOOTHINGS

SPEC_SYNTAX = "WEIGHTS[/ACTIVATIONS][+OPTION...], e.g. 'int4+awq', 'fp8_e4m3/fp8_e4m3'"

# the weight + activation and calibrated configurations `infergen eval` scores by default
MATRIX_SPECS = (
    "int4+mse", "int4+awq", "int4+awq+mse", "nvfp4+mse",
    "fp8_e4m3/fp8_e4m3", "fp8_e4m3/fp8_e4m3_static",
    "int8/int8", "int8/int8_static", "int8/int8_static+mse", "int8/int8_static+smoothquant",
    "int4/int8", "int4/fp8_e4m3", "nvfp4/nvfp4", "mxfp4/mxfp4",
    "none+fp8_attention", "fp8_e4m3/fp8_e4m3+fp8_attention",
)  # fmt: skip


def parse_spec(spec: str) -> dict[str, str | None]:
    """spec → the LLM arguments weights, activations, calibration, smoothing, attention and
    kv_format (None: the caller's)."""
    head, *options = spec.split("+")
    weights, _, activations = head.partition("/")
    args: dict[str, str | None] = {
        "weights": None if weights == "none" else weights,
        "activations": activations or None,
        "calibration": "max",
        "smoothing": None,
        "attention": None,
        "kv_format": None,
    }
    if args["weights"] is not None:
        WEIGHT_SCHEMES.get(args["weights"], where=f"quantization config {spec!r}")
    if args["activations"] is not None:
        ACTIVATION_SCHEMES.get(args["activations"], where=f"quantization config {spec!r}")
    for option in options:
        if option in SMOOTHINGS:
            args["smoothing"] = option
        elif option in CLIP_METHODS:
            args["calibration"] = option
        elif option == "fp8_attention":
            args["attention"] = args["kv_format"] = "fp8_e4m3"
        else:
            raise ConfigError(
                f"unknown option {option!r} in quantization config {spec!r}",
                expected=f"{SPEC_SYNTAX}; options: "
                f"{SMOOTHINGS.names() + CLIP_METHODS.names() + ['fp8_attention']}",
            )
    return args
