"""How a checkpoint stores its weights (`StoredQuant`), read from its config.json's
`quantization_config` (a GGUF file's tensor types are mapped onto one by `infergen.io.gguf`).

One row of QUANT_METHODS per `quant_method`. Format names are rows of the formats table
(formats/spec.py: "fp8_e4m3", "mxfp4", "int4", ...), a plain float ("bf16", "fp16", "fp32")
or, for GGUF, the ggml type in lower case ("q4_k", "q8_0"). The performance model and
`infergen info` / `infergen predict` take their default weight widths from it; loading the
weights themselves is io/ (io/compressed_tensors.py for the layouts the engine runs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infergen.errors import ConfigError
from infergen.formats.spec import FORMATS
from infergen.registry import Registry

PLAIN_BITS = {"fp32": 32.0, "bf16": 16.0, "fp16": 16.0}


def compute_class(activation_format: str) -> str:
    """The peak a GEMM runs at, from its activation (input) format: weight-only formats
    (W4A16) still multiply in the activation width. fp8/fp6 minifloats -> "fp8", 4-bit
    -> "fp4", integers -> "int8" / "int4", 16-bit -> "bf16"."""
    if activation_format in PLAIN_BITS:
        return "fp32" if activation_format == "fp32" else "bf16"

    spec = FORMATS.get(activation_format, where="activation format")
    bits = spec.element_bits
    if spec.element is None:
        return "int8" if bits > 4 else "int4"
    return "fp8" if bits > 4 else "fp4"


def format_bits(name: str, group_size: int | None = None) -> float:
    """Stored bits per value of a plain float or a formats-table row (scales included, at
    `group_size` when the checkpoint says so)."""
    if name in PLAIN_BITS:
        return PLAIN_BITS[name]
    return FORMATS.get(name, where="format").bits_per_value(group_size)


@dataclass(frozen=True)
class StoredQuant:
    """The stored weight format of a checkpoint.

    method: the `quant_method` it was read from ("gguf" for a GGUF file).
    weights / weight_bits: the format of the weights (the projections; embeddings and the
        LM head are counted at it too) and its bits per value, scales included.
    experts / expert_bits: the routed experts' format when it differs from `weights`
        (gpt-oss: MXFP4 experts next to bf16 attention); None: as `weights`.
    """

    method: str
    weights: str
    weight_bits: float
    experts: str | None = None
    expert_bits: float | None = None

    def __post_init__(self) -> None:
        for bits in (self.weight_bits, self.expert_bits):
            if bits is not None and not (bits > 0 and math.isfinite(bits)):
                raise ConfigError(
                    "stored bits per weight must be positive",
                    where=f"quantization_config ({self.method})",
                    found=bits,
                    expected="> 0",
                )

    @property
    def label(self) -> str:
        """E.g. "mxfp4 experts, bf16 elsewhere" or "fp8_e4m3"."""
        if self.experts is None:
            return self.weights
        return f"{self.experts} experts, {self.weights} elsewhere"

    @staticmethod
    def from_hf_config(qconfig: dict[str, Any], source: str) -> StoredQuant:
        where = f"{source}: quantization_config"
        method = qconfig.get("quant_method")
        return QUANT_METHODS.get(method, where=f"{where}.quant_method")(qconfig, where)


QuantReader = Callable[[dict[str, Any], str], StoredQuant]
QUANT_METHODS: Registry[QuantReader] = Registry("quantization_config.quant_method")


@QUANT_METHODS.decorator("mxfp4")
def _mxfp4(qconfig: dict[str, Any], where: str) -> StoredQuant:
    """transformers' Mxfp4Config (gpt-oss): the MoE experts in MXFP4, every other module
    (attention, router, embeddings, LM head: `modules_to_not_convert`) in bf16."""
    return StoredQuant("mxfp4", "bf16", 16.0, "mxfp4", format_bits("mxfp4"))


_FP8_ELEMENTS = {"e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2"}


@QUANT_METHODS.decorator("fp8")
def _fp8(qconfig: dict[str, Any], where: str) -> StoredQuant:
    """transformers' FineGrainedFP8Config (DeepSeek-V3): FP8 weights, one scale per
    `weight_block_size` block (its share of the bits is negligible)."""
    element = qconfig.get("fmt", "e4m3")
    if element not in _FP8_ELEMENTS:
        raise ConfigError("unsupported FP8 element type", where=f"{where}.fmt", found=element,
                          expected=f"one of {sorted(_FP8_ELEMENTS)}")  # fmt: skip
    name = _FP8_ELEMENTS[element]
    return StoredQuant("fp8", name, format_bits(name))


def _int_format(bits: Any, symmetric: bool, where: str) -> str:
    names = {(8, True): "int8", (4, True): "int4", (4, False): "int4_asym"}
    if (bits, symmetric) not in names:
        raise ConfigError("unsupported integer weight format", where=where,
                          found=f"{bits} bits, {'symmetric' if symmetric else 'asymmetric'}",
                          expected="4 bits, or 8 bits symmetric")  # fmt: skip
    return names[bits, symmetric]


@QUANT_METHODS.decorator("gptq")
def _gptq(qconfig: dict[str, Any], where: str) -> StoredQuant:
    """GPTQ: `bits`-bit integers in groups of `group_size`, zero points unless `sym`."""
    name = _int_format(qconfig.get("bits"), bool(qconfig.get("sym", True)), f"{where}.bits")
    return StoredQuant("gptq", name, format_bits(name, _group(qconfig.get("group_size"))))


@QUANT_METHODS.decorator("awq")
def _awq(qconfig: dict[str, Any], where: str) -> StoredQuant:
    """AWQ: `bits`-bit integers in groups of `group_size`, zero points when `zero_point`."""
    symmetric = not qconfig.get("zero_point", True)
    name = _int_format(qconfig.get("bits"), symmetric, f"{where}.bits")
    return StoredQuant("awq", name, format_bits(name, _group(qconfig.get("group_size"))))


def _group(size: Any) -> int:
    """A group size as the formats table counts it (per channel: -1 or None → 0)."""
    return size if isinstance(size, int) and size > 0 else 0


# compressed-tensors (format, weights type, num_bits, symmetric) → the format its weights load
# as (io/compressed_tensors.py read_weight); None matches anything
COMPRESSED_TENSORS_FORMATS = (
    (("naive-quantized", "float", 8, None), "fp8_e4m3"),
    (("float-quantized", "float", 8, None), "fp8_e4m3"),
    (("nvfp4-pack-quantized", None, None, None), "nvfp4"),
    (("mxfp4-pack-quantized", None, None, None), "mxfp4"),
    (("pack-quantized", "int", 8, True), "int8"),
    (("pack-quantized", "int", 4, True), "int4"),
    (("pack-quantized", "int", 4, False), "int4_asym"),
)


def compressed_tensors_format(fmt: str | None, args: dict[str, Any]) -> str | None:
    """The format of a compressed-tensors config group's weights (None: not one we know)."""
    found = (fmt, args.get("type"), args.get("num_bits"), bool(args.get("symmetric", True)))
    for key, name in COMPRESSED_TENSORS_FORMATS:
        if all(want is None or want == got for want, got in zip(key, found, strict=True)):
            return name
    return None


