"""Group-quantized projections: y = x · Wᵀ + b with W held as codes in groups of 32 inputs of
one output channel sharing a scale (and an offset), fp32 activations. One LINEAR_BACKENDS row
per group format (GROUP_FORMATS):
  "q4_0"       GGUF Q4_0: 4-bit u, fp16 d per group;            w = d·(u − 8)
  "q4_1"       GGUF Q4_1: 4-bit u, fp16 d and m per group;      w = d·u + m
  "q8_0"       GGUF Q8_0: int8 q, fp16 d per group;             w = d·q
  "int4"       formats "int4" (symmetric, g32): q + 8 in 4 bits, fp32 scale
  "int4_asym"  formats "int4_asym" (min-max, g32): 4-bit u, fp32 scale, uint8 zero point
  "mxfp4"      formats "mxfp4": E2M1 codes, an E8M0 scale per group (4.25 bits a weight)
  "nvfp4"      formats "nvfp4": E2M1 codes, an E4M3 scale per 16 inputs, one fp32 global scale

A backend takes either a GGUF `BlockWeight` (the checkpoint's blocks, as loaded: nothing is
re-quantized) or an fp32 weight, which it quantizes (GGUF formats through gguf.quants, the
others through infergen.formats). `prepare` lays the codes out for
kernels/gemm_packed_g_f32.c: uint8 [panels, in / 32, group bytes], each group the 24 columns'
header fields then their codes (4-bit: two inputs a byte). The kernel uses every weight at the
value the format's reference dequantization gives, so the product equals the fp32 "native"
backend on the dequantized weight bit for bit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from infergen.errors import ConfigError
from infergen.formats import quantize
from infergen.formats.block_weight import BLOCK, BLOCK_TYPES, BlockWeight
from infergen.formats.pack import unpack_bits
from infergen.formats.qtensor import QuantizedTensor
from infergen.formats.quant_weight import QuantWeight
from infergen.kernels.build import I, L, P, kernel
from infergen.ops import linear_w4a8
from infergen.ops.linear import LINEAR_BACKENDS, PANEL, LinearBackend, run_packed
from infergen.ops.linear import reference as fp32_reference

SOURCE = "gemm_packed_g_f32"


@dataclass
class Grouped:
    """A weight [out, in] as one code per weight and per-group header fields [out, in / 32]."""

    codes: torch.Tensor  # uint8 [out, in]: the 4-bit u (0..15) or the int8 q's byte
    fields: list[torch.Tensor]  # e.g. [d fp16] or [s fp32, zero uint8], each [out, groups]
    scalar: float | None = None  # one fp32 for the whole weight (NVFP4's global scale)


@dataclass(frozen=True)
class GroupFormat:
    bits: int  # 4 or 8 bits a code
    fields: tuple[torch.dtype, ...]  # header fields, in layout order
    decode_format: int  # kernels/decode_layers_f32.c weight_format
    value: Callable[[Grouped], torch.Tensor]  # the reference dequantization, fp32 [out, in]
    encode: Callable[[torch.Tensor], Grouped]  # fp32 weight → codes and fields
    scalar: bool = False  # the header ends with Grouped.scalar (fp32)
    scale_group: int = BLOCK  # inputs sharing one scale
    asymmetric: bool = False  # a minimum / zero point beside each scale


def _per_weight(field: torch.Tensor) -> torch.Tensor:
    """[out, groups] → fp32 [out, groups · 32] (each group's value for its 32 inputs)."""
    return field.float().repeat_interleave(BLOCK, dim=1)


_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0] * 2) * torch.tensor(
    [1.0] * 8 + [-1.0] * 8
)


