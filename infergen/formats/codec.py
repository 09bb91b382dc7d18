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

from infergen.formats import fast
from infergen.formats.elements import E8M0_BIAS, E8M0_NAN, ELEMENT_TYPES
from infergen.formats.pack import pack_bits, unpack_bits
from infergen.formats.qtensor import QuantizedTensor
from infergen.formats.spec import FORMATS, PER_CHANNEL, PER_TENSOR, FormatSpec

E4M3 = ELEMENT_TYPES.get("e4m3")
E2M1 = ELEMENT_TYPES.get("e2m1")
NVFP4_GLOBAL_DIVISOR = 6.0 * 448.0


def _triton_paths():
    try:
        from infergen.formats import triton_kernels
    except ImportError:  # Triton is an optional extra: the torch reference runs instead
        return None
    return triton_kernels


# Fast paths per device type: a module with the functions of formats/fast.py (each may return
# None: the torch reference then runs). CPU: the C kernels; CUDA: the Triton kernels.
FAST_PATHS = {"cpu": lambda: fast, "cuda": _triton_paths}


class _NoFastPath:
    def __getattr__(self, name):
        return lambda *args, **kwargs: None


NO_FAST_PATH = _NoFastPath()


def fast_paths(t: torch.Tensor, native: bool = True):
    """The fast-path module for t's device (NO_FAST_PATH: the torch reference only)."""
    loader = FAST_PATHS.get(t.device.type) if native else None
    paths = loader() if loader is not None else None
    return paths if paths is not None else NO_FAST_PATH


def _div(a: torch.Tensor, b: float) -> torch.Tensor:
    """a / b correctly rounded on every device: CUDA torch computes tensor / Python number as
    a · (1 / b), up to 1 ulp off (seen on an H200); a divisor tensor on a's device divides."""
    return a / torch.full_like(a, b)


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


