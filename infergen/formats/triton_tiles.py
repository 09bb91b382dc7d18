"""Shared pieces of the Triton quantize / dequantize kernels (formats/triton_kernels.py,
formats/triton_int.py): the tiling, packed code stores and loads, exact fp32 helpers.

Per program: a tile of tile_size() values (4096), ROWS = tile / width blocks of `block` values
(MX 128 blocks of 32, NVFP4 256 of 16, int groups 128 of 32 .. 32 of 128), one contiguous
[ROWS, width] chunk; 4-bit codes are stored two a byte and 2-bit codes four a byte straight
from the code tile (tl.split), and read back packed (tl.join). Offsets are int32: `tiling`
answers None (the torch reference runs) from 2^31 values on.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from infergen.formats.elements import Minifloat

RNE_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2^23 (a global a kernel reads: constexpr)
# Values per program (a power of two; fp32: 16 KiB read) and warps per program (16 values a
# thread): the defaults; benchmarks/bench_formats_gpu.py --tile / --num-warps measure others.
TUNING = {"tile": 4096, "num_warps": 8}
MAX_TILE = 8192  # lanes per program; a block wider than this runs the torch reference
INT32_LIMIT = 2**31  # int32 offsets: larger tensors run the torch reference


def tile_size() -> int:
    return TUNING["tile"]


def launch() -> dict:
    """Every launch's options: no FMA contraction, so a·b + c rounds twice as in the torch
    reference (the interpreter has no such pass and ignores both options)."""
    return {"enable_fp_fusion": False, "num_warps": TUNING["num_warps"]}


@triton.jit
def div_rn(a, b):
    """a / b rounded to nearest even, as torch and C divide (Triton's `/` on fp32 compiles to
    the approximate div.full.f32 on NVIDIA GPUs: up to 2 ulp off, seen on an H200)."""
    return tl.div_rn(a, tl.zeros_like(a) + b)


@triton.jit
def pow2(e):
    """2^e as fp32 for integer tensors -126 <= e <= 127."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def floor_half(e):
    """floor(e / 2) for int32 tensors (Triton's // truncates toward zero)."""
    return tl.where(e >= 0, e // 2, -((-e + 1) // 2))


@triton.jit
def tile(n_blocks, BLOCK: tl.constexpr, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """This program's ROWS blocks of BLOCK values, each padded to WIDTH lanes (a power of two,
    as tl.arange needs): row ids, in-range mask, int32 offsets (one contiguous chunk)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, WIDTH)[None, :]
    mask = (rows[:, None] < n_blocks) & (cols < BLOCK)
    return rows, mask, rows[:, None] * BLOCK + cols


@triton.jit
def store_codes(
    ptr,
    codes,
    rows,
    n_blocks,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    WIDTH: tl.constexpr,
    PACK: tl.constexpr,
):
    """Store int32 codes [ROWS, WIDTH], PACK a byte (1, 2: element 2i in the low nibble, 4:
    element 4i+j at bits 2j), BLOCK // PACK bytes per block."""
    if PACK == 1:
        out = codes
    elif PACK == 2:
        lo, hi = tl.split(tl.reshape(codes, [ROWS, WIDTH // 2, 2]))
        out = lo | (hi << 4)
    else:  # [ROWS, WIDTH/4, 2 (p), 2 (q)]: element 4i + 2p + q
        q0, q1 = tl.split(tl.reshape(codes, [ROWS, WIDTH // 4, 2, 2]))
        c0, c2 = tl.split(q0)
        c1, c3 = tl.split(q1)
        out = c0 | (c1 << 2) | (c2 << 4) | (c3 << 6)
    cols = tl.arange(0, WIDTH // PACK)[None, :]
    mask = (rows[:, None] < n_blocks) & (cols < BLOCK // PACK)
    tl.store(ptr + rows[:, None] * (BLOCK // PACK) + cols, out.to(tl.uint8), mask=mask)


@triton.jit
def load_codes(
    ptr, rows, n_blocks, BLOCK: tl.constexpr, ROWS: tl.constexpr, WIDTH: tl.constexpr,
    PACK: tl.constexpr,
):  # fmt: skip
    """int32 codes [ROWS, WIDTH] of blocks stored BLOCK // PACK bytes each, in the layout
    store_codes writes (the inverse of its tl.split: tl.join)."""
    cols = tl.arange(0, WIDTH // PACK)[None, :]
    mask = (rows[:, None] < n_blocks) & (cols < BLOCK // PACK)
    b = tl.load(ptr + rows[:, None] * (BLOCK // PACK) + cols, mask=mask, other=0).to(tl.int32)
    if PACK == 1:
        codes = b
    elif PACK == 2:
        codes = tl.reshape(tl.join(b & 0xF, b >> 4), [ROWS, WIDTH])
    else:  # [ROWS, WIDTH/4, 2 (p), 2 (q)]: element 4i + 2p + q at bits 2 (2p + q)
        even = tl.join(b & 3, (b >> 4) & 3)  # q = 0: p = 0, 1
        odd = tl.join((b >> 2) & 3, (b >> 6) & 3)  # q = 1
        codes = tl.reshape(tl.join(even, odd), [ROWS, WIDTH])
    return codes


@triton.jit
def rne(y):
    """Round to nearest even for |y| < 2^22 (integer codes are far below); NaN → 0, as the
    reference zeroes NaN codes (e.g. Inf / Inf when a group holds an Inf)."""
    r = (y + RNE_MAGIC) - RNE_MAGIC
    return tl.where(r != r, 0.0, r)


def tiling(numel: int, block: int):
    """(n_blocks, rows per program, padded width, grid) for blocks of `block` values, or None
    (the torch reference runs) when a block is wider than MAX_TILE or offsets pass int32."""
    width = triton.next_power_of_2(block)
    if width > MAX_TILE or numel >= INT32_LIMIT or block < 1:
        return None
    n_blocks = numel // block
    rows = max(1, tile_size() // width)
    return n_blocks, rows, width, (max(1, triton.cdiv(n_blocks, rows)),)


def pack_factor(bits: int, block: int) -> int:
    """Codes a byte as the kernel stores them: 8 // bits for 2- and 4-bit codes in whole
    bytes per block, else 1 (one a byte; the codec packs)."""
    per = 8 // bits if bits in (2, 4) else 1
    return per if block % per == 0 else 1


def packed_shape(shape: torch.Size, pack: int) -> tuple[int, ...]:
    return (*shape[:-1], shape[-1] // pack)


def scalar(value: torch.Tensor | float, device: torch.device) -> torch.Tensor:
    """A 1-element fp32 device tensor (a tensor stays on the device: no host round trip)."""
    if isinstance(value, torch.Tensor):
        return value.reshape(1).float().to(device)
    return torch.full((1,), value, dtype=torch.float32, device=device)


@functools.cache
def device_table(et: Minifloat, device: torch.device) -> torch.Tensor:
    """et's fp32 decode table on `device`, copied once (a host-to-device copy from pageable
    memory per call would synchronize the stream every launch)."""
    return et.decode_table().to(device)
