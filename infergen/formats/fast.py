"""Native fast paths of the float-format quantizers (kernels/quantize_f32.c): one pass per
block in C instead of a dozen tensor passes. Same signature and bit-identical results as the
reference quantizers in codec.py (tests/formats/test_fast.py); None when no C compiler."""

from __future__ import annotations

import torch

from infergen.formats.elements import ELEMENT_TYPES, Minifloat
from infergen.kernels.build import F, I, L, P, kernel

E4M3 = ELEMENT_TYPES.get("e4m3")
SOURCE = "quantize_f32"


def _elem_args(et: Minifloat) -> tuple:
    nan = et.nan_code if et.nan_code is not None else -1
    return (et.mbits, et.emin, et.bits, et.max_code, nan, et.max)


def mx_quantize(blocks: torch.Tensor, et: Minifloat, rule: str):
    fn = kernel("mx_quantize_f32", P, P, P, L, L, I, I, I, I, I, F, I, I, source=SOURCE)
    if fn is None:
        return None
    blocks = blocks.contiguous()
    n_blocks, block = blocks.numel() // blocks.shape[-1], blocks.shape[-1]
    codes = torch.empty(blocks.shape, dtype=torch.uint8)
    scales = torch.empty(blocks.shape[:-1], dtype=torch.uint8)
    fn(
        blocks.data_ptr(),
        codes.data_ptr(),
        scales.data_ptr(),
        n_blocks,
        block,
        *_elem_args(et),
        0 if rule == "floor" else 1,
        torch.get_num_threads(),
    )
    return codes, scales


def nvfp4_quantize(blocks: torch.Tensor, global_scale: torch.Tensor):
    fn = kernel("nvfp4_quantize_f32", P, P, P, L, F, P, I, source=SOURCE)
    if fn is None:
        return None
    blocks = blocks.contiguous()
    codes = torch.empty(*blocks.shape[:-1], 8, dtype=torch.uint8)  # packed as it encodes
    scales = torch.empty(blocks.shape[:-1], dtype=torch.uint8)
    table = E4M3.decode_table()
    fn(
        blocks.data_ptr(),
        codes.data_ptr(),
        scales.data_ptr(),
        blocks.numel() // 16,
        float(global_scale),
        table.data_ptr(),
        torch.get_num_threads(),
    )
    return codes, scales


def scaled_encode(values: torch.Tensor, scale: torch.Tensor | float, et: Minifloat):
    fn = kernel("scaled_encode_f32", P, P, L, F, I, I, I, I, I, F, I, source=SOURCE)
    if fn is None:
        return None
    values = values.contiguous()
    codes = torch.empty(values.shape, dtype=torch.uint8)
    fn(
        values.data_ptr(),
        codes.data_ptr(),
        values.numel(),
        float(scale),
        *_elem_args(et),
        torch.get_num_threads(),
    )
    return codes


def _decode_blocks(fn, codes: torch.Tensor, *scale_args) -> torch.Tensor:
    """Run a dequantize kernel fn(codes, *scale_args, out, n_blocks, block, threads)."""
    out = torch.empty(codes.shape, dtype=torch.float32)
    blocks = codes.numel() // codes.shape[-1]
    fn(
        codes.data_ptr(),
        *scale_args,
        out.data_ptr(),
        blocks,
        codes.shape[-1],
        torch.get_num_threads(),
    )
    return out


def mx_dequantize(codes: torch.Tensor, scales: torch.Tensor, et: Minifloat):
    """codes [..., n_blocks, block] uint8, scales [..., n_blocks] E8M0 → fp32 values."""
    fn = kernel("mx_dequantize_f32", P, P, P, P, L, L, I, source=SOURCE)
    if fn is None:
        return None
    scales = scales.contiguous()
    table = et.decode_table()
    return _decode_blocks(fn, codes.contiguous(), scales.data_ptr(), table.data_ptr())


def block_dequantize(
    codes: torch.Tensor, scale_values: torch.Tensor, post: torch.Tensor | float, et: Minifloat
):
    """codes [..., n_blocks, block] uint8 · fp32 scale_values [..., n_blocks] · post."""
    fn = kernel("block_dequantize_f32", P, P, F, P, P, L, L, I, source=SOURCE)
    if fn is None:
        return None
    scale_values = scale_values.float().contiguous()
    table = et.decode_table()
    return _decode_blocks(
        fn, codes.contiguous(), scale_values.data_ptr(), float(post), table.data_ptr()
    )