@QUANT_METHODS.decorator("compressed-tensors")
def _compressed_tensors(qconfig: dict[str, Any], where: str) -> StoredQuant:
    """One config group with weights (what `infergen quantize` writes and we load)."""
    groups = [g for g in (qconfig.get("config_groups") or {}).values() if g.get("weights")]
    if len(groups) != 1:
        raise ConfigError("compressed-tensors: one config group with weights is supported",
                          where=f"{where}.config_groups", found=f"{len(groups)} groups",
                          expected="1")  # fmt: skip
    args = groups[0]["weights"]
    fmt = groups[0].get("format") or qconfig.get("format")
    name = compressed_tensors_format(fmt, args)
    if name is None:
        raise ConfigError(
            "compressed-tensors weight scheme not supported",
            where=f"{where}.config_groups",
            found=f"format {fmt!r}, weights {args}",
            expected="int4 / int8 pack-quantized, FP8 naive- / float-quantized, NVFP4, MXFP4",
        )
    group = _group(args.get("group_size")) if args.get("strategy") == "group" else None
    return StoredQuant("compressed-tensors", name, format_bits(name, group))


@QUANT_METHODS.decorator("gguf")
def _gguf(qconfig: dict[str, Any], where: str) -> StoredQuant:
    """A GGUF file's tensor types, as `infergen.io.gguf` maps them: the type holding the most
    weights and the file's bits per weight over all tensors (so weight bytes are the file's)."""
    return StoredQuant("gguf", str(qconfig["weights"]), float(qconfig["bits_per_weight"]))