def _fp4_value(g: Grouped) -> torch.Tensor:
    """MXFP4: e2m1 · 2^(e − 127); NVFP4: (e2m1 · e4m3 scale of its 16 inputs) · global."""
    values = _E2M1.to(g.codes.device)[g.codes.long()]
    if g.scalar is None:  # MXFP4
        e = g.fields[0].to(torch.int32)
        scale = torch.where(e > 0, torch.exp2((e - 127).float()), torch.zeros(()))
        return values * _per_weight(scale)
    e4m3 = torch.stack(g.fields, dim=-1).view(torch.float8_e4m3fn).float()  # [out, groups, 2]
    per_16 = e4m3.flatten(1).repeat_interleave(BLOCK // 2, dim=1)
    return values * per_16 * g.scalar


def _fp4_codes(
    weight: torch.Tensor, fmt: str
) -> tuple[torch.Tensor, torch.Tensor, QuantizedTensor]:
    """E2M1 codes [out, in] (unpacked), a scale byte per block [out, blocks], the quantized
    tensor (its global scale)."""
    q = quantize(weight, fmt, axis=-1)
    codes = unpack_bits(q.codes, 4).reshape(weight.shape)
    return codes, q.scales.reshape(weight.shape[0], -1), q


def _mxfp4_encode(weight: torch.Tensor) -> Grouped:
    """An E8M0 scale per 32 inputs: one header field."""
    codes, scales, _ = _fp4_codes(weight, "mxfp4")
    return Grouped(codes, [scales.contiguous()])


def _nvfp4_encode(weight: torch.Tensor) -> Grouped:
    """An E4M3 scale per 16 inputs: two header fields per 32 (even and odd 16s), and the
    global scale."""
    codes, scales, q = _fp4_codes(weight, "nvfp4")
    halves = [scales[:, 0::2].contiguous(), scales[:, 1::2].contiguous()]
    return Grouped(codes, halves, float(q.global_scale))


def _gguf_encode(ggml_type: str) -> Callable[[torch.Tensor], Grouped]:
    def encode(weight: torch.Tensor) -> Grouped:
        from gguf import GGMLQuantizationType, quants

        raw = quants.quantize(weight.numpy(), GGMLQuantizationType[ggml_type])
        return from_blocks(BlockWeight(ggml_type, torch.from_numpy(raw), tuple(weight.shape)))

    return encode


def _formats_encode(fmt: str) -> Callable[[torch.Tensor], Grouped]:
    def encode(weight: torch.Tensor) -> Grouped:

        q = quantize(weight, fmt, axis=-1, block_size=BLOCK)
        groups = (weight.shape[0], weight.shape[1] // BLOCK)
        scales = q.scales.reshape(groups).float()
        codes = unpack_bits(q.codes, 4).reshape(weight.shape)
        if q.zero_points is None:  # symmetric: 4-bit two's complement q → u = q + 8
            return Grouped(codes ^ 8, [scales])
        return Grouped(codes, [scales, q.zero_points.reshape(groups)])

    return encode


GROUP_FORMATS = {
    "q4_0": GroupFormat(
        4, (torch.float16,), 3,
        lambda g: _per_weight(g.fields[0]) * (g.codes.float() - 8.0),
        _gguf_encode("Q4_0"),
    ),
    "q4_1": GroupFormat(
        4, (torch.float16, torch.float16), 4,
        lambda g: _per_weight(g.fields[0]) * g.codes.float() + _per_weight(g.fields[1]),
        _gguf_encode("Q4_1"), asymmetric=True,
    ),
    "q8_0": GroupFormat(
        8, (torch.float16,), 5,
        lambda g: _per_weight(g.fields[0]) * g.codes.view(torch.int8).float(),
        _gguf_encode("Q8_0"),
    ),
    "int4": GroupFormat(
        4, (torch.float32,), 6,
        lambda g: (g.codes.float() - 8.0) * _per_weight(g.fields[0]),
        _formats_encode("int4"),
    ),
    "int4_asym": GroupFormat(
        4, (torch.float32, torch.uint8), 7,
        lambda g: (g.codes.float() - _per_weight(g.fields[1])) * _per_weight(g.fields[0]),
        _formats_encode("int4_asym"), asymmetric=True,
    ),
    "mxfp4": GroupFormat(4, (torch.uint8,), 8, _fp4_value, _mxfp4_encode),
    "nvfp4": GroupFormat(
        4, (torch.uint8, torch.uint8), 9, _fp4_value, _nvfp4_encode, scalar=True,
        scale_group=16,
    ),
}  # fmt: skip


def from_blocks(weight: BlockWeight) -> Grouped:
    """GGUF blocks → codes and header fields (a Q4 block: fp16 d [, fp16 m], 16 bytes holding
    elements i (low nibble) and i + 16 (high nibble); a Q8_0 block: fp16 d, 32 int8)."""
    out, inp = weight.shape
    size = BLOCK_TYPES[weight.ggml_type][1]
    raw = weight.blocks.reshape(out, inp // BLOCK, size)
    d = raw[..., 0:2].contiguous().view(torch.float16)[..., 0]
    if weight.ggml_type == "Q8_0":
        return Grouped(raw[..., 2:].reshape(out, inp).contiguous(), [d])
    fields = [d]
    if weight.ggml_type == "Q4_1":
        fields.append(raw[..., 2:4].contiguous().view(torch.float16)[..., 0])
    qs = raw[..., size - 16 :]
    codes = torch.cat([qs & 0xF, qs >> 4], dim=-1)  # [out, groups, 32]: elements 0..15, 16..31
    return Grouped(codes.reshape(out, inp).contiguous(), fields)


def pack(g: Grouped, fmt: GroupFormat) -> torch.Tensor:
    """Codes and fields → uint8 [panels, groups, header + codes] (see the module docstring)."""
    out, inp = g.codes.shape
    groups, panels = inp // BLOCK, -(-out // PANEL)
    rows = panels * PANEL
    codes = torch.zeros(rows, inp, dtype=torch.uint8)
    codes[:out] = g.codes
    parts = []
    for field in g.fields:
        padded = torch.zeros(rows, groups, dtype=field.dtype)
        padded[:out] = field
        per_group = padded.view(panels, PANEL, groups).transpose(1, 2).contiguous()
        parts.append(per_group.view(torch.uint8).reshape(panels, groups, -1))
    if fmt.scalar:
        scalar = torch.tensor([g.scalar], dtype=torch.float32).view(torch.uint8)
        parts.append(scalar.expand(panels, groups, 4))
    c = codes.view(panels, PANEL, groups, BLOCK).permute(0, 2, 3, 1)  # [p, g, 32, 24]
    if fmt.bits == 4:  # inputs 2r (low nibble) and 2r + 1 (high) in code row r
        c = c[:, :, 0::2] | (c[:, :, 1::2] << 4)
    parts.append(c.reshape(panels, groups, -1))
    return torch.cat(parts, dim=-1).contiguous()


def unpack(prepared: torch.Tensor, fmt: GroupFormat) -> Grouped:
    """The inverse of `pack` up to the padding: [panels · 24, in] codes and fields."""
    panels, groups, _ = prepared.shape
    offset, fields = 0, []
    for dtype in fmt.fields:
        size = torch.empty((), dtype=dtype).element_size() * PANEL
        raw = prepared[..., offset : offset + size].contiguous().view(dtype)  # [p, g, 24]
        fields.append(raw.transpose(1, 2).reshape(panels * PANEL, groups))
        offset += size
    scalar = None
    if fmt.scalar:
        scalar = prepared[0, 0, offset : offset + 4].contiguous().view(torch.float32).item()
        offset += 4
    c = prepared[..., offset:].reshape(panels, groups, -1, PANEL)
    if fmt.bits == 4:
        c = torch.stack([c & 0xF, c >> 4], dim=3).reshape(panels, groups, BLOCK, PANEL)
    codes = c.permute(0, 3, 1, 2).reshape(panels * PANEL, groups * BLOCK)
    return Grouped(codes, fields, scalar)


def dequantized(weight: torch.Tensor | BlockWeight, name: str) -> torch.Tensor:
    """The fp32 weight the backend computes with (what its tests compare against)."""
    fmt = GROUP_FORMATS[name]
    g = from_blocks(weight) if isinstance(weight, BlockWeight) else fmt.encode(weight)
    return fmt.value(g)


def _backend(name: str, fmt: GroupFormat) -> LinearBackend:
    def prepare(weight: torch.Tensor | BlockWeight) -> torch.Tensor:
        out, inp = weight.shape
        if inp % BLOCK:
            raise ConfigError(
                f"weights {name!r} quantize groups of {BLOCK} inputs, and this projection's "
                "inputs are not a whole number of groups",
                found=f"{inp} input features",
                expected=f"a multiple of {BLOCK} (or another scheme, e.g. 'int8')",
            )
        if isinstance(weight, BlockWeight):
            if weight.fmt != name:
                raise TypeError(f"{name} backend got {weight.ggml_type} blocks")
            return pack(from_blocks(weight), fmt)
        if isinstance(weight, QuantWeight):  # codes and fields as a checkpoint stores them
            return pack(Grouped(weight.codes, list(weight.fields), weight.scalar), fmt)
        if weight.dtype != torch.float32:
            raise TypeError(f"{name} weights are quantized from float32, got {weight.dtype}")
        return pack(fmt.encode(weight.contiguous()), fmt)

    def apply(x, prepared, bias, out_features):
        if x.dtype != torch.float32:
            raise TypeError(f"{name} linear expects float32 activations, got {x.dtype}")
        fn = kernel(f"gemm_packed_{name}_f32", P, P, P, P, L, L, L, I, source=SOURCE)
        if fn is None:  # no C compiler: the same values through torch
            return fp32_reference(x, fmt.value(unpack(prepared, fmt))[:out_features], bias)
        return run_packed(fn, x, prepared, bias, out_features)

    def rows(prepared: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Dequantized rows (a tied LM head's embedding lookup reads the quantized weight)."""
        g = unpack(prepared[ids // PANEL], fmt)  # the panels holding the rows
        pick = torch.arange(len(ids)) * PANEL + ids % PANEL
        return fmt.value(Grouped(g.codes[pick], [f[pick] for f in g.fields], g.scalar))

    # 4-bit weights S·u + O take int8 activations per token with integer sums (W4A8)
    integer, fused = {}, {}
    if name in linear_w4a8.FORMATS:
        weight = lambda prepared: fmt.value(unpack(prepared, fmt))  # noqa: E731
        integer[("int8", "token")] = functools.partial(linear_w4a8.apply, name=name, weight=weight)
        fused[("int8", "token")] = linear_w4a8.DECODE_FORMATS[name]
    return LinearBackend(prepare, apply, rows, decode_format=fmt.decode_format,
                         quantized_inputs=integer, quantized_decode_formats=fused)  # fmt: skip


for _name, _fmt in GROUP_FORMATS.items():
    LINEAR_BACKENDS.register(_name, _backend(_name, _fmt))
