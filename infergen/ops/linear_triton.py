"""Weight-only quantized projections on the GPU: y = x · dequant(W)ᵀ + b in one Triton kernel.

x [tokens, in] fp32 / fp16 / bf16, W [out, in] held as codes and scales (the formats of
ops/linear_quantized.py and ops/linear_grouped.py), b [out] or None; y [tokens, out] in x's
dtype. One kernel (`_linear_kernel`) serves every format through tl.constexpr flags (a
TRITON_FORMATS row each): it tiles M×N×K, loads a [BLOCK_N, BLOCK_K] tile of codes and their
scales, dequantizes it in registers to fp32 — the same operations in the same order as the CPU
backend's reference dequantization, so every weight has the value `dequantized(w, fmt)` gives
it — casts it to x's dtype and accumulates `tl.dot` in fp32 (fp32 x: IEEE fp32 products, not
TF32). The fp32 weight is never materialized. Bias is added to the fp32 accumulator.

Bytes moved: the codes (1 byte a weight for int8 / fp8_e4m3 / q8_0, ½ for the 4-bit formats)
plus the scales (4 / 2 / 1 bytes per group of 32 or 16, per channel or per tensor), x and y;
FLOPs 2·tokens·in·out. Decode (few tokens) is bound by the weight bytes.

GPU layout (`prepare_triton`; every tensor row-major, output channel first):
  int8       codes int8 [N, K]; scales fp32 [N]
  fp8_e4m3   codes uint8 [N, K] (E4M3FN bytes); scales fp32 [1] (per tensor)
  q8_0       codes int8 [N, K]; scales fp16 d [N, K/32]
  q4_0       codes uint8 [N, K/2] (u); scales fp16 d [N, K/32]            w = d·(u − 8)
  q4_1       codes uint8 [N, K/2] (u); scales fp16 d, mins fp16 m [N, K/32]   w = d·u + m
  int4       codes uint8 [N, K/2] (u = q + 8); scales fp32 [N, K/32]      w = (u − 8)·s
  int4_asym  codes uint8 [N, K/2] (u); scales fp32, zeros uint8 [N, K/32]  w = (u − z)·s
  mxfp4      codes uint8 [N, K/2] (E2M1); scales uint8 E8M0 [N, K/32]     (OCP MX v1.0 §5)
  nvfp4      codes uint8 [N, K/2] (E2M1); scales uint8 E4M3 [N, K/16]; global_scale fp32 [1]
4-bit codes: input 2j in the low nibble of byte j, input 2j + 1 in the high nibble.

`prepare_triton` quantizes with the CPU backends' own quantizers (linear_quantized.
quantize_weight, GROUP_FORMATS[fmt].encode); `reference` is plain torch on the same layout
(through the CPU backends' dequantization). Triton is optional (`pip install
'infergen[triton]'`): without it this module still imports (prepare_triton and reference
work) and `linear_triton` raises. The CPU engine never imports this module: with
kernels="triton" the engine's quantized projections run it through the "<format>:triton" rows
of LINEAR_BACKENDS (ops/linear_triton_rows.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infergen.errors import ConfigError
from infergen.ops.triton_lang import jit, tl, triton
from infergen.registry import Registry


@dataclass(frozen=True)
class TritonFormat:
    """How the kernel reads one format (each field is a tl.constexpr of `_linear_kernel`)."""

    code: str  # "int8" (signed byte), "e4m3" (E4M3FN byte), "u4" / "e2m1" (nibbles)
    scales: str  # "tensor" (one), "channel" (one per output), "group" (per GROUP inputs)
    scale_code: str  # "float" (fp32 / fp16 values), "e8m0" or "e4m3" (one byte each)
    offset: str  # "none", "minus8" (u − 8), "zero" ((u − z)·s), "min" (d·u + m)
    group: int = 32  # inputs per scale ("group" scales)
    global_scale: bool = False  # a final fp32 factor for the whole weight (NVFP4)

    @property
    def packed(self) -> bool:
        return self.code in ("u4", "e2m1")


TRITON_FORMATS: Registry[TritonFormat] = Registry("Triton linear format")
TRITON_FORMATS.register("int8", TritonFormat("int8", "channel", "float", "none"))
TRITON_FORMATS.register("fp8_e4m3", TritonFormat("e4m3", "tensor", "float", "none"))
TRITON_FORMATS.register("q8_0", TritonFormat("int8", "group", "float", "none"))
TRITON_FORMATS.register("q4_0", TritonFormat("u4", "group", "float", "minus8"))
TRITON_FORMATS.register("q4_1", TritonFormat("u4", "group", "float", "min"))
TRITON_FORMATS.register("int4", TritonFormat("u4", "group", "float", "minus8"))
TRITON_FORMATS.register("int4_asym", TritonFormat("u4", "group", "float", "zero"))
TRITON_FORMATS.register("mxfp4", TritonFormat("e2m1", "group", "e8m0", "none"))
TRITON_FORMATS.register(
    "nvfp4", TritonFormat("e2m1", "group", "e4m3", "none", group=16, global_scale=True)
)


# ---------------------------------------------------------------------------------------------
# Layout: fp32 weight → tensors the kernel reads, and back (plain torch)


def _pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K] of values 0..15 → [N, K/2]: input 2j low nibble, 2j + 1 high."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()


def _unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1)


def prepare_triton(
    weight: torch.Tensor, fmt: str, device: torch.device | str | None = None
) -> dict[str, torch.Tensor]:
    """W [out, in] fp32 → the format's GPU layout (module docstring), on `device` (default:
    W's). Quantized on the CPU by the CPU backends' quantizers, so the values equal
    linear_quantized.dequantized / linear_grouped.dequantized(W, fmt) bit for bit."""
    layout = TRITON_FORMATS.get(fmt, where="prepare_triton")
    if weight.dim() != 2 or weight.dtype != torch.float32:
        shape = tuple(weight.shape)
        raise TypeError(f"prepare_triton expects a 2-D float32 weight, got {weight.dtype} {shape}")
    device = weight.device if device is None else device
    w = weight.detach().cpu().contiguous()
    if layout.code in ("int8", "e4m3") and layout.scales != "group":
        from infergen.ops.linear_quantized import quantize_weight

        codes, scales = quantize_weight(w, fmt)
        codes = codes.view(torch.int8) if layout.code == "int8" else codes
        scales = scales[:1] if layout.scales == "tensor" else scales
        prepared = {"codes": codes.contiguous(), "scales": scales.float().contiguous()}
    else:
        from infergen.ops.linear_grouped import GROUP_FORMATS

        if w.shape[1] % 32:
            raise ConfigError(
                f"weights {fmt!r} quantize groups of 32 inputs",
                found=f"{w.shape[1]} input features",
                expected="a multiple of 32",
            )
        prepared = grouped_layout(GROUP_FORMATS[fmt].encode(w), fmt)
    return {name: t.to(device) for name, t in prepared.items()}


def grouped_layout(g, fmt: str) -> dict[str, torch.Tensor]:
    """A group format's codes and header fields (linear_grouped.Grouped: what its encoder or
    `from_blocks` of GGUF blocks gives) → the GPU layout, on their device."""
    layout = TRITON_FORMATS.get(fmt, where="grouped_layout")
    codes = g.codes.view(torch.int8) if layout.code == "int8" else _pack_nibbles(g.codes)
    prepared = {"codes": codes.contiguous()}
    if layout.global_scale:  # NVFP4: E4M3 bytes of blocks 2i and 2i + 1 → [N, K/16]
        scales = torch.stack(g.fields, dim=-1).reshape(g.codes.shape[0], -1)
        prepared["scales"] = scales.contiguous()
        prepared["global_scale"] = torch.tensor([g.scalar], dtype=torch.float32)
    else:
        prepared["scales"] = g.fields[0].contiguous()
    if layout.offset in ("zero", "min"):
        prepared["zeros" if layout.offset == "zero" else "mins"] = g.fields[1].contiguous()
    return prepared


def dequantize_prepared(
    prepared: dict[str, torch.Tensor], fmt: str, device: torch.device | str | None = "cpu"
) -> torch.Tensor:
    """The fp32 weight [out, in] the layout stands for, computed on `device` (None: the
    layout's) by the CPU backends' own dequantization (linear_quantized._decode /
    GROUP_FORMATS[fmt].value)."""
    layout = TRITON_FORMATS.get(fmt, where="dequantize_prepared")
    t = {name: v if device is None else v.to(device) for name, v in prepared.items()}
    codes = t["codes"]
    if layout.code in ("int8", "e4m3") and layout.scales != "group":
        from infergen.ops.linear_quantized import CODE_FORMATS, _decode

        scales = t["scales"].expand(codes.shape[0])
        return _decode(codes.view(torch.uint8), scales, CODE_FORMATS[fmt])
    from infergen.ops.linear_grouped import GROUP_FORMATS, Grouped

    codes = codes.view(torch.uint8) if layout.code == "int8" else _unpack_nibbles(codes)
    if layout.global_scale:
        scales = t["scales"]
        g = Grouped(codes, [scales[:, 0::2], scales[:, 1::2]], t["global_scale"].item())
    else:
        extra = [t[name] for name in ("zeros", "mins") if name in t]
        g = Grouped(codes, [t["scales"], *extra])
    return GROUP_FORMATS[fmt].value(g)


def reference(
    x: torch.Tensor, prepared: dict[str, torch.Tensor], bias: torch.Tensor | None, fmt: str
) -> torch.Tensor:
    """The oracle: x [..., in] · dequant(W)ᵀ + b in float64, returned in x's dtype on x's
    device."""
    weight = dequantize_prepared(prepared, fmt).double()
    y = x.detach().cpu().double() @ weight.t()
    if bias is not None:
        y = y + bias.detach().cpu().double()
    return y.to(device=x.device, dtype=x.dtype)


# ---------------------------------------------------------------------------------------------
# The kernel


@jit
def _e4m3(b):
    """E4M3FN bytes (int32 0..255) → fp32: 2^(e−7)·1.m, subnormals m·2^−9, S.1111.111 NaN."""
    e = (b >> 3) & 0xF
    m = b & 0x7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    mag = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)
    mag = tl.where((b & 0x7F) == 0x7F, float("nan"), mag)
    return tl.where((b & 0x80) != 0, -mag, mag)


@jit
def _e2m1(c):
    """E2M1 nibbles (int32 0..15) → fp32: 0, ±0.5, 1, 1.5, 2, 3, 4, 6 (OCP MX v1.0 §5.3.3)."""
    e = (c >> 1) & 0x3
    m = c & 0x1
    normal = (((e + 126) << 23) | (m << 22)).to(tl.float32, bitcast=True)
    mag = tl.where(e == 0, m.to(tl.float32) * 0.5, normal)
    return tl.where((c & 0x8) != 0, -mag, mag)


@jit
def _scale_values(s, SCALE_CODE: tl.constexpr):
    if SCALE_CODE == "e8m0":  # 2^(e − 127) built in the exponent bits; e = 0 → 0 (the reference)
        return (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    elif SCALE_CODE == "e4m3":
        return _e4m3(s.to(tl.int32))
    else:
        return s.to(tl.float32)


@jit
def _weight_tile(
    codes_ptr,
    scales_ptr,
    offsets_ptr,
    cols_w,
    k0,
    N,
    K,
    stride_codes,
    stride_scales,
    CODE: tl.constexpr,
    SCALES: tl.constexpr,
    SCALE_CODE: tl.constexpr,
    OFFSET: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Rows cols_w, inputs k0 .. k0 + BLOCK_K of W, dequantized: fp32 [BLOCK_N, BLOCK_K]
    ("channel" / "tensor" scales are applied by the caller). Out-of-range codes read as 0."""
    in_n = (cols_w < N)[:, None]
    if CODE == "u4" or CODE == "e2m1":
        half = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        mask = in_n & (half[None, :] < K // 2)
        at = cols_w[:, None] * stride_codes + half[None, :]
        byte = tl.load(codes_ptr + at, mask=mask, other=0).to(tl.int32)
        q = tl.interleave(byte & 0xF, byte >> 4)  # [BLOCK_N, BLOCK_K]
    else:
        k = k0 + tl.arange(0, BLOCK_K)
        mask = in_n & (k[None, :] < K)
        q = tl.load(codes_ptr + cols_w[:, None] * stride_codes + k[None, :], mask=mask, other=0)
    if CODE == "e4m3":
        v = _e4m3(q.to(tl.int32))
    elif CODE == "e2m1":
        v = _e2m1(q)
    elif OFFSET == "minus8":
        v = (q - 8).to(tl.float32)
    else:
        v = q.to(tl.float32)
    if SCALES == "group":
        GROUPS: tl.constexpr = BLOCK_K // GROUP
        g = k0 // GROUP + tl.arange(0, GROUPS)
        gmask = in_n & (g[None, :] < K // GROUP)
        at = cols_w[:, None] * stride_scales + g[None, :]
        s = _scale_values(tl.load(scales_ptr + at, mask=gmask, other=0), SCALE_CODE)
        v3 = tl.reshape(v, (BLOCK_N, GROUPS, GROUP))
        if OFFSET == "zero":  # (u − z)·s
            z = tl.load(offsets_ptr + at, mask=gmask, other=0).to(tl.float32)
            v3 = v3 - z[:, :, None]
        w3 = v3 * s[:, :, None]
        if OFFSET == "min":  # d·u + m, rounded twice (the launch turns off FMA contraction)
            m = tl.load(offsets_ptr + at, mask=gmask, other=0).to(tl.float32)
            w3 = w3 + m[:, :, None]
        v = tl.reshape(w3, (BLOCK_N, BLOCK_K))
    return v


@jit
def _linear_kernel(
    x_ptr,  # [M, K] fp32 / fp16 / bf16, rows stride_xm apart
    codes_ptr,  # [N, K] or [N, K/2] bytes
    scales_ptr,  # [1], [N] or [N, K/GROUP]
    offsets_ptr,  # zeros uint8 / mins fp16 [N, K/GROUP], or unread
    global_ptr,  # fp32 [1], or unread
    bias_ptr,  # fp32 [N], or unread
    out_ptr,  # [M, N] in x's dtype, rows stride_om apart
    M,
    N,
    K,
    stride_xm,
    stride_om,
    stride_codes,
    stride_scales,
    CODE: tl.constexpr,
    SCALES: tl.constexpr,
    SCALE_CODE: tl.constexpr,
    OFFSET: tl.constexpr,
    GROUP: tl.constexpr,
    GLOBAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # tokens
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # output channels
    if SCALES == "channel":
        channel_scale = tl.load(scales_ptr + cols, mask=cols < N, other=0.0)[:, None]
    elif SCALES == "tensor":
        tensor_scale = tl.load(scales_ptr)
    if GLOBAL:
        global_scale = tl.load(global_ptr)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x_mask = (rows[:, None] < M) & (k[None, :] < K)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + k[None, :], mask=x_mask, other=0.0)
        w = _weight_tile(
            codes_ptr,
            scales_ptr,
            offsets_ptr,
            cols,
            k0,
            N,
            K,
            stride_codes,
            stride_scales,
            CODE,
            SCALES,
            SCALE_CODE,
            OFFSET,
            GROUP,
            BLOCK_N,
            BLOCK_K,
        )
        if SCALES == "channel":
            w = w * channel_scale
        elif SCALES == "tensor":
            w = w * tensor_scale
        if GLOBAL:
            w = w * global_scale
        acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0)[None, :]
    out_mask = (rows[:, None] < M) & (cols[None, :] < N)
    out = acc.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], out, mask=out_mask)