def _blocks(x: torch.Tensor, axis: int, block: int) -> torch.Tensor:
    """x with `axis` moved last, as [..., n_blocks, block] fp32 ([1, numel] per tensor)."""
    moved = x.float().movedim(axis, -1)
    length = moved.shape[-1]
    if block == PER_CHANNEL:
        block = length
    if block == PER_TENSOR:
        return moved.reshape(1, -1)
    if length % block:
        raise ValueError(
            f"axis {axis} has length {length}, not a multiple of the block size {block}"
        )
    return moved.reshape(*moved.shape[:-1], length // block, block)


def _moved_shape(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    if not shape:
        return ()
    return (*shape[:axis], *shape[axis + 1 :], shape[axis])


def _finite_amax(blocks: torch.Tensor) -> torch.Tensor:
    a = blocks.abs()
    return torch.where(torch.isfinite(a), a, torch.zeros_like(a)).amax(dim=-1)


def _tensor_amax(blocks: torch.Tensor, native: bool) -> torch.Tensor:
    """Finite amax of the whole tensor, shape [1]."""
    amax = fast_paths(blocks, native).finite_amax(blocks)
    return amax.reshape(1) if amax is not None else _finite_amax(blocks.reshape(1, -1))


def _tensor_quantize(spec: FormatSpec, blocks: torch.Tensor, rule: str | None, native: bool):
    et = spec.element_type
    amax = _tensor_amax(blocks, native)
    scale = torch.where(amax > 0, _div(amax, et.max), torch.ones_like(amax))  # [1]
    codes = fast_paths(blocks, native).scaled_encode(blocks, scale, et)  # no host round trip
    if codes is None:
        codes = et.encode(blocks / scale)
    return codes, scale, None, None


def _e8m0_quantize(spec: FormatSpec, blocks: torch.Tensor, rule: str | None, native: bool):
    et = spec.element_type
    rule = rule or "floor"
    done = fast_paths(blocks, native).mx_quantize(blocks, et, rule)
    if done is not None:
        return done[0], done[1], None, None
    amax = blocks.abs().amax(dim=-1)  # NaN propagates
    bad = ~torch.isfinite(amax)
    safe = torch.where(bad | (amax == 0), torch.ones_like(amax), amax)
    if rule == "floor":
        exp = _floor_log2(safe) - et.emax
    else:  # rceil
        exp = _ceil_log2(_div(safe, et.max))
    exp = torch.where(amax == 0, torch.full_like(exp, -127), exp).clamp(-127, 127)
    codes = et.encode(pow2_scale(blocks, -exp.unsqueeze(-1)))
    codes = torch.where(bad.unsqueeze(-1), torch.zeros_like(codes), codes)
    scales = torch.where(bad, torch.full_like(exp, E8M0_NAN), exp + E8M0_BIAS).to(torch.uint8)
    return codes, scales, None, None


def _nvfp4_quantize(
    spec: FormatSpec,
    blocks: torch.Tensor,
    rule: str | None,
    native: bool,
    global_scale: torch.Tensor | None = None,
):
    if global_scale is None:  # from the tensor's own amax
        amax_tensor = _tensor_amax(blocks, native).reshape(())
        global_scale = _div(amax_tensor, NVFP4_GLOBAL_DIVISOR)  # all-zero: 1, block scales 0
        global_scale = torch.where(amax_tensor == 0, torch.ones_like(global_scale), global_scale)
    global_scale = global_scale.reshape(()).float()
    done = fast_paths(blocks, native).nvfp4_quantize(blocks, global_scale)
    if done is not None:
        return done[0], done[1], None, global_scale.float()
    amax = blocks.abs().amax(dim=-1)
    bad = ~torch.isfinite(amax)
    scale_codes = E4M3.encode(
        _div(torch.where(bad, torch.zeros_like(amax), amax), 6.0) / global_scale
    )
    scale_vals = E4M3.decode(scale_codes)
    divisor = (scale_vals * global_scale).unsqueeze(-1)
    zero = (scale_vals == 0).unsqueeze(-1)
    codes = E2M1.encode(blocks / torch.where(zero, torch.ones_like(divisor), divisor))
    codes = torch.where(zero | bad.unsqueeze(-1), torch.zeros_like(codes), codes)
    scale_codes = torch.where(bad, torch.full_like(scale_codes, E4M3.nan_code), scale_codes)
    return codes, scale_codes, None, global_scale.float()


def _int_quantize(spec: FormatSpec, blocks: torch.Tensor, rule: str | None, native: bool):
    bits = spec.int_bits
    mode = 0 if spec.symmetric else 2 if spec.float_offset else 1
    done = fast_paths(blocks, native).int_quantize(blocks, bits, mode)
    if done is not None:
        return done[0], done[1], done[2], None
    if spec.symmetric:
        qmax = (1 << (bits - 1)) - 1
        scale = _div(blocks.abs().amax(dim=-1), qmax)  # NaN propagates into the group's scale
        div = torch.where(scale == 0, torch.ones_like(scale), scale).unsqueeze(-1)
        q = torch.round(blocks / div).clamp(-qmax, qmax)
        q = torch.where(torch.isnan(q), torch.zeros_like(q), q)
        codes = (q.to(torch.int32) & ((1 << bits) - 1)).to(torch.uint8)  # two's complement
        return codes, scale, None, None
    qmax = (1 << bits) - 1
    lo, hi = blocks.amin(dim=-1), blocks.amax(dim=-1)
    if spec.float_offset:  # KIVI: q = round((v - min) / scale), dequant q · scale + min
        scale = _div(hi - lo, qmax)
        div = torch.where(scale == 0, torch.ones_like(scale), scale).unsqueeze(-1)
        q = torch.round((blocks - lo.unsqueeze(-1)) / div).clamp(0, qmax)
        q = torch.where(torch.isnan(q), torch.zeros_like(q), q)
        return q.to(torch.uint8), scale, lo, None
    lo, hi = torch.minimum(lo, torch.zeros_like(lo)), torch.maximum(hi, torch.zeros_like(hi))
    scale = _div(hi - lo, qmax)  # the range always holds 0, so 0 is exact
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
    native: bool = True,
    global_scale: torch.Tensor | None = None,
) -> QuantizedTensor:
    """Quantize `x` to `fmt` in blocks along `axis` (see the module docstring for the rules).
    `native=False` forces the torch reference path; else the fast path of x's device runs
    (FAST_PATHS: C on the CPU, Triton on CUDA), bit-identical, where it exists.
    `global_scale` (NVFP4 only): a given fp32 tensor scale (e.g. a static activation scale from
    calibration) instead of the tensor's amax / (448 · 6); values beyond it saturate."""
    spec = FORMATS.get(fmt, where="format") if isinstance(fmt, str) else fmt
    extra = {}
    if global_scale is not None:
        if spec.scaling != "nvfp4":
            raise ValueError(f"format {spec.name}: global_scale is an NVFP4 parameter")
        extra["global_scale"] = global_scale
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
    blocks = _blocks(x, axis, block)
    codes, scales, zero_points, global_scale = QUANTIZERS[spec.scaling](
        spec, blocks, scale_rule, native, **extra
    )
    moved_shape = _moved_shape(tuple(x.shape), axis)
    if spec.packed and codes.numel() != blocks.numel():  # a fast path packed as it encoded
        codes = codes.reshape(*moved_shape[:-1], moved_shape[-1] * spec.element_bits // 8)
    else:
        codes = codes.reshape(moved_shape)
        if spec.packed:
            packed = fast_paths(codes, native).pack_bits(codes, spec.element_bits)
            codes = packed if packed is not None else pack_bits(codes, spec.element_bits)
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


def dequantize(q: QuantizedTensor, native: bool = True) -> torch.Tensor:
    """The values `q` stands for, in q.dtype and q.shape (`native=False`: torch reference)."""
    spec = FORMATS.get(q.format, where="QuantizedTensor.format")
    codes = q.codes
    values = _dequantize_packed(spec, q) if native and spec.packed else None
    if values is not None:
        return values.reshape(_moved_shape(q.shape, q.axis)).movedim(-1, q.axis).to(q.dtype)
    if spec.packed:
        unpacked = fast_paths(codes, native).unpack_bits(codes, spec.element_bits)
        codes = unpacked if unpacked is not None else unpack_bits(codes, spec.element_bits)
    moved_shape = _moved_shape(q.shape, q.axis)
    block = q.block_size
    if block == PER_CHANNEL:
        block = moved_shape[-1]
    codes = codes.reshape(-1, codes.numel() if block == PER_TENSOR else block)
    values = _dequantize_native(spec, q, codes) if native else None
    if values is None:
        values = _dequantize_reference(spec, q, codes)
    return values.reshape(moved_shape).movedim(-1, q.axis).to(q.dtype)


def _dequantize_packed(spec: FormatSpec, q: QuantizedTensor) -> torch.Tensor | None:
    """MXFP4 / NVFP4 / int4 / int2 straight from the packed codes, where the device's fast
    path has it (fp4_dequantize, int_dequantize_packed): fp32 [n_blocks, block] or None."""
    paths = fast_paths(q.codes)
    if spec.scaling == "int":
        fn = getattr(paths, "int_dequantize_packed", None)
        if fn is None:
            return None
        block = q.block_size
        if block == PER_CHANNEL:
            block = _moved_shape(q.shape, q.axis)[-1]
        elif block == PER_TENSOR:
            block = math.prod(q.shape)
        zeros = None if spec.symmetric else q.zero_points.reshape(-1)
        return fn(q.codes, q.scales.reshape(-1), zeros, spec.int_bits, block)
    fn = getattr(paths, "fp4_dequantize", None)
    if fn is None or spec.element_bits != 4:
        return None
    if spec.scaling == "nvfp4":
        return fn(q.codes, q.scales, q.block_size, spec.element_type, q.global_scale)
    return fn(q.codes, q.scales, q.block_size, spec.element_type, None)


def _dequantize_native(spec: FormatSpec, q: QuantizedTensor, codes: torch.Tensor):
    paths = fast_paths(codes)
    if spec.scaling == "e8m0":
        return paths.mx_dequantize(codes, q.scales.reshape(-1), spec.element_type)
    if spec.scaling == "nvfp4":
        scale_values = E4M3.decode(q.scales).reshape(-1)
        return paths.block_dequantize(codes, scale_values, q.global_scale, E2M1)
    if spec.scaling == "tensor":
        return paths.block_dequantize(codes, q.scales.reshape(-1), 1.0, spec.element_type)
    zeros = None if spec.symmetric else q.zero_points.reshape(-1)
    return paths.int_dequantize(codes, q.scales.reshape(-1), zeros, spec.int_bits)


def _dequantize_reference(spec: FormatSpec, q: QuantizedTensor, codes: torch.Tensor):
    """codes [n_blocks, block] → fp32 values [n_blocks, block]."""

    def per_block(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(-1, 1)

    if spec.scaling == "int":
        bits = spec.int_bits
        if spec.symmetric:
            signed = codes.to(torch.int32)
            signed = torch.where(signed >= (1 << (bits - 1)), signed - (1 << bits), signed)
            return signed.float() * per_block(q.scales)
        if spec.float_offset:
            return codes.float() * per_block(q.scales) + per_block(q.zero_points)
        return (codes.float() - per_block(q.zero_points).float()) * per_block(q.scales)
    if spec.scaling == "tensor":
        return spec.element_type.decode(codes) * q.scales
    if spec.scaling == "e8m0":
        exp = per_block(q.scales.to(torch.int32)) - E8M0_BIAS
        values = pow2_scale(spec.element_type.decode(codes), exp)
        return torch.where(exp == E8M0_NAN - E8M0_BIAS, math.nan, values)
    return E2M1.decode(codes) * per_block(E4M3.decode(q.scales)) * q.global_scale


def sqnr_db(x: torch.Tensor, y: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio 10·log10(Σx² / Σ(x−y)²) in dB."""
    x, y = x.double(), y.double()
    noise = (x - y).pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(x.pow(2).sum().item() / noise)
