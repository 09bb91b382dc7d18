"""RoPE + KV store in one Triton kernel, the `triton` row of ROPE_STORE_BACKENDS (issue 22;
ops/rope_kv_store.py has the op and its reference).

One launch per layer call, programs (token, block of heads): a q block rotates its heads of
the fused QKV output (read in place through its strides) by the token's row of the cos/sin
table (ops/rope.py: halves (x1, x2) → (x1·cos − x2·sin, x2·cos + x1·sin) in fp32, cast to the
input dtype) into q'; a KV block rotates its K heads the same way into k' and writes k' and
v at the token's cache slot:
- an engine-dtype cache (fp32 / bf16 / fp16, kv_protocol.ENGINE_DTYPE): the values, cast to
  the cache's dtype;
- the scaled FP8 E4M3 format (kv_format.py, "fp8_e4m3"): codes of (k' − k_shift) / k_scale
  and v / v_scale per KV head, clamped to ±max_code, rounded to nearest even — k' taken as
  rounded to the engine dtype and the division correctly rounded, so the codes are
  bit-identical to the format's own `store` of the k' returned (formats/triton_kernels.py's
  E4M3 encoder).
Partial rotary tables, other KV formats (block-quantized: KIVI, NVFP4), layouts with strided
head rows or non-contiguous caches take the torch row. Triton is optional: without it this
module imports and the kernel raises when called.
"""

from __future__ import annotations

import torch

from infergen.formats.elements import ELEMENT_TYPES
from infergen.kvcache.kv_format import KVFormat
from infergen.kvcache.kv_protocol import ENGINE_DTYPE, KVLayer
from infergen.ops.rope import RopeFn, RopeInputs, apply_rope
from infergen.ops.rope_kv_store import ROPE_STORE_BACKENDS, rope_kv_store
from infergen.ops.triton_lang import jit, tl, triton

if triton is not None:  # the formats' Triton helpers import Triton themselves
    from infergen.formats.triton_kernels import encode_minifloat
    from infergen.formats.triton_tiles import div_rn
else:
    div_rn = encode_minifloat = None
HEADS_PER_PROGRAM = 16  # most heads one program rotates (a power of two)
VALUE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
E4M3 = ELEMENT_TYPES.get("e4m3")
NO_FMA = {"enable_fp_fusion": False}  # the encoder's rounding steps stay separate roundings


@jit
def _rotate(src, rows, n_rows, row_stride, cols, cos, sin, HALF: tl.constexpr):
    """Head vectors `rows` (< n_rows) at src + row · row_stride → rotated halves in fp32."""
    mask = (rows < n_rows)[:, None] & (cols < HALF)[None, :]
    ptr = src + rows[:, None] * row_stride + cols[None, :]
    x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + HALF, mask=mask, other=0.0).to(tl.float32)
    return x1 * cos[None, :] - x2 * sin[None, :], x2 * cos[None, :] + x1 * sin[None, :], mask


@jit
def _e4m3(x, scale, CLAMP: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
          BITS: tl.constexpr, MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr,
          MAX: tl.constexpr):  # fmt: skip
    """E4M3 codes (uint8) of x / scale [rows, 1] clamped to ±CLAMP (NaN kept, as torch's
    clamp keeps it): kv_format.encode."""
    y = div_rn(x, scale)
    y = tl.where(y > CLAMP, CLAMP, tl.where(y < -CLAMP, -CLAMP, y))
    return encode_minifloat(y, MBITS, EMIN, BITS, MAX_CODE, NAN_CODE, MAX)


