"""KV cache formats: the KV_FORMATS rows, every one a kv_protocol.KVCacheFormat; here the
scaled element formats (the block-quantized ones are kv_blocked.py's).

A format with a scale stores codes = saturate(x / scale) in its element type, one static fp32
scale per (layer, K or V, KV head), and every reader sees codes · scale. The scales come from
calibration at engine start (kvcache/calibrate.py): the largest |K| / |V| each head produced
on calibration text, over the format's largest code. Fewer bytes per element means more
tokens in the same KV memory: `PagedKVCache` sizes its pool by the format's element bytes.

Keys are stored smoothed (as SageAttention does): minus their per-channel mean over the
calibration text, a static [layers, kv_heads, head_dim] shift. Softmax is invariant to adding
q·shift to every score of a query, so attention over the shifted keys is exactly attention
over the keys — while the codes now carry the keys' variation instead of their large
per-channel offsets, so FP8's relative rounding costs less: on the default model the KL to
the fp32 cache drops from 0.0101 to 0.0063 nats per token (unsmoothed, the keys' rounding
was nine tenths of it: 0.0093 with only K in FP8, 0.0010 with only V).

Prefill attention reads the new tokens' K / V through the same codes as later steps read
them from the cache, so chunked prefill, prefix-cache hits and preemption stay equal to a
cold run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infergen.config import ModelConfig
from infergen.kvcache.kv_blocked import BlockedKVFormat, MinMaxCodec, NVFP4Codec
from infergen.kvcache.kv_protocol import (
    ENGINE_DTYPE,
    CacheLayout,
    EngineDtype,
    KVCacheFormat,
    KVLayer,
    KVPool,
    NativeCache,
    PagedPool,
    check_per_head,
    gather_head_blocks,
    gather_slots,
    write_slots,
)
from infergen.registry import Registry


@dataclass(frozen=True)
class KVFormat(EngineDtype):
    """A scaled element format: the pool holds codes of (x − shift) / scale in `storage`,
    one fp32 scale per (layer, K/V, KV head) and the keys' shift per (layer, KV head,
    channel) (the module docstring)."""

    name: str
    storage: torch.dtype  # the pool's element type
    max_code: float  # largest code magnitude: scale = amax / max_code
    description: str
    calibrate = True

    @property
    def element_bytes(self) -> int:
        return torch.empty((), dtype=self.storage).element_size()

    def check(self, model: ModelConfig, windowed: bool, recurrent: bool) -> None:
        check_per_head(self.name, model, recurrent)

    def scales_for(self, amax: torch.Tensor) -> torch.Tensor:
        scales = amax / self.max_code
        return torch.where(scales > 0, scales, torch.ones_like(scales))  # all-zero head: any

    def bytes_per_token(self, model: ModelConfig, dtype_bytes: int, block_size: int) -> float:
        return model.kv_bytes_per_token(self.element_bytes)

    def allocate(self, layout: CacheLayout) -> KVPool:
        return PagedPool(self, layout, self.storage, scaled=True)

    def store(self, kv: KVLayer, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        k, v = encode(k, kv.k_scale, self, kv.k_shift), encode(v, kv.v_scale, self)
        write_slots(kv.k, kv.v, k, v, slots)

    def read(self, kv: KVLayer, slots: torch.Tensor, dtype: torch.dtype):
        keys = gather_slots(kv.k.view(-1, *kv.k.shape[2:]), slots)
        values = gather_slots(kv.v.view(-1, *kv.v.shape[2:]), slots)
        return decode(keys, kv.k_scale, dtype), decode(values, kv.v_scale, dtype)

    def read_new(self, kv: KVLayer, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype):
        k, v = encode(k, kv.k_scale, self, kv.k_shift), encode(v, kv.v_scale, self)
        return decode(k, kv.k_scale, dtype), decode(v, kv.v_scale, dtype)

    def read_blocks(self, kv: KVLayer, ids: torch.Tensor, dtype: torch.dtype):
        def decoded(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            return (codes.float() * scale.view(1, -1, 1, 1, 1)).to(dtype)  # [b, kvh, w, bs, d]

        keys, values = gather_head_blocks(kv.k, ids), gather_head_blocks(kv.v, ids)
        return decoded(keys, kv.k_scale), decoded(values, kv.v_scale)

    def native_cache(self, kv: KVLayer) -> NativeCache | None:
        if kv.k.dtype != torch.float8_e4m3fn:
            return None
        return NativeCache("e4m3", (kv.k_scale.data_ptr(), kv.v_scale.data_ptr()))

    def reference(self, kv: KVLayer, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype):
        return self.read_new(kv, k, v, dtype)


KV_FORMATS: Registry[KVCacheFormat] = Registry("KV cache format")
KV_FORMATS.register(
    "fp8_e4m3",
    KVFormat(
        "fp8_e4m3",
        torch.float8_e4m3fn,
        448.0,
        "FP8 E4M3 codes (round to nearest even, saturating at ±448), one static fp32 scale per "
        "(layer, K/V, KV head) calibrated at engine start",
    ),
)


def kv_format_of(name: str | None, where: str = "kv_format") -> KVCacheFormat:
    """The KV_FORMATS row `name`, or ENGINE_DTYPE for None (no format)."""
    return ENGINE_DTYPE if name is None else KV_FORMATS.get(name, where=where)


def encode(
    x: torch.Tensor, scale: torch.Tensor, fmt: KVFormat, shift: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., kv_heads, d] fp32, scale [kv_heads] → codes of (x − shift) / scale in
    fmt.storage (shift [kv_heads, d]: the keys' calibrated channel means, see the module doc)."""
    x = x.float() if shift is None else x.float() - shift
    scaled = x / scale[:, None]
    return scaled.clamp(-fmt.max_code, fmt.max_code).to(fmt.storage)


def decode(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """codes [..., kv_heads, d] → codes · scale in `dtype`."""
    return (codes.float() * scale[:, None]).to(dtype)


for _name, _codec, _what in (
    ("int4_kivi", MinMaxCodec(4), "KIVI int4: keys per channel over each block, values per "
     "token, min-max with fp16 scale and minimum; the block being filled kept in fp32"),
    ("int2_kivi", MinMaxCodec(2), "KIVI int2: as int4_kivi with 2-bit codes"),
    ("nvfp4", NVFP4Codec(), "NVFP4 per token (E2M1, an E4M3 scale per 16 values, an fp32 scale "
     "per block and head); the block being filled kept in fp32"),
):  # fmt: skip
    KV_FORMATS.register(_name, BlockedKVFormat(_name, _codec, _what))