def fp4_dequantize(
    packed: torch.Tensor,
    scales: torch.Tensor,
    block: int,
    et: Minifloat,
    global_scale: torch.Tensor | float | None,
):
    """Packed 4-bit codes (two a byte, blocks of `block` along the last axis) → fp32
    [n_blocks, block], without unpacking first: NVFP4 (E4M3 scale codes · global_scale) or MX
    (global_scale None: E8M0 scale codes)."""
    fn = kernel("fp4_dequantize_f32", P, P, P, P, F, I, P, L, L, I, source=SOURCE)
    if fn is None or block % 16:
        return None
    packed, scales = packed.contiguous(), scales.contiguous()
    n_blocks = packed.numel() * 2 // block
    out = torch.empty(n_blocks, block, dtype=torch.float32)
    table, e4m3 = et.decode_table(), E4M3.decode_table()
    mode = 1 if global_scale is None else 0
    fn(
        packed.data_ptr(),
        scales.data_ptr(),
        table.data_ptr(),
        e4m3.data_ptr(),
        1.0 if global_scale is None else float(global_scale),
        mode,
        out.data_ptr(),
        n_blocks,
        block,
        torch.get_num_threads(),
    )
    return out


def finite_amax(x: torch.Tensor) -> torch.Tensor | None:
    """max |x| over finite values (0 if none), as a 0-d fp32 tensor."""
    fn = kernel("finite_amax_f32", P, L, P, I, source=SOURCE)
    if fn is None or x.dtype != torch.float32:
        return None
    x = x.contiguous()
    out = torch.zeros((), dtype=torch.float32)
    fn(x.data_ptr(), x.numel(), out.data_ptr(), torch.get_num_threads())
    return out


def int_quantize(blocks: torch.Tensor, bits: int, mode: int):
    """blocks [..., n_groups, group] → (codes, scales, zero points or offsets or None).
    mode 0 symmetric, 1 asymmetric with a uint8 zero point, 2 KIVI (fp32 minimum)."""
    fn = kernel("int_quantize_f32", P, P, P, P, P, L, L, I, I, I, source=SOURCE)
    if fn is None:
        return None
    blocks = blocks.contiguous()
    groups = blocks.shape[:-1]
    codes = torch.empty(blocks.shape, dtype=torch.uint8)
    scales = torch.empty(groups, dtype=torch.float32)
    zeros = torch.empty(groups, dtype=torch.uint8) if mode == 1 else None
    offsets = torch.empty(groups, dtype=torch.float32) if mode == 2 else None
    fn(
        blocks.data_ptr(),
        codes.data_ptr(),
        scales.data_ptr(),
        zeros.data_ptr() if zeros is not None else None,
        offsets.data_ptr() if offsets is not None else None,
        blocks.numel() // blocks.shape[-1],
        blocks.shape[-1],
        bits,
        mode,
        torch.get_num_threads(),
    )
    return codes, scales, zeros if mode == 1 else offsets


def int_dequantize(
    codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, bits: int
):
    """codes [n_groups, group] → fp32: symmetric (zeros None), with uint8 zero points, or
    with fp32 minimums (KIVI: code · scale + min)."""
    if zeros is not None and zeros.dtype == torch.float32:
        fn = kernel("kivi_dequantize_f32", P, P, P, P, L, L, I, source=SOURCE)
        if fn is None:
            return None
        codes, scales, zeros = codes.contiguous(), scales.float().contiguous(), zeros.contiguous()
        return _decode_blocks(fn, codes, scales.data_ptr(), zeros.data_ptr())
    fn = kernel("int_dequantize_f32", P, P, P, P, L, L, I, I, source=SOURCE)
    if fn is None:
        return None
    codes, scales = codes.contiguous(), scales.float().contiguous()
    zeros = zeros.contiguous() if zeros is not None else None
    out = torch.empty(codes.shape, dtype=torch.float32)
    fn(
        codes.data_ptr(),
        scales.data_ptr(),
        zeros.data_ptr() if zeros is not None else None,
        out.data_ptr(),
        codes.numel() // codes.shape[-1],
        codes.shape[-1],
        bits,
        torch.get_num_threads(),
    )
    return out


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor | None:
    """formats/pack.pack_bits in one pass (codes: uint8, last axis a multiple of 8 / bits)."""
    fn = kernel("pack_bits_u8", P, P, L, I, I, source=SOURCE)
    if fn is None or bits not in (2, 4) or codes.dtype != torch.uint8:
        return None
    codes = codes.contiguous()
    out = torch.empty(*codes.shape[:-1], codes.shape[-1] * bits // 8, dtype=torch.uint8)
    fn(codes.data_ptr(), out.data_ptr(), out.numel(), bits, torch.get_num_threads())
    return out


def unpack_bits(packed: torch.Tensor, bits: int) -> torch.Tensor | None:
    """formats/pack.unpack_bits in one pass."""
    fn = kernel("unpack_bits_u8", P, P, L, I, I, source=SOURCE)
    if fn is None or bits not in (2, 4) or packed.dtype != torch.uint8:
        return None
    packed = packed.contiguous()
    out = torch.empty(*packed.shape[:-1], packed.shape[-1] * 8 // bits, dtype=torch.uint8)
    fn(packed.data_ptr(), out.data_ptr(), packed.numel(), bits, torch.get_num_threads())
    return out
