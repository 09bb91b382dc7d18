"""The format table: one `FormatSpec` row per low-precision format (DESIGN.md convention 5).

A format = an element type + how values are scaled:
- "tensor": one fp32 scale for the whole tensor (amax / max_elem) — FP8 per-tensor;
- "e8m0": OCP MX — one E8M0 power-of-two scale per block of 32 along the reduction axis;
- "nvfp4": one E4M3 scale per block of 16, times one fp32 global scale per tensor;
- "int": integer codes with one fp32 scale per group, per channel or per tensor; asymmetric
  formats add a uint8 zero point (GPTQ/AWQ/compressed-tensors style) or an fp32 group
  minimum (KIVI style, `float_offset`).

`block_size` is the default granularity: a positive group size, PER_CHANNEL (the whole
reduction axis) or PER_TENSOR. `bits_per_value` counts the stored scale (and zero point)
bits per element, at the default block size.
"""

from __future__ import annotations

from dataclasses import dataclass

from infergen.formats.elements import ELEMENT_TYPES, Minifloat
from infergen.registry import Registry

PER_TENSOR = 0
PER_CHANNEL = -1

SCALE_BITS = {"tensor": 0, "e8m0": 8, "nvfp4": 8, "int": 32}


@dataclass(frozen=True)
class FormatSpec:
    name: str
    scaling: str  # "tensor" | "e8m0" | "nvfp4" | "int"
    element: str | None = None  # minifloat element type (ELEMENT_TYPES), or None for "int"
    int_bits: int = 0  # "int": bits per code
    symmetric: bool = True  # "int": zero point when False
    float_offset: bool = (
        False  # "int" asymmetric: fp32 group minimum (KIVI) instead of a uint8 zero
    )
    block_size: int = PER_TENSOR
    block_sizes: tuple[int, ...] = ()  # other block sizes the format accepts
    scale_rules: tuple[str, ...] = ()  # "e8m0": "floor" (OCP spec, default) | "rceil"
    description: str = ""

    @property
    def global_scale(self) -> bool:
        """An fp32 scale per tensor above the block scales (NVFP4: global = amax / (448·6))."""
        return self.scaling == "nvfp4"

    @property
    def integer(self) -> bool:
        """Integer codes (round to nearest, clamp), not minifloat elements."""
        return self.scaling == "int"

    @property
    def scaled_max(self) -> float:
        """The largest magnitude a per-tensor scale maps onto: the element's largest, times
        the largest block scale when the blocks have their own (NVFP4's E4M3 scales)."""
        block_scale = ELEMENT_TYPES.get("e4m3").max if self.global_scale else 1.0
        return self.max * block_scale

    @property
    def element_type(self) -> Minifloat | None:
        return ELEMENT_TYPES.get(self.element) if self.element else None

    @property
    def element_bits(self) -> int:
        return self.element_type.bits if self.element else self.int_bits

    @property
    def packed(self) -> bool:
        """Codes of 4 bits go two per byte (element 2i in the low nibble), 2 bits four per
        byte (element 4i+j at bits 2j); others one per byte."""
        return self.element_bits in (2, 4)

    def bits_per_value(self, block_size: int | None = None) -> float:
        block = self.block_size if block_size is None else block_size
        if block <= 0:  # per tensor / per channel: the scale's share vanishes with size
            return float(self.element_bits)
        extra = SCALE_BITS[self.scaling] + (0 if self.symmetric else 32 if self.float_offset else 8)
        return self.element_bits + extra / block

    @property
    def max(self) -> float:
        """Largest magnitude of an element code (before scaling)."""
        if self.element:
            return self.element_type.max
        return float((1 << (self.int_bits - 1)) - 1 if self.symmetric else (1 << self.int_bits) - 1)

    def check_block_size(self, block_size: int) -> None:
        allowed = {self.block_size, *self.block_sizes}
        if block_size not in allowed:
            names = {PER_TENSOR: "per-tensor", PER_CHANNEL: "per-channel"}
            shown = sorted(names.get(b, str(b)) for b in allowed)
            raise ValueError(
                f"format {self.name}: block_size {names.get(block_size, block_size)} is not "
                f"supported; expected one of {shown}"
            )


FORMATS: Registry[FormatSpec] = Registry("format")
for _row in (
    FormatSpec("fp8_e4m3", "tensor", "e4m3", description="FP8 E4M3FN, per-tensor fp32 scale"),
    FormatSpec("fp8_e5m2", "tensor", "e5m2", description="FP8 E5M2, per-tensor fp32 scale"),
    FormatSpec("mxfp8_e4m3", "e8m0", "e4m3", block_size=32, scale_rules=("floor", "rceil")),
    FormatSpec("mxfp8_e5m2", "e8m0", "e5m2", block_size=32, scale_rules=("floor", "rceil")),
    FormatSpec("mxfp6_e2m3", "e8m0", "e2m3", block_size=32, scale_rules=("floor", "rceil")),
    FormatSpec("mxfp6_e3m2", "e8m0", "e3m2", block_size=32, scale_rules=("floor", "rceil")),
    FormatSpec("mxfp4", "e8m0", "e2m1", block_size=32, scale_rules=("floor", "rceil")),
    FormatSpec("nvfp4", "nvfp4", "e2m1", block_size=16, description="E4M3 x fp32 scales"),
    FormatSpec(
        "int8",
        "int",
        int_bits=8,
        block_size=PER_CHANNEL,
        block_sizes=(PER_TENSOR, 32, 64, 128),
        description="symmetric, scale = amax / 127",
    ),
    FormatSpec(
        "int4",
        "int",
        int_bits=4,
        block_size=32,
        block_sizes=(64, 128),
        description="symmetric per group, scale = amax / 7",
    ),
    FormatSpec(
        "int4_asym",
        "int",
        int_bits=4,
        symmetric=False,
        block_size=32,
        block_sizes=(64, 128),
        description="asymmetric min-max per group, uint8 zero point",
    ),
    FormatSpec(
        "int2",
        "int",
        int_bits=2,
        symmetric=False,
        float_offset=True,
        block_size=32,
        block_sizes=(64, 128),
        description="asymmetric min-max per group (KIVI): fp32 scale and minimum",
    ),
):
    FORMATS.register(_row.name, _row)
