"""quantize(x, fmt) → QuantizedTensor and dequantize(q) → Tensor: the reference codecs.

Values are blocked along `axis` (the reduction axis of the GEMM that will read them): the axis
is moved last and split into blocks of `block_size`. Every scale rule cites its source:

- "tensor" (FP8): scale = amax / max_elem in fp32 (amax over finite values; 1 when amax is 0),
  elements = cast(v / scale) — round to nearest even, saturating, NaN kept (elements.py).
- "e8m0" (OCP MX v1.0 §6.3): FLOOR (the spec, default): shared_exp = floor(log2(amax)) −
  emax_elem; RCEIL (NVIDIA hardware / cuBLAS): shared_exp = ceil(log2(amax / max_elem)) with
  amax / max_elem rounded to fp32 first. Both clamped to [−127, 127]. An all-zero block stores
  0x00 (2^−127) and zero elements; a block holding NaN or ±Inf stores 0xFF (NaN), its elements
  0. Elements = cast(v / 2^shared_exp).
- "nvfp4" (NVIDIA NVFP4; REFERENCES §3): global = amax_tensor / (6 · 448) in fp32 over finite
  values; block scale = cast_e4m3(amax_block / 6 / global) (RNE, saturating); elements =
  cast_e2m1(v / (scale · global)); dequant = e2m1 · scale · global. A block whose scale is 0
  (all zero, or too small for E4M3) stores zero elements; a block holding NaN/Inf stores the
  E4M3 NaN scale 0x7F.
- "int" (symmetric): scale = amax / qmax, q = clamp(round_even(v / scale), −qmax, qmax);
  (asymmetric, min-max with an integer zero point, as GPTQ/AWQ checkpoints and
  compressed-tensors store it): the range [min, max] is widened to hold 0, scale = (max −
  min) / (2^bits − 1), zero = clamp(round_even(−min / scale), 0, 2^bits − 1), q =
  clamp(round_even(v / scale) + zero, 0, 2^bits − 1); dequant = (q − zero) · scale. An
  all-zero group has scale 0 and dequantizes to 0; a group holding NaN gets a NaN scale.
  KIVI style (`float_offset`, int2): scale = (max − min) / (2^bits − 1), q =
  clamp(round_even((v − min) / scale), 0, 2^bits − 1), dequant = q · scale + min, with the
  fp32 minimum stored in `zero_points`.
Signed integer codes are stored as two's complement in the uint8 `codes` (4- and 2-bit ones
in their low bits before packing).
"""

from __future__ import annotations

import math

import torch

from infergen.formats.elements import E8M0_BIAS, E8M0_NAN, ELEMENT_TYPES
from infergen.formats.pack import pack_bits, unpack_bits
from infergen.formats.qtensor import QuantizedTensor
from infergen.formats.spec import FORMATS, PER_CHANNEL, PER_TENSOR, FormatSpec

E4M3 = ELEMENT_TYPES.get("e4m3")
E2M1 = ELEMENT_TYPES.get("e2m1")
NVFP4_GLOBAL_DIVISOR = 6.0 * 448.0


def pow2_scale(x: torch.Tensor, exp: torch.Tensor) -> torch.Tensor:
    """x · 2^exp, exact, for |exp| ≤ 254: applied in two halves so that no factor is an fp32
    subnormal (flush-to-zero mode, which the engine turns on, would zero 2^−127)."""
    half = torch.div(exp, 2, rounding_mode="floor")
    return torch.ldexp(torch.ldexp(x, half), exp - half)


def _floor_log2(a: torch.Tensor) -> torch.Tensor:
    """floor(log2 a) for positive finite fp32 a, exactly (frexp: a = m·2^e, m in [0.5, 1))."""
    return torch.frexp(a)[1] - 1


def _ceil_log2(a: torch.Tensor) -> torch.Tensor:
    mant, exp = torch.frexp(a)
    return torch.where(mant == 0.5, exp - 1, exp)