# ---------------------------------------------------------------------------------------------
# The launcher

ACTIVATION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# (max tokens, (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)): the first row whose token
# count covers M. Decode shapes stream W (narrow N tiles: more programs); prefill is compute.
TILES = (
    (16, (16, 32, 128, 4, 3)),
    (64, (32, 64, 64, 4, 3)),
    (None, (64, 64, 64, 4, 3)),
)
NO_FMA = {"enable_fp_fusion": False}  # d·u + m rounds twice, as the torch reference


def _tile(m: int) -> tuple[int, int, int, int, int]:
    return next(t for limit, t in TILES if limit is None or m <= limit)


def linear_triton(
    x: torch.Tensor,
    prepared: dict[str, torch.Tensor],
    bias: torch.Tensor | None,
    fmt: str,
    *,
    tile: tuple[int, int, int] | None = None,
    precision: str = "ieee",
) -> torch.Tensor:
    """y = x · dequant(W)ᵀ + b.

    x [..., in] fp32 / fp16 / bf16; prepared: `prepare_triton(W, fmt)` on x's device;
    bias fp32 [out] or None; tile (BLOCK_M, BLOCK_N, BLOCK_K): powers of two, BLOCK_M and
    BLOCK_N >= 16, BLOCK_K >= 32 (default: by token count, TILES); precision of fp32 dots:
    "ieee" (exact products) or "tf32". Returns y [..., out] in x's dtype.
    """
    if triton is None:
        raise RuntimeError("linear_triton needs Triton: pip install 'infergen[triton]'")
    layout = TRITON_FORMATS.get(fmt, where="linear_triton")
    codes = prepared["codes"]
    out_features = codes.shape[0]
    in_features = codes.shape[1] * (2 if layout.packed else 1)
    if x.shape[-1] != in_features:
        raise ValueError(f"x has {x.shape[-1]} input features, the weight {in_features}")
    if x.dtype not in ACTIVATION_DTYPES:
        raise TypeError(f"linear_triton expects x in {ACTIVATION_DTYPES}, got {x.dtype}")
    if any(t.device != x.device for t in prepared.values()):
        raise ValueError(f"prepared weight is not on x's device {x.device}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, in_features)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out = torch.empty(m, out_features, dtype=x.dtype, device=x.device)
    if m == 0:
        return out.reshape(*lead, out_features)
    block_m, block_n, block_k, warps, stages = _tile(m)
    if tile is not None:
        block_m, block_n, block_k = tile
    assert block_k % 32 == 0 and block_m >= 16 and block_n >= 16, tile
    scales = prepared["scales"]
    assert codes.is_contiguous() and scales.is_contiguous()
    offsets = prepared.get("zeros", prepared.get("mins", scales))
    global_scale = prepared.get("global_scale", scales)
    if bias is not None:
        assert bias.shape == (out_features,), bias.shape
        bias = bias.to(device=x.device, dtype=torch.float32).contiguous()
    grid = (triton.cdiv(out_features, block_n), triton.cdiv(m, block_m))
    _linear_kernel[grid](
        x2,
        codes,
        scales,
        offsets,
        global_scale,
        bias if bias is not None else scales,
        out,
        m,
        out_features,
        in_features,
        x2.stride(0),
        out.stride(0),
        codes.stride(0),
        scales.stride(0) if scales.dim() == 2 else 0,
        CODE=layout.code,
        SCALES=layout.scales,
        SCALE_CODE=layout.scale_code,
        OFFSET=layout.offset,
        GROUP=layout.group,
        GLOBAL=layout.global_scale,
        HAS_BIAS=bias is not None,
        PRECISION=precision if x.dtype == torch.float32 else "ieee",
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=warps,
        num_stages=stages,
        **NO_FMA,
    )
    return out.reshape(*lead, out_features)