@jit
def _rope_kv_store_kernel(
    qk_ptr, v_ptr, q_out_ptr, k_out_ptr, k_cache_ptr, v_cache_ptr, pos_ptr, slot_ptr,
    table_ptr, k_scale_ptr, v_scale_ptr, k_shift_ptr, heads, kv_heads, q_blocks,
    qk_token_stride, qk_head_stride, v_token_stride, v_head_stride,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, SCALED: tl.constexpr,
    CLAMP: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, BITS: tl.constexpr,
    MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr, MAX: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < HALF
    cos = tl.load(table_ptr + pos * 2 * HALF + cols, mask=col_ok, other=0.0).to(tl.float32)
    sin = tl.load(table_ptr + pos * 2 * HALF + HALF + cols, mask=col_ok, other=0.0)
    sin = sin.to(tl.float32)
    src = qk_ptr + token * qk_token_stride
    if block < q_blocks:  # q heads [block · BLOCK_H, +BLOCK_H) → q' [tokens, heads, d]
        rows = block * BLOCK_H + tl.arange(0, BLOCK_H)
        y1, y2, mask = _rotate(src, rows, heads, qk_head_stride, cols, cos, sin, HALF)
        dst = q_out_ptr + (token * heads + rows[:, None]) * 2 * HALF + cols[None, :]
        tl.store(dst, y1.to(q_out_ptr.dtype.element_ty), mask=mask)
        tl.store(dst + HALF, y2.to(q_out_ptr.dtype.element_ty), mask=mask)
    else:  # KV heads: k' [tokens, kv_heads, d], and k', v at the token's cache slot
        rows = (block - q_blocks) * BLOCK_H + tl.arange(0, BLOCK_H)
        k_src = src + heads * qk_head_stride
        y1, y2, mask = _rotate(k_src, rows, kv_heads, qk_head_stride, cols, cos, sin, HALF)
        k1, k2 = y1.to(k_out_ptr.dtype.element_ty), y2.to(k_out_ptr.dtype.element_ty)
        dst = k_out_ptr + (token * kv_heads + rows[:, None]) * 2 * HALF + cols[None, :]
        tl.store(dst, k1, mask=mask)
        tl.store(dst + HALF, k2, mask=mask)
        v_src = v_ptr + token * v_token_stride + rows[:, None] * v_head_stride + cols[None, :]
        v1 = tl.load(v_src, mask=mask, other=0.0)
        v2 = tl.load(v_src + HALF, mask=mask, other=0.0)
        slot = tl.load(slot_ptr + token).to(tl.int64)
        entry = (slot * kv_heads + rows[:, None]) * 2 * HALF + cols[None, :]  # [rows, BLOCK_D]
        if SCALED:  # codes of (k' − shift) / k_scale and v / v_scale
            head_ok = rows < kv_heads
            k_scale = tl.load(k_scale_ptr + rows, mask=head_ok, other=1.0)[:, None]
            v_scale = tl.load(v_scale_ptr + rows, mask=head_ok, other=1.0)[:, None]
            shift = k_shift_ptr + rows[:, None] * 2 * HALF + cols[None, :]
            s1 = tl.load(shift, mask=mask, other=0.0)
            s2 = tl.load(shift + HALF, mask=mask, other=0.0)
            k1 = _e4m3(k1.to(tl.float32) - s1, k_scale, CLAMP, MBITS, EMIN, BITS, MAX_CODE,
                       NAN_CODE, MAX)  # fmt: skip
            k2 = _e4m3(k2.to(tl.float32) - s2, k_scale, CLAMP, MBITS, EMIN, BITS, MAX_CODE,
                       NAN_CODE, MAX)  # fmt: skip
            v1 = _e4m3(v1.to(tl.float32), v_scale, CLAMP, MBITS, EMIN, BITS, MAX_CODE,
                       NAN_CODE, MAX)  # fmt: skip
            v2 = _e4m3(v2.to(tl.float32), v_scale, CLAMP, MBITS, EMIN, BITS, MAX_CODE,
                       NAN_CODE, MAX)  # fmt: skip
        kind = k_cache_ptr.dtype.element_ty
        tl.store(k_cache_ptr + entry, k1.to(kind), mask=mask)
        tl.store(k_cache_ptr + entry + HALF, k2.to(kind), mask=mask)
        tl.store(v_cache_ptr + entry, v1.to(kind), mask=mask)
        tl.store(v_cache_ptr + entry + HALF, v2.to(kind), mask=mask)


def _scaled_e4m3(kv: KVLayer) -> bool | None:
    """How the kernel writes this layer's cache: False values, True scaled E4M3 codes, None
    not at all (the torch row)."""
    if kv.own_store is not None or not (kv.k.is_contiguous() and kv.v.is_contiguous()):
        return None
    if kv.fmt is ENGINE_DTYPE and kv.k.dtype in VALUE_DTYPES and kv.v.dtype == kv.k.dtype:
        return False
    codes = kv.k.dtype == kv.v.dtype == torch.float8_e4m3fn
    scaled = (kv.k_scale, kv.v_scale, kv.k_shift)
    if isinstance(kv.fmt, KVFormat) and kv.fmt.storage == torch.float8_e4m3fn and codes:
        if all(t is not None and t.dtype == torch.float32 for t in scaled):
            return True
    return None


@ROPE_STORE_BACKENDS.decorator("triton")
def rope_kv_store_triton(
    qk: torch.Tensor,  # [tokens, heads + kv_heads, d]
    v: torch.Tensor,  # [tokens, kv_heads, d]
    heads: int,
    rope: RopeInputs,
    kv: KVLayer,
    slot_mapping: torch.Tensor,  # [tokens] int64
    rotate: RopeFn = apply_rope,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ops/rope_kv_store.py's op in one kernel → (q' [tokens, heads, d], k' [tokens, kv_heads,
    d]), both contiguous; `rotate` is used only where the torch row runs instead."""
    if triton is None:
        raise RuntimeError("rope_kv_store_triton needs Triton: pip install 'infergen[triton]'")
    tokens, rows, dim = qk.shape
    kv_heads = rows - heads
    scaled = _scaled_e4m3(kv)
    full_rotary = rope.cache.shape[-1] == dim and dim % 2 == 0
    if scaled is None or not full_rotary or qk.stride(2) != 1 or v.stride(2) != 1:
        return rope_kv_store(qk, v, heads, rope, kv, slot_mapping, rotate)
    assert v.shape == (tokens, kv_heads, dim), f"v {tuple(v.shape)} for qk {tuple(qk.shape)}"
    assert kv.k.shape[-2:] == (kv_heads, dim), f"cache pages {tuple(kv.k.shape)}"
    assert slot_mapping.shape == (tokens,) and rope.positions.shape == (tokens,)
    q_out = torch.empty(tokens, heads, dim, dtype=qk.dtype, device=qk.device)
    k_out = torch.empty(tokens, kv_heads, dim, dtype=qk.dtype, device=qk.device)
    if not tokens:
        return q_out, k_out
    block_h = min(HEADS_PER_PROGRAM, triton.next_power_of_2(max(heads, kv_heads)))
    q_blocks = triton.cdiv(heads, block_h)
    k_cache, v_cache = kv.k, kv.v
    k_scale = v_scale = k_shift = k_out  # unread without SCALED
    if scaled:
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
        k_scale, v_scale = kv.k_scale.contiguous(), kv.v_scale.contiguous()
        k_shift = kv.k_shift.contiguous()
    clamp = kv.fmt.max_code if scaled else 0.0
    _rope_kv_store_kernel[(tokens, q_blocks + triton.cdiv(kv_heads, block_h))](
        qk, v, q_out, k_out, k_cache, v_cache, rope.positions.contiguous(),
        slot_mapping.contiguous(), rope.cache.contiguous(), k_scale, v_scale, k_shift, heads,
        kv_heads, q_blocks, qk.stride(0), qk.stride(1), v.stride(0), v.stride(1),
        HALF=dim // 2, BLOCK_H=block_h, BLOCK_D=triton.next_power_of_2(dim // 2),
        SCALED=bool(scaled), CLAMP=float(clamp), MBITS=E4M3.mbits, EMIN=E4M3.emin,
        BITS=E4M3.bits, MAX_CODE=E4M3.max_code, NAN_CODE=E4M3.nan_code, MAX=E4M3.max, **NO_FMA,
    )  # fmt: skip
    return q_out, k_out