def _blocks(x: torch.Tensor, axis: int, block: int) -> tuple[torch.Tensor, int]:
    """x with `axis` moved last, as [..., n_blocks, block] fp32; and the axis length."""
    moved = x.float().movedim(axis, -1)
    length = moved.shape[-1]
    if block == PER_CHANNEL:
        block = length
    if block == PER_TENSOR:
        return moved.reshape(1, -1), length
    if length % block:
        raise ValueError(
            f"axis {axis} has length {length}, not a multiple of the block size {block}"
        )
    return moved.reshape(*moved.shape[:-1], length // block, block), length


def _moved_shape(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    if not shape:
        return ()
    return (*shape[:axis], *shape[axis + 1 :], shape[axis])


def _finite_amax(blocks: torch.Tensor) -> torch.Tensor:
    a = blocks.abs()
    return torch.where(torch.isfinite(a), a, torch.zeros_like(a)).amax(dim=-1)


def _tensor_quantize(spec: FormatSpec, blocks: torch.Tensor, rule: str | None):
    et = spec.element_type
    amax = _finite_amax(blocks.reshape(1, -1))
    scale = torch.where(amax > 0, amax / et.max, torch.ones_like(amax))  # [1]
    return et.encode(blocks / scale), scale, None, None


def _e8m0_quantize(spec: FormatSpec, blocks: torch.Tensor, rule: str | None):
    et = spec.element_type
    rule = rule or "floor"
    amax = blocks.abs().amax(dim=-1)  # NaN propagates
    bad = ~torch.isfinite(amax)
    safe = torch.where(bad | (amax == 0), torch.ones_like(amax), amax)
    if rule == "floor":
        exp = _floor_log2(safe) - et.emax
    else:  # rceil
        exp = _ceil_log2(safe / et.max)
    exp = torch.where(amax == 0, torch.full_like(exp, -127), exp).clamp(-127, 127)
    codes = et.encode(pow2_scale(blocks, -exp.unsqueeze(-1)))
    codes = torch.where(bad.unsqueeze(-1), torch.zeros_like(codes), codes)
    scales = torch.where(bad, torch.full_like(exp, E8M0_NAN), exp + E8M0_BIAS).to(torch.uint8)
    return codes, scales, None, None


def _nvfp4_quantize(spec: FormatSpec, blocks: torch.Tensor, rule: str | None):
    amax_tensor = _finite_amax(blocks.reshape(1, -1)).reshape(())
    global_scale = amax_tensor / NVFP4_GLOBAL_DIVISOR
    if amax_tensor == 0:
        global_scale = torch.ones(())  # all-zero tensor: every block scale is 0 anyway
    amax = blocks.abs().amax(dim=-1)
    bad = ~torch.isfinite(amax)
    scale_codes = E4M3.encode(torch.where(bad, torch.zeros_like(amax), amax) / 6.0 / global_scale)
    scale_vals = E4M3.decode(scale_codes)
    divisor = (scale_vals * global_scale).unsqueeze(-1)
    zero = (scale_vals == 0).unsqueeze(-1)
    codes = E2M1.encode(blocks / torch.where(zero, torch.ones_like(divisor), divisor))
    codes = torch.where(zero | bad.unsqueeze(-1), torch.zeros_like(codes), codes)
    scale_codes = torch.where(bad, torch.full_like(scale_codes, E4M3.nan_code), scale_codes)
    return codes, scale_codes, None, global_scale.float()


def _int_quantize(spec: FormatSpec, blocks: torch.Tensor, rule: str | None):
    bits = spec.int_bits
    if spec.symmetric:
        qmax = (1 << (bits - 1)) - 1
        scale = blocks.abs().amax(dim=-1) / qmax  # NaN propagates into the group's scale
        div = torch.where(scale == 0, torch.ones_like(scale), scale).unsqueeze(-1)
        q = torch.round(blocks / div).clamp(-qmax, qmax)
        q = torch.where(torch.isnan(q), torch.zeros_like(q), q)
        codes = (q.to(torch.int32) & ((1 << bits) - 1)).to(torch.uint8)  # two's complement
        return codes, scale, None, None
    qmax = (1 << bits) - 1
    lo, hi = blocks.amin(dim=-1), blocks.amax(dim=-1)
    if spec.float_offset:  # KIVI: q = round((v - min) / scale), dequant q · scale + min
        scale = (hi - lo) / qmax
        div = torch.where(scale == 0, torch.ones_like(scale), scale).unsqueeze(-1)
        q = torch.round((blocks - lo.unsqueeze(-1)) / div).clamp(0, qmax)
        q = torch.where(torch.isnan(q), torch.zeros_like(q), q)
        return q.to(torch.uint8), scale, lo, None
    lo, hi = torch.minimum(lo, torch.zeros_like(lo)), torch.maximum(hi, torch.zeros_like(hi))
    scale = (hi - lo) / qmax  # the range always holds 0, so 0 is exact
    div = torch.where(scale == 0, torch.ones_like(scale), scale)
    zero = torch.round(-lo / div).clamp(0, qmax)
    zero = torch.where(torch.isnan(zero), torch.zeros_like(zero), zero)
    q = (torch.round(blocks / div.unsqueeze(-1)) + zero.unsqueeze(-1)).clamp(0, qmax)
    q = torch.where(torch.isnan(q), torch.zeros_like(q), q)
    return q.to(torch.uint8), scale, zero.to(torch.uint8), None


QUANTIZERS = {
    "tensor": _tensor_quantize,
    "e8m0": _e8m0_quantize,
    "nvfp4": _nvfp4_quantize,
    "int": _int_quantize,
}


def quantize(
    x: torch.Tensor,
    fmt: str | FormatSpec,
    *,
    axis: int = -1,
    block_size: int | None = None,
    scale_rule: str | None = None,
) -> QuantizedTensor:
    """Quantize `x` to `fmt` in blocks along `axis` (see the module docstring for the rules)."""
    spec = FORMATS.get(fmt, where="format") if isinstance(fmt, str) else fmt
    block = spec.block_size if block_size is None else block_size
    spec.check_block_size(block)
    if scale_rule is not None and scale_rule not in spec.scale_rules:
        raise ValueError(
            f"format {spec.name}: scale_rule {scale_rule!r} is not supported; expected one of "
            f"{list(spec.scale_rules) or ['None']}"
        )
    if not x.dtype.is_floating_point:
        raise TypeError(f"quantize expects a floating-point tensor, got {x.dtype}")
    axis = axis % x.dim() if x.dim() else 0
    blocks, _ = _blocks(x, axis, block)
    codes, scales, zero_points, global_scale = QUANTIZERS[spec.scaling](spec, blocks, scale_rule)
    moved_shape = _moved_shape(tuple(x.shape), axis)
    codes = codes.reshape(moved_shape)
    if spec.packed:
        codes = pack_bits(codes, spec.element_bits)
    return QuantizedTensor(
        format=spec.name,
        codes=codes,
        scales=scales,
        zero_points=zero_points,
        global_scale=global_scale,
        shape=tuple(x.shape),
        dtype=x.dtype,
        axis=axis,
        block_size=block,
        scale_rule=scale_rule or (spec.scale_rules[0] if spec.scale_rules else None),
    )


def dequantize(q: QuantizedTensor) -> torch.Tensor:
    """The values `q` stands for, in q.dtype and q.shape."""
    spec = FORMATS.get(q.format, where="QuantizedTensor.format")
    codes = unpack_bits(q.codes, spec.element_bits) if spec.packed else q.codes
    moved_shape = _moved_shape(q.shape, q.axis)
    blocks, _ = _blocks(codes.reshape(moved_shape).to(torch.float32), -1, q.block_size)
    codes = blocks.to(torch.uint8)
    if spec.scaling == "int":
        bits = spec.int_bits
        if spec.symmetric:
            signed = codes.to(torch.int32)
            signed = torch.where(signed >= (1 << (bits - 1)), signed - (1 << bits), signed)
            values = signed.float() * q.scales.unsqueeze(-1)
        elif spec.float_offset:
            values = codes.float() * q.scales.unsqueeze(-1) + q.zero_points.unsqueeze(-1)
        else:
            values = (codes.float() - q.zero_points.float().unsqueeze(-1)) * q.scales.unsqueeze(-1)
    elif spec.scaling == "tensor":
        values = spec.element_type.decode(codes) * q.scales
    elif spec.scaling == "e8m0":
        exp = q.scales.to(torch.int32).unsqueeze(-1) - E8M0_BIAS
        values = pow2_scale(spec.element_type.decode(codes), exp)
        values = torch.where(exp == E8M0_NAN - E8M0_BIAS, math.nan, values)
    else:  # nvfp4
        values = E2M1.decode(codes) * E4M3.decode(q.scales).unsqueeze(-1) * q.global_scale
    return values.reshape(moved_shape).movedim(-1, q.axis).to(q.dtype)


def sqnr_db(x: torch.Tensor, y: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio 10·log10(Σx² / Σ(x−y)²) in dB."""
    x, y = x.double(), y.double()
    noise = (x - y).pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(x.pow(2).sum().item() / noise)
