"""Triton kernels for MX, NVFP4, FP8 and integer quantize and dequantize
(GPU; tested on the CPU with TRITON_INTERPRET=1).

The same arithmetic as formats/codec.py and kernels/quantize_f32.c, in bit operations:
floor(log2 a) from the fp32 exponent field, powers of two built in the exponent bits, and
round-to-nearest-even by the 1.5·2^23 magic number (exact for |y| < 2^22; element mantissas
are below 2^4). Bit-identical to the reference in the interpreter (tests/formats/
test_triton.py) and on an H200 (benchmarks/device_check.sh runs the same tests there).
Triton is optional: `pip install 'infergen[triton]'`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infergen.formats.elements import Minifloat

RNE_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2^23 (a global a kernel reads: constexpr)


@triton.jit
def _div(a, b):
    """a / b rounded to nearest even, as torch and C divide (Triton's `/` on fp32 compiles to
    the approximate div.full.f32 on NVIDIA GPUs: up to 2 ulp off, seen on an H200)."""
    return tl.div_rn(a, tl.zeros_like(a) + b)


@triton.jit
def _pow2(e):
    """2^e as fp32 for integer tensors -126 <= e <= 127."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _encode(
    v,
    MBITS: tl.constexpr,
    EMIN: tl.constexpr,
    BITS: tl.constexpr,
    MAX_CODE: tl.constexpr,
    NAN_CODE: tl.constexpr,
    MAX: tl.constexpr,
):
    bits = v.to(tl.int32, bitcast=True)
    sign = ((bits >> 31) & 1) << (BITS - 1)
    a = tl.minimum(tl.abs(v), MAX)
    e = ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.maximum(e, EMIN)
    y = a * _pow2(MBITS - e)
    m = (y + RNE_MAGIC) - RNE_MAGIC
    code = ((e - EMIN) << MBITS) + m.to(tl.int32)
    code = tl.minimum(code, MAX_CODE) | sign
    is_nan = v != v
    nan_code = (sign | NAN_CODE) if NAN_CODE >= 0 else 0
    return tl.where(is_nan, nan_code, code).to(tl.uint8)


