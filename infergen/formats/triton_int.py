"""Triton kernels for the integer formats (int8 / int4 / int2, symmetric, zero point, KIVI)
and the one-pass unpacking of 2- and 4-bit codes; re-exported by formats/triton_kernels.py
(codec.FAST_PATHS' CUDA row). Same operations, in the same order, as codec._int_quantize."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infergen.formats.triton_tiles import (
    INT32_LIMIT,
    RNE_MAGIC,
    div_rn,
    launch,
    load_codes,
    pack_factor,
    packed_shape,
    rne,
    store_codes,
    tile,
    tile_size,
    tiling,
)


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
    PACK: tl.constexpr,
    BITS: tl.constexpr,
    MODE: tl.constexpr,
):
    """MODE 0 symmetric, 1 asymmetric with an integer zero point, 2 KIVI (fp32 minimum);
    the operations of codec._int_quantize in the same order."""
    rows, mask, offs = tile(n_blocks, BLOCK, ROWS, WIDTH)
    v = tl.load(x_ptr + offs, mask=mask, other=0.0)  # [ROWS, WIDTH]
    in_range = rows < n_blocks
    has_nan = tl.max((v != v).to(tl.int32), axis=1) > 0
    if MODE == 0:
        qmax: tl.constexpr = (1 << (BITS - 1)) - 1
        scale = div_rn(tl.max(tl.abs(tl.where(v != v, 0.0, v)), axis=1), qmax)
    else:
        qmax: tl.constexpr = (1 << BITS) - 1
        lo = tl.min(tl.where(mask, v, float("inf")), axis=1)
        hi = tl.max(tl.where(mask, v, -float("inf")), axis=1)
        if MODE == 1:
            lo = tl.minimum(lo, 0.0)
            hi = tl.maximum(hi, 0.0)
        scale = div_rn(hi - lo, qmax)
    scale = tl.where(has_nan, float("nan"), scale)
    div = tl.where(scale == 0.0, 1.0, scale)
    if MODE == 0:
        q = tl.minimum(tl.maximum(rne(div_rn(v, div[:, None])), -qmax), qmax)
        codes = q.to(tl.int32) & ((1 << BITS) - 1)
    elif MODE == 1:
        z = tl.minimum(tl.maximum(rne(div_rn(-lo, div)), 0.0), qmax)
        q = (div_rn(v, div[:, None]) + RNE_MAGIC) - RNE_MAGIC + z[:, None]  # NaN stays NaN here
        q = tl.minimum(tl.maximum(tl.where(q != q, 0.0, q), 0.0), qmax)
        codes = q.to(tl.int32)
        tl.store(zeros_ptr + rows, tl.where(has_nan, 0, z.to(tl.int32)).to(tl.uint8), in_range)
    else:
        q = tl.minimum(tl.maximum(rne(div_rn(v - lo[:, None], div[:, None])), 0.0), qmax)
        codes = q.to(tl.int32)
        tl.store(zeros_ptr + rows, tl.where(has_nan, float("nan"), lo), mask=in_range)
    codes = tl.where(has_nan[:, None], 0, codes)
    store_codes(codes_ptr, codes, rows, n_blocks, BLOCK, ROWS, WIDTH, PACK)
    tl.store(scales_ptr + rows, scale, mask=in_range)


def int_quantize(blocks: torch.Tensor, bits: int, mode: int):
    """blocks [..., n_groups, group] fp32 → (codes (4-bit two a byte, 2-bit four a byte),
    fp32 scales, uint8 zeros | fp32 minimums | None), as formats/fast.int_quantize (mode 0
    symmetric, 1 zero point, 2 KIVI)."""
    blocks = blocks.contiguous()
    block = blocks.shape[-1]
    tiles = tiling(blocks.numel(), block)
    if tiles is None:
        return None
    n_blocks, rows, width, grid = tiles
    pack = pack_factor(bits, block)
    dev = blocks.device
    codes = torch.empty(packed_shape(blocks.shape, pack), dtype=torch.uint8, device=dev)
    scales = torch.empty(blocks.shape[:-1], dtype=torch.float32, device=dev)
    zero_dtype = torch.float32 if mode == 2 else torch.uint8
    zeros = torch.empty(blocks.shape[:-1], dtype=zero_dtype, device=dev)
    _int_quantize_kernel[grid](
        blocks, codes, scales, zeros, n_blocks, BLOCK=block, ROWS=rows, WIDTH=width,
        PACK=pack, BITS=bits, MODE=mode, **launch(),
    )  # fmt: skip
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
    PACK: tl.constexpr,
    BITS: tl.constexpr,
    MODE: tl.constexpr,
):
    """MODE 0: signed(code) · scale; 1: (code − zero) · scale; 2 (KIVI): code · scale + min,
    rounded twice as the reference does (the launch turns off FMA contraction); codes read
    PACK a byte."""
    rows, mask, offs = tile(n_blocks, BLOCK, ROWS, WIDTH)
    q = load_codes(codes_ptr, rows, n_blocks, BLOCK, ROWS, WIDTH, PACK)  # [ROWS, WIDTH]
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
    """codes [..., n_groups, group] uint8 (one a byte) → fp32; zeros: None (symmetric),
    uint8 zero points or fp32 minimums (KIVI), as int_quantize returns them."""
    out = _int_dequantize(codes, scales, zeros, bits, codes.shape[-1], 1)
    return None if out is None else out.reshape(codes.shape)


def int_dequantize_packed(
    packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, bits: int, block: int
) -> torch.Tensor | None:
    """As int_dequantize, from the packed 4- or 2-bit codes (formats/pack.py's layout, groups
    of `block` codes) without unpacking first → fp32 [n_groups, block]."""
    pack = pack_factor(bits, block)
    if pack == 1:
        return None
    return _int_dequantize(packed, scales, zeros, bits, block, pack)


def _int_dequantize(codes, scales, zeros, bits: int, block: int, pack: int):
    mode = 0 if zeros is None else 1 if zeros.dtype == torch.uint8 else 2
    tiles = tiling(codes.numel() * pack, block)
    if tiles is None:
        return None
    n_blocks, rows, width, grid = tiles
    out = torch.empty(n_blocks, block, dtype=torch.float32, device=codes.device)
    scales = scales.float().contiguous()
    zeros = scales if zeros is None else zeros.contiguous()  # unread in mode 0
    _int_dequantize_kernel[grid](
        codes.contiguous(), scales, zeros, out, n_blocks, BLOCK=block, ROWS=rows, WIDTH=width,
        PACK=pack, BITS=bits, MODE=mode, **launch(),
    )  # fmt: skip
    return out


@triton.jit
def _unpack_kernel(packed_ptr, out_ptr, n_bytes, SIZE: tl.constexpr, BITS: tl.constexpr):
    """SIZE packed bytes → SIZE · 8 / BITS codes (the layout of formats/pack.py)."""
    offs = tl.program_id(0) * SIZE + tl.arange(0, SIZE)
    b = tl.load(packed_ptr + offs, mask=offs < n_bytes, other=0).to(tl.int32)
    if BITS == 4:
        codes = tl.reshape(tl.join(b & 0xF, b >> 4), [2 * SIZE])
    else:  # [SIZE, 2 (p), 2 (q)]: element 4i + 2p + q at bits 2 (2p + q)
        even = tl.join(b & 3, (b >> 4) & 3)  # q = 0: p = 0, 1
        odd = tl.join((b >> 2) & 3, b >> 6)  # q = 1
        codes = tl.reshape(tl.join(even, odd), [4 * SIZE])
    per: tl.constexpr = 8 // BITS
    out = tl.program_id(0) * (SIZE * per) + tl.arange(0, SIZE * per)
    tl.store(out_ptr + out, codes.to(tl.uint8), mask=out < n_bytes * per)


def unpack_bits(packed: torch.Tensor, bits: int) -> torch.Tensor | None:
    """formats/pack.unpack_bits in one pass: bytes [..., m] → codes [..., m · 8 / bits]."""
    if bits not in (2, 4) or packed.dtype != torch.uint8 or packed.numel() * 4 >= INT32_LIMIT:
        return None
    packed = packed.contiguous()
    per = 8 // bits
    out = torch.empty(*packed.shape[:-1], packed.shape[-1] * per, dtype=torch.uint8,
                      device=packed.device)  # fmt: skip
    size = tile_size() // per
    grid = (max(1, triton.cdiv(packed.numel(), size)),)
    _unpack_kernel[grid](packed, out, packed.numel(), SIZE=size, BITS=bits, **launch())
    return out
