"""Triton kernels for MX, NVFP4, FP8 and integer quantize and dequantize
(GPU; tested on the CPU with TRITON_INTERPRET=1).

The same arithmetic as formats/codec.py and kernels/quantize_f32.c, in bit operations:
floor(log2 a) from the fp32 exponent field, powers of two built in the exponent bits, and
round-to-nearest-even by the 1.5·2^23 magic number (exact for |y| < 2^22; element mantissas
are below 2^4). Bit-identical to the reference in the interpreter (tests/formats/
test_triton.py); benchmarks/device_check.sh runs the same tests compiled for a GPU (the
previous kernels passed them on an H200; this tiling has not yet run there). Triton is
optional: `pip install 'infergen[triton]'`.

What a program does (the tiling is in formats/triton_tiles.py, the integer formats in
formats/triton_int.py): one tile of TILE = 4096 fp32 values, 8 warps (16 values a thread),
ROWS = TILE / block blocks (MX 128 blocks of 32, NVFP4 256 of 16, int groups 128 of 32 .. 32 of
128) loaded as one contiguous [ROWS, block] chunk; the block amax is a reduction along the
tile's last axis, the block's scale one value per row, its codes encoded in registers and stored
as whole bytes: 4-bit codes two a byte, 2-bit codes four a byte, packed in the kernel
(tl.split), and the FP4 dequantize reads the packed bytes (tl.join). The encode uses no
division, log2 or float-to-int conversion (see encode_minifloat); the per-element divisions that
remain (FP8 per tensor, NVFP4, int) are the reference's own `x / scale`, kept for bit-exactness.
Scales stay device tensors (no `.item()` round trip between the amax and the encode pass; decode
tables copied to the device once); offsets are int32 (from 2^31 values on a launcher answers
None: the torch reference runs).

Bytes per fp32 value, read + written (a device copy moves 8; benchmarks/bench_formats_gpu.py
counts the 4 input bytes of both, so a kernel at copy's bandwidth shows 8 / bytes of copy):
MXFP8 / FP6 quantize 4 + 1 + 1/32 (ceiling ~160 % of copy), MXFP4 4 + 1/2 + 1/32 (~175 %),
NVFP4 4 (amax pass) + 4 + 1/2 + 1/16 (~93 %), FP8 per tensor 4 (amax) + 4 + 1 (~89 %), int8
4 + 1 + 1/8 (~155 %); dequantize the mirror, reading packed codes (FP4, int4, int2).

The previous kernels (benchmarks/results/formats_gpu.jsonl, H200, 64M values: copy 2078 GB/s
of input) ran one 512-value tile per program (MX) or 1024 (FP8), and reached 90-95 % of copy
for MXFP8 / FP6 (already ~60 % of copy's bandwidth: bound by the encode's instructions, not
HBM) but 22-44 % for FP8 per tensor, MXFP4, NVFP4, int4 and int2, whose time went to what ran
around the kernel: torch pack_bits / unpack_bits (4-8 extra passes over byte tensors), a
`.item()` sync plus a host-to-device copy per call (and per decode table), and 16K same-
address float atomics in the amax (now a grid-stride pass, at most 1024 atomics). Expected
now (not yet measured: no GPU was lent to this change; run benchmarks/device_check.sh):
>= 70 % of copy for every format, ~100-150 % for the one-pass MX / int / FP4 ones (the larger
tiles and the cheaper encode may lift MXFP8 / FP6 above their 95 %), and 70-85 % for FP8
per tensor and NVFP4 quantize, the two closest to their ceiling (two reads of the input, a
correctly rounded division per value). One figure on record is unexplained: MXFP8 E5M2 and
FP8 E5M2 quantize ran at 36 % / 22 % where E4M3, the same kernels with other constants, ran
at 95 % / 29 %; the new run will say whether that persists.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infergen.formats.elements import ELEMENT_TYPES, Minifloat

# re-exported: the integer rows of formats/fast.py's interface (codec.FAST_PATHS)
from infergen.formats.triton_int import (  # noqa: F401
    int_dequantize,
    int_dequantize_packed,
    int_quantize,
    unpack_bits,
)
from infergen.formats.triton_tiles import (
    INT32_LIMIT,
    RNE_MAGIC,
    device_table,
    div_rn,
    floor_half,
    launch,
    load_codes,
    pack_factor,
    packed_shape,
    pow2,
    scalar,
    store_codes,
    tile,
    tile_size,
    tiling,
)

AMAX_PROGRAMS = 1024  # finite_amax: at most this many programs (and atomics), grid-stride
E4M3 = ELEMENT_TYPES.get("e4m3")
RNE_MAGIC_BITS = tl.constexpr(0x4B400000)  # the fp32 bits of RNE_MAGIC


@triton.jit
def encode_minifloat(
    v,
    MBITS: tl.constexpr,
    EMIN: tl.constexpr,
    BITS: tl.constexpr,
    MAX_CODE: tl.constexpr,
    NAN_CODE: tl.constexpr,
    MAX: tl.constexpr,
):
    """fp32 → minifloat codes (int32): RNE, saturating, NaN kept where the type has a code.
    a's binade e (clamped to the subnormal one) from its exponent field; y = a · 2^(MBITS - e)
    is exact and below 2^(MBITS + 1), and adding 1.5·2^23 rounds it to an integer held in the
    low mantissa bits (no float-to-int conversion): code = ((e - EMIN) << MBITS) + round(y),
    where a carry past the mantissa moves to the next binade as it should."""
    sign = (v.to(tl.int32, bitcast=True) >> (32 - BITS)) & (1 << (BITS - 1))  # bit 31
    a = tl.minimum(tl.abs(v), MAX)  # a >= 0: its exponent field is bits 23..30
    e = tl.maximum((a.to(tl.int32, bitcast=True) >> 23) - 127, EMIN)
    y = a * ((MBITS + 127 - e) << 23).to(tl.float32, bitcast=True)
    m = (y + RNE_MAGIC).to(tl.int32, bitcast=True) - RNE_MAGIC_BITS
    code = tl.minimum(((e - EMIN) << MBITS) + m, MAX_CODE) | sign
    nan_code = (sign | NAN_CODE) if NAN_CODE >= 0 else 0
    return tl.where(v != v, nan_code, code)


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
    PACK: tl.constexpr,
    MBITS: tl.constexpr,
    EMIN: tl.constexpr,
    BITS: tl.constexpr,
    MAX_CODE: tl.constexpr,
    NAN_CODE: tl.constexpr,
    MAX: tl.constexpr,
    EMAX: tl.constexpr,
    RCEIL: tl.constexpr,
):
    rows, mask, offs = tile(n_blocks, BLOCK, ROWS, BLOCK)
    v = tl.load(x_ptr + offs, mask=mask, other=0.0)  # [ROWS, BLOCK]
    bad, amax = _block_amax(v)  # [ROWS]
    if RCEIL:
        r = div_rn(amax, MAX)
        rbits = r.to(tl.int32, bitcast=True)
        rexp = (rbits >> 23) & 0xFF
        mant = rbits & 0x7FFFFF
        e = tl.where(
            rexp == 0, tl.where(mant > (1 << 22), -126, -127), rexp - 127 + (mant != 0).to(tl.int32)
        )
    else:
        e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127 - EMAX
    e = tl.where(amax == 0.0, -127, e)
    e = tl.minimum(tl.maximum(e, -127), 127)
    neg = -e
    half = floor_half(neg)
    scaled = v * pow2(half)[:, None] * pow2(neg - half)[:, None]
    codes = encode_minifloat(scaled, MBITS, EMIN, BITS, MAX_CODE, NAN_CODE, MAX)
    codes = tl.where(bad[:, None], 0, codes)
    store_codes(codes_ptr, codes, rows, n_blocks, BLOCK, ROWS, BLOCK, PACK)
    scale = tl.where(bad, 255, e + 127).to(tl.uint8)
    tl.store(scales_ptr + rows, scale, mask=rows < n_blocks)


@triton.jit
def _block_dequantize_kernel(
    codes_ptr,
    scales_ptr,
    table_ptr,
    e4m3_ptr,
    post_ptr,
    out_ptr,
    n_blocks,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    WIDTH: tl.constexpr,
    PACK: tl.constexpr,
    SCALE: tl.constexpr,
):
    """out = table[code] scaled per block: SCALE 0 by 2^(E8M0 - 127) (0xFF: NaN), 1 by
    e4m3[scale code] · post[0] (NVFP4), 2 by the fp32 scale · post[0] (FP8, NVFP4 values)."""
    rows, mask, offs = tile(n_blocks, BLOCK, ROWS, WIDTH)
    codes = load_codes(codes_ptr, rows, n_blocks, BLOCK, ROWS, WIDTH, PACK)
    values = tl.load(table_ptr + codes, mask=mask, other=0.0)
    in_range = rows < n_blocks
    if SCALE == 0:
        s = tl.load(scales_ptr + rows, mask=in_range, other=127).to(tl.int32)
        e = s - 127
        half = floor_half(e)
        out = values * pow2(half)[:, None] * pow2(e - half)[:, None]
        out = tl.where((s == 255)[:, None], float("nan"), out)
    else:
        if SCALE == 1:
            s = tl.load(scales_ptr + rows, mask=in_range, other=0).to(tl.int32)
            scale = tl.load(e4m3_ptr + s)
        else:
            scale = tl.load(scales_ptr + rows, mask=in_range, other=1.0)
        out = values * scale[:, None] * tl.load(post_ptr)
    tl.store(out_ptr + offs, out, mask=mask)


@triton.jit
def _nvfp4_quantize_kernel(
    x_ptr, codes_ptr, scales_ptr, global_ptr, e4m3_ptr, n_blocks, ROWS: tl.constexpr,
    PACK: tl.constexpr,
):  # fmt: skip
    rows, mask, offs = tile(n_blocks, 16, ROWS, 16)
    v = tl.load(x_ptr + offs, mask=mask, other=0.0)  # [ROWS, 16]
    g = tl.load(global_ptr)
    bad, amax = _block_amax(v)
    amax = tl.where(bad, 0.0, amax)
    s = encode_minifloat(
        div_rn(div_rn(amax, 6.0), g), 3, -6, 8, 0x7E, 0x7F, 448.0
    )  # E4M3 block scale
    sval = tl.load(e4m3_ptr + s)
    divisor = sval * g
    zero = sval == 0.0
    codes = encode_minifloat(
        div_rn(v, tl.where(zero, 1.0, divisor)[:, None]), 1, 0, 4, 0x7, -1, 6.0
    )
    codes = tl.where((zero | bad)[:, None], 0, codes)
    store_codes(codes_ptr, codes, rows, n_blocks, 16, ROWS, 16, PACK)
    tl.store(scales_ptr + rows, tl.where(bad, 0x7F, s).to(tl.uint8), mask=rows < n_blocks)


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
    """FP8 per tensor: codes = encode(x / scale), SIZE values per program."""
    offs = tl.program_id(0) * SIZE + tl.arange(0, SIZE)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    codes = encode_minifloat(
        div_rn(v, tl.load(scale_ptr)), MBITS, EMIN, BITS, MAX_CODE, NAN_CODE, MAX
    )
    tl.store(codes_ptr + offs, codes.to(tl.uint8), mask=offs < n)


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
    """blocks [..., n_blocks, B] fp32 → (codes uint8 [..., n_blocks, B] (FP4: two a byte,
    [..., n_blocks, B / 2]), E8M0 scales [..., n_blocks]); None where it does not tile."""
    blocks = blocks.contiguous()
    block = blocks.shape[-1]
    tiles = tiling(blocks.numel(), block)
    if tiles is None or block != triton.next_power_of_2(block):
        return None
    n_blocks, rows, _, grid = tiles
    pack = pack_factor(et.bits, block)
    dev = blocks.device
    codes = torch.empty(packed_shape(blocks.shape, pack), dtype=torch.uint8, device=dev)
    scales = torch.empty(blocks.shape[:-1], dtype=torch.uint8, device=dev)
    _mx_quantize_kernel[grid](
        blocks, codes, scales, n_blocks, BLOCK=block, ROWS=rows, PACK=pack,
        EMAX=et.emax, RCEIL=rule == "rceil", **_elem(et), **launch(),
    )  # fmt: skip
    return codes, scales


def _block_dequantize(codes, scales, et: Minifloat, post, n_values: int, block: int, pack, mode):
    """The launch of _block_dequantize_kernel: fp32 [n_blocks, block], or None."""
    tiles = tiling(n_values, block)
    if tiles is None:
        return None
    n_blocks, rows, width, grid = tiles
    dev = codes.device
    out = torch.empty(n_blocks, block, dtype=torch.float32, device=dev)
    tables = device_table(et, dev), device_table(E4M3, dev)
    _block_dequantize_kernel[grid](
        codes.contiguous(), scales.contiguous(), *tables, scalar(post, dev), out, n_blocks,
        BLOCK=block, ROWS=rows, WIDTH=width, PACK=pack, SCALE=mode, **launch(),
    )  # fmt: skip
    return out


def mx_dequantize(codes: torch.Tensor, scales: torch.Tensor, et: Minifloat) -> torch.Tensor:
    """codes [..., n_blocks, B] uint8 (one a byte) + E8M0 scales → fp32 [..., n_blocks, B]."""
    block = codes.shape[-1]
    out = _block_dequantize(codes, scales, et, 1.0, codes.numel(), block, 1, mode=0)
    return None if out is None else out.reshape(codes.shape)


def fp4_dequantize(
    packed: torch.Tensor,
    scales: torch.Tensor,
    block: int,
    et: Minifloat,
    global_scale: torch.Tensor | float | None,
):
    """Packed 4-bit codes (two a byte, blocks of `block`) → fp32 [n_blocks, block], read
    packed: NVFP4 (E4M3 scale codes · global_scale) or MX (global_scale None: E8M0 codes)."""
    if block % 2:
        return None
    mode = 0 if global_scale is None else 1
    post = 1.0 if global_scale is None else global_scale
    return _block_dequantize(packed, scales, et, post, packed.numel() * 2, block, 2, mode)


def nvfp4_quantize(blocks: torch.Tensor, global_scale: torch.Tensor):
    """blocks [..., n_blocks, 16] fp32, global scale (0-d fp32) → (codes two a byte
    [..., n_blocks, 8], E4M3 scale bytes [..., n_blocks])."""
    blocks = blocks.contiguous()
    tiles = tiling(blocks.numel(), 16)
    if tiles is None or blocks.shape[-1] != 16:
        return None
    n_blocks, rows, _, grid = tiles
    dev = blocks.device
    codes = torch.empty(packed_shape(blocks.shape, 2), dtype=torch.uint8, device=dev)
    scales = torch.empty(blocks.shape[:-1], dtype=torch.uint8, device=dev)
    table = device_table(E4M3, dev)
    g = scalar(global_scale, dev)
    _nvfp4_quantize_kernel[grid](
        blocks, codes, scales, g, table, n_blocks, ROWS=rows, PACK=2, **launch()
    )
    return codes, scales


def scaled_dequantize(
    codes: torch.Tensor,
    scale_values: torch.Tensor,
    post: torch.Tensor | float,
    et: Minifloat,
) -> torch.Tensor:
    """codes [n_blocks, block] → table[code] · scale_values[block] · post (fp32)."""
    shape = codes.shape
    codes = codes.contiguous()
    if scale_values.numel() == 1:  # one scale (FP8 per tensor): rows of a power-of-two width
        width = codes.numel() & -codes.numel()  # largest power of two dividing numel
        codes = codes.reshape(-1, min(width, tile_size()))
        scale_values = scale_values.reshape(1).expand(codes.shape[0])
    scale_values = scale_values.float().contiguous()
    block = codes.shape[-1]
    out = _block_dequantize(codes, scale_values, et, post, codes.numel(), block, 1, mode=2)
    return None if out is None else out.reshape(shape)


def scaled_quantize(x: torch.Tensor, scale: torch.Tensor, et: Minifloat) -> torch.Tensor:
    """FP8 per-tensor codes of x / scale (scale: 1-element fp32)."""
    x = x.contiguous()
    if x.numel() >= INT32_LIMIT:
        return None
    codes = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    grid = (max(1, triton.cdiv(x.numel(), tile_size())),)
    _scaled_quantize_kernel[grid](
        x, codes, scalar(scale, x.device), x.numel(), SIZE=tile_size(), **_elem(et), **launch()
    )
    return codes


def pack_bits(codes: torch.Tensor, bits: int) -> None:
    return None  # the quantize kernels pack as they encode; formats/pack.py does the rest


# The rest of formats/fast.py's interface, so codec.FAST_PATHS can hold this module for CUDA.


def scaled_encode(values: torch.Tensor, scale: torch.Tensor | float, et: Minifloat):
    return scaled_quantize(values, scalar(scale, values.device), et)


def block_dequantize(
    codes: torch.Tensor, scale_values: torch.Tensor, post: torch.Tensor | float, et: Minifloat
):
    return scaled_dequantize(codes, scale_values, post, et)


@triton.jit
def _finite_amax_kernel(x_ptr, out_ptr, n, iters, SIZE: tl.constexpr):
    """Grid-stride: program p reads tiles p, p + P, ...; one atomic per program."""
    step = tl.num_programs(0) * SIZE
    offs = tl.program_id(0) * SIZE + tl.arange(0, SIZE)
    best = tl.zeros([SIZE], dtype=tl.float32)
    for _ in range(iters):
        a = tl.abs(tl.load(x_ptr + offs, mask=offs < n, other=0.0))
        best = tl.maximum(best, tl.where((a != a) | (a == float("inf")), 0.0, a))
        offs += step
    tl.atomic_max(out_ptr, tl.max(best, axis=0))  # every value is >= 0: float order = int order


def finite_amax(x: torch.Tensor) -> torch.Tensor | None:
    """max |x| over finite values (0 if none), as a 0-d fp32 tensor: one pass (torch's
    isfinite / where / amax take four)."""
    if x.dtype != torch.float32 or x.numel() + tile_size() * AMAX_PROGRAMS >= INT32_LIMIT:
        return None
    x = x.contiguous()
    out = torch.zeros((), dtype=torch.float32, device=x.device)
    tiles = max(1, triton.cdiv(x.numel(), tile_size()))
    programs = min(tiles, AMAX_PROGRAMS)
    iters = triton.cdiv(tiles, programs)
    _finite_amax_kernel[(programs,)](x, out, x.numel(), iters, SIZE=tile_size(), **launch())
    return out