@triton.jit
def _block_tile(n_blocks, BLOCK: tl.constexpr, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """This program's ROWS blocks of BLOCK elements, each padded to WIDTH lanes (a power of
    two, as tl.arange needs): row ids, in-range mask, element offsets."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, WIDTH)[None, :]
    mask = (rows[:, None] < n_blocks) & (cols < BLOCK)
    return rows, mask, rows[:, None] * BLOCK + cols


@triton.jit
def _block_amax(v):
    """Per row: whether it holds NaN or Inf, and its amax over the non-NaN values."""
    a = tl.abs(v)
    bad = tl.max(((v != v) | (a == float("inf"))).to(tl.int32), axis=1) > 0
    return bad, tl.max(tl.where(v != v, 0.0, a), axis=1)


@triton.jit
def _mx_quantize_kernel(
    x_ptr,
    codes_ptr,
    scales_ptr,
    n_blocks,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    MBITS: tl.constexpr,
    EMIN: tl.constexpr,
    BITS: tl.constexpr,
    MAX_CODE: tl.constexpr,
    NAN_CODE: tl.constexpr,
    MAX: tl.constexpr,
    EMAX: tl.constexpr,
    RCEIL: tl.constexpr,
):
    rows, mask, offs = _block_tile(n_blocks, BLOCK, ROWS, BLOCK)
    v = tl.load(x_ptr + offs, mask=mask, other=0.0)
    bad, amax = _block_amax(v)
    abits = amax.to(tl.int32, bitcast=True)
    if RCEIL:
        r = _div(amax, MAX)
        rbits = r.to(tl.int32, bitcast=True)
        rexp = (rbits >> 23) & 0xFF
        mant = rbits & 0x7FFFFF
        e = tl.where(
            rexp == 0, tl.where(mant > (1 << 22), -126, -127), rexp - 127 + (mant != 0).to(tl.int32)
        )
    else:
        e = ((abits >> 23) & 0xFF) - 127 - EMAX
    e = tl.where(amax == 0.0, -127, e)
    e = tl.minimum(tl.maximum(e, -127), 127)
    neg = -e
    half = tl.where(neg >= 0, neg // 2, -((-neg + 1) // 2))
    scaled = v * _pow2(half)[:, None] * _pow2(neg - half)[:, None]
    codes = _encode(scaled, MBITS, EMIN, BITS, MAX_CODE, NAN_CODE, MAX)
    codes = tl.where(bad[:, None], 0, codes).to(tl.uint8)
    tl.store(codes_ptr + offs, codes, mask=mask)
    scale = tl.where(bad, 255, e + 127).to(tl.uint8)
    tl.store(scales_ptr + rows, scale, mask=rows < n_blocks)


@triton.jit
def _mx_dequantize_kernel(
    codes_ptr, scales_ptr, table_ptr, out_ptr, n_blocks, BLOCK: tl.constexpr, ROWS: tl.constexpr
):
    rows, mask, offs = _block_tile(n_blocks, BLOCK, ROWS, BLOCK)
    codes = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.int32)
    s = tl.load(scales_ptr + rows, mask=rows < n_blocks, other=127).to(tl.int32)
    e = s - 127
    half = tl.where(e >= 0, e // 2, -((-e + 1) // 2))
    values = tl.load(table_ptr + codes, mask=mask, other=0.0)
    out = values * _pow2(half)[:, None] * _pow2(e - half)[:, None]
    out = tl.where((s == 255)[:, None], float("nan"), out)
    tl.store(out_ptr + offs, out, mask=mask)


@triton.jit
def _nvfp4_quantize_kernel(
    x_ptr, codes_ptr, scales_ptr, global_ptr, e4m3_ptr, n_blocks, ROWS: tl.constexpr
):
    rows, mask, offs = _block_tile(n_blocks, 16, ROWS, 16)
    v = tl.load(x_ptr + offs, mask=mask, other=0.0)
    g = tl.load(global_ptr)
    bad, amax = _block_amax(v)
    amax = tl.where(bad, 0.0, amax)
    s = _encode(_div(_div(amax, 6.0), g), 3, -6, 8, 0x7E, 0x7F, 448.0)  # E4M3 block scale
    sval = tl.load(e4m3_ptr + s.to(tl.int32))
    divisor = sval * g
    zero = sval == 0.0
    codes = _encode(_div(v, tl.where(zero, 1.0, divisor)[:, None]), 1, 0, 4, 0x7, -1, 6.0)
    codes = tl.where((zero | bad)[:, None], 0, codes).to(tl.uint8)
    tl.store(codes_ptr + offs, codes, mask=mask)
    tl.store(scales_ptr + rows, tl.where(bad, 0x7F, s).to(tl.uint8), mask=rows < n_blocks)


@triton.jit
def _scaled_dequantize_kernel(
    codes_ptr,
    scale_ptr,
    table_ptr,
    out_ptr,
    post_ptr,
    n_blocks,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    WIDTH: tl.constexpr,
):
    """out = table[code] · scale[block] · post[0] (NVFP4: E4M3 value, global; FP8: scale, 1)."""
    rows, mask, offs = _block_tile(n_blocks, BLOCK, ROWS, WIDTH)
    codes = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.int32)
    scale = tl.load(scale_ptr + rows, mask=rows < n_blocks, other=1.0)
    values = tl.load(table_ptr + codes, mask=mask, other=0.0)
    out = values * scale[:, None] * tl.load(post_ptr)
    tl.store(out_ptr + offs, out, mask=mask)


@triton.jit
def _scaled_quantize_kernel(
    x_ptr,
    codes_ptr,
    scale_ptr,
    n,
    SIZE: tl.constexpr,
    MBITS: tl.constexpr,
    EMIN: tl.constexpr,
    BITS: tl.constexpr,
    MAX_CODE: tl.constexpr,
    NAN_CODE: tl.constexpr,
    MAX: tl.constexpr,
):
    """FP8 per tensor: codes = encode(x / scale)."""
    offs = tl.program_id(0) * SIZE + tl.arange(0, SIZE)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    codes = _encode(_div(v, tl.load(scale_ptr)), MBITS, EMIN, BITS, MAX_CODE, NAN_CODE, MAX)
    tl.store(codes_ptr + offs, codes, mask=offs < n)


ROWS = 16  # blocks per program for small blocks (MX 32, NVFP4 16, groups of 32..128)
MAX_TILE = 8192  # lanes per program; a block wider than this runs the torch reference


def _tiling(t: torch.Tensor):
    """(n_blocks, block, rows per program, padded width, grid) for blocks along t's last axis,
    or None when a block is wider than MAX_TILE."""
    block = t.shape[-1]
    width = triton.next_power_of_2(block)
    if width > MAX_TILE:
        return None
    n_blocks = t.numel() // block
    rows = max(1, min(ROWS, 2048 // width))
    return n_blocks, block, rows, width, (triton.cdiv(n_blocks, rows),)


# Every launch: no FMA contraction, so a·b + c rounds twice as in the torch reference (the
# interpreter has no such pass and ignores the option).
NO_FMA = {"enable_fp_fusion": False}


def _elem(et: Minifloat) -> dict:
    return {
        "MBITS": et.mbits,
        "EMIN": et.emin,
        "BITS": et.bits,
        "MAX_CODE": et.max_code,
        "NAN_CODE": et.nan_code if et.nan_code is not None else -1,
        "MAX": et.max,
    }


def mx_quantize(blocks: torch.Tensor, et: Minifloat, rule: str):
    """blocks [..., n_blocks, 32] fp32 → (codes uint8 like blocks, E8M0 scales [..., n])."""
    blocks = blocks.contiguous()
    n_blocks, block, rows, _, grid = _tiling(blocks)
    codes = torch.empty(blocks.shape, dtype=torch.uint8, device=blocks.device)
    scales = torch.empty(blocks.shape[:-1], dtype=torch.uint8, device=blocks.device)
    _mx_quantize_kernel[grid](
        blocks,
        codes,
        scales,
        n_blocks,
        BLOCK=block,
        ROWS=rows,
        EMAX=et.emax,
        RCEIL=rule == "rceil",
        **_elem(et),
        **NO_FMA,
    )
    return codes, scales


def mx_dequantize(codes: torch.Tensor, scales: torch.Tensor, et: Minifloat) -> torch.Tensor:
    """codes [..., n_blocks, 32] uint8 + E8M0 scales → fp32 values."""
    codes, scales = codes.contiguous(), scales.contiguous()
    n_blocks, block, rows, _, grid = _tiling(codes)
    out = torch.empty(codes.shape, dtype=torch.float32, device=codes.device)
    table = et.decode_table().to(codes.device)
    _mx_dequantize_kernel[grid](
        codes, scales, table, out, n_blocks, BLOCK=block, ROWS=rows, **NO_FMA
    )
    return out


def nvfp4_quantize(blocks: torch.Tensor, global_scale: torch.Tensor):
    """blocks [..., n_blocks, 16] fp32, global scale (0-d fp32) → (codes, E4M3 scale bytes)."""
    from infergen.formats.elements import ELEMENT_TYPES

    blocks = blocks.contiguous()
    n_blocks, _, rows, _, grid = _tiling(blocks)
    codes = torch.empty(blocks.shape, dtype=torch.uint8, device=blocks.device)
    scales = torch.empty(blocks.shape[:-1], dtype=torch.uint8, device=blocks.device)
    table = ELEMENT_TYPES.get("e4m3").decode_table().to(blocks.device)
    g = global_scale.reshape(1).float().to(blocks.device)
    _nvfp4_quantize_kernel[grid](blocks, codes, scales, g, table, n_blocks, ROWS=rows, **NO_FMA)
    return codes, scales


def scaled_dequantize(
    codes: torch.Tensor, scale_values: torch.Tensor, post: torch.Tensor, et: Minifloat
) -> torch.Tensor:
    """codes [n_blocks, block] → table[code] · scale_values[block] · post (fp32)."""
    shape = codes.shape
    codes = codes.contiguous()
    if scale_values.numel() == 1:  # one scale (FP8 per tensor): rows of a power-of-two width
        width = codes.numel() & -codes.numel()  # largest power of two dividing numel
        codes = codes.reshape(-1, min(width, 1024))
        scale_values = scale_values.reshape(1).expand(codes.shape[0])
    tiling = _tiling(codes)
    if tiling is None:
        return None
    n_blocks, block, rows, width, grid = tiling
    out = torch.empty(codes.shape, dtype=torch.float32, device=codes.device)
    table = et.decode_table().to(codes.device)
    _scaled_dequantize_kernel[grid](
        codes,
        scale_values.float().contiguous(),
        table,
        out,
        post.reshape(1).float().to(codes.device),
        n_blocks,
        BLOCK=block,
        ROWS=rows,
        WIDTH=width,
        **NO_FMA,
    )
    return out.reshape(shape)


def scaled_quantize(x: torch.Tensor, scale: torch.Tensor, et: Minifloat) -> torch.Tensor:
    """FP8 per-tensor codes of x / scale (scale: 1-element fp32)."""
    x = x.contiguous()
    codes = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    size = 1024
    grid = (triton.cdiv(x.numel(), size),)
    _scaled_quantize_kernel[grid](
        x, codes, scale.reshape(1).float().to(x.device), x.numel(), SIZE=size, **_elem(et), **NO_FMA
    )
    return codes


@triton.jit
def _rne(y):
    """Round to nearest even for |y| < 2^22 (integer codes are far below); NaN → 0, as the
    reference zeroes NaN codes (e.g. Inf / Inf when a group holds an Inf)."""
    r = (y + RNE_MAGIC) - RNE_MAGIC
    return tl.where(r != r, 0.0, r)


@triton.jit
def _int_quantize_kernel(
    x_ptr,
    codes_ptr,
    scales_ptr,
    zeros_ptr,
    n_blocks,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    WIDTH: tl.constexpr,
    BITS: tl.constexpr,
    MODE: tl.constexpr,
):
    """MODE 0 symmetric, 1 asymmetric with an integer zero point, 2 KIVI (fp32 minimum);
    the operations of codec._int_quantize in the same order."""
    rows, mask, offs = _block_tile(n_blocks, BLOCK, ROWS, WIDTH)
    v = tl.load(x_ptr + offs, mask=mask, other=0.0)
    has_nan = tl.max((v != v).to(tl.int32), axis=1) > 0
    if MODE == 0:
        qmax: tl.constexpr = (1 << (BITS - 1)) - 1
        scale = _div(tl.max(tl.abs(tl.where(v != v, 0.0, v)), axis=1), qmax)
    else:
        qmax: tl.constexpr = (1 << BITS) - 1
        lo = tl.min(tl.where(mask, v, float("inf")), axis=1)
        hi = tl.max(tl.where(mask, v, -float("inf")), axis=1)
        if MODE == 1:
            lo = tl.minimum(lo, 0.0)
            hi = tl.maximum(hi, 0.0)
        scale = _div(hi - lo, qmax)
    scale = tl.where(has_nan, float("nan"), scale)
    div = tl.where(scale == 0.0, 1.0, scale)
    if MODE == 0:
        q = tl.minimum(tl.maximum(_rne(_div(v, div[:, None])), -qmax), qmax)
        codes = q.to(tl.int32) & ((1 << BITS) - 1)
    elif MODE == 1:
        z = tl.minimum(tl.maximum(_rne(_div(-lo, div)), 0.0), qmax)
        q = (_div(v, div[:, None]) + RNE_MAGIC) - RNE_MAGIC + z[:, None]  # NaN stays NaN here
        q = tl.minimum(tl.maximum(tl.where(q != q, 0.0, q), 0.0), qmax)
        codes = q.to(tl.int32)
        tl.store(
            zeros_ptr + rows,
            tl.where(has_nan, 0, z.to(tl.int32)).to(tl.uint8),
            mask=rows < n_blocks,
        )
    else:
        q = tl.minimum(tl.maximum(_rne(_div(v - lo[:, None], div[:, None])), 0.0), qmax)
        codes = q.to(tl.int32)
        tl.store(zeros_ptr + rows, tl.where(has_nan, float("nan"), lo), mask=rows < n_blocks)
    codes = tl.where(has_nan[:, None], 0, codes).to(tl.uint8)
    tl.store(codes_ptr + offs, codes, mask=mask)
    tl.store(scales_ptr + rows, scale, mask=rows < n_blocks)


def int_quantize(blocks: torch.Tensor, bits: int, mode: int):
    """blocks [..., n_groups, group] fp32 → (codes, fp32 scales, uint8 zeros | fp32 minimums
    | None), as formats/fast.int_quantize (mode 0 symmetric, 1 zero point, 2 KIVI)."""
    blocks = blocks.contiguous()
    tiling = _tiling(blocks)
    if tiling is None:
        return None
    n_blocks, block, rows, width, grid = tiling
    dev = blocks.device
    codes = torch.empty(blocks.shape, dtype=torch.uint8, device=dev)
    scales = torch.empty(blocks.shape[:-1], dtype=torch.float32, device=dev)
    zero_dtype = torch.float32 if mode == 2 else torch.uint8
    zeros = torch.empty(blocks.shape[:-1], dtype=zero_dtype, device=dev)
    _int_quantize_kernel[grid](
        blocks,
        codes,
        scales,
        zeros,
        n_blocks,
        BLOCK=block,
        ROWS=rows,
        WIDTH=width,
        BITS=bits,
        MODE=mode,
        **NO_FMA,
    )
    return codes, scales, zeros if mode else None


@triton.jit
def _int_dequantize_kernel(
    codes_ptr,
    scales_ptr,
    zeros_ptr,
    out_ptr,
    n_blocks,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    WIDTH: tl.constexpr,
    BITS: tl.constexpr,
    MODE: tl.constexpr,
):
    """MODE 0: signed(code) · scale; 1: (code − zero) · scale; 2 (KIVI): code · scale + min,
    rounded twice as the reference does (the launch turns off FMA contraction)."""
    rows, mask, offs = _block_tile(n_blocks, BLOCK, ROWS, WIDTH)
    q = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.int32)
    in_range = rows < n_blocks
    scale = tl.load(scales_ptr + rows, mask=in_range, other=1.0)[:, None]
    if MODE == 0:
        half: tl.constexpr = 1 << (BITS - 1)
        out = tl.where(q >= half, q - 2 * half, q).to(tl.float32) * scale
    elif MODE == 1:
        zero = tl.load(zeros_ptr + rows, mask=in_range, other=0).to(tl.float32)[:, None]
        out = (q.to(tl.float32) - zero) * scale
    else:
        lo = tl.load(zeros_ptr + rows, mask=in_range, other=0.0)[:, None]
        out = q.to(tl.float32) * scale + lo
    tl.store(out_ptr + offs, out, mask=mask)


def int_dequantize(
    codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, bits: int
) -> torch.Tensor:
    """codes [..., n_groups, group] uint8 → fp32; zeros: None (symmetric), uint8 zero points
    or fp32 minimums (KIVI), as int_quantize returns them."""
    mode = 0 if zeros is None else 1 if zeros.dtype == torch.uint8 else 2
    codes = codes.contiguous()
    tiling = _tiling(codes)
    if tiling is None:
        return None
    n_blocks, block, rows, width, grid = tiling
    out = torch.empty(codes.shape, dtype=torch.float32, device=codes.device)
    scales = scales.float().contiguous()
    zeros = scales if zeros is None else zeros.contiguous()  # unread in mode 0
    _int_dequantize_kernel[grid](
        codes,
        scales,
        zeros,
        out,
        n_blocks,
        BLOCK=block,
        ROWS=rows,
        WIDTH=width,
        BITS=bits,
        MODE=mode,
        **NO_FMA,
    )
    return out


# The rest of formats/fast.py's interface, so codec.FAST_PATHS can hold this module for CUDA.


def scaled_encode(values: torch.Tensor, scale: float, et: Minifloat) -> torch.Tensor:
    return scaled_quantize(values, torch.tensor([scale], device=values.device), et)


def block_dequantize(codes: torch.Tensor, scale_values: torch.Tensor, post: float, et: Minifloat):
    return scaled_dequantize(codes, scale_values, torch.tensor([post], device=codes.device), et)


@triton.jit
def _finite_amax_kernel(x_ptr, out_ptr, n, SIZE: tl.constexpr):
    offs = tl.program_id(0) * SIZE + tl.arange(0, SIZE)
    a = tl.abs(tl.load(x_ptr + offs, mask=offs < n, other=0.0))
    a = tl.where((a != a) | (a == float("inf")), 0.0, a)
    tl.atomic_max(out_ptr, tl.max(a, axis=0))  # every value is >= 0: float order = int order


def finite_amax(x: torch.Tensor) -> torch.Tensor | None:
    """max |x| over finite values (0 if none), as a 0-d fp32 tensor: one pass (torch's
    isfinite / where / amax take four)."""
    if x.dtype != torch.float32:
        return None
    x = x.contiguous()
    out = torch.zeros((), dtype=torch.float32, device=x.device)
    size = 4096
    _finite_amax_kernel[(triton.cdiv(x.numel(), size),)](x, out, x.numel(), SIZE=size)
    return out


def pack_bits(codes: torch.Tensor, bits: int) -> None:
    return None  # formats/pack.py's torch ops run on the GPU


def unpack_bits(packed: torch.Tensor, bits: int) -> None:
    return None
