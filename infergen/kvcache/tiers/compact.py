"""How the KV tiers store a block (issue 23, item 1; option `kv_offload_format`): as the pool
stores it (`AS_STORED`, the default), or compact — the OFFLOAD_FORMATS rows.

A block's contents (a "page", PagedKVCache.block_data) are [group_size, planes, block_size,
kv_heads, head_dim] in the pool's storage dtype. A tier stores whatever `encode` returns for
a page and `decode` gives the page back in the pool's dtype; the tiers themselves never look
inside (the disk tier keeps the encoded tensor's dtype and shape in its header).

"fp8_e4m3" (`ScaledBlocks`): FP8 E4M3 codes with one fp32 scale per (block, layer of the
page, K/V plane, KV head) — the largest |value| of that head's [block_size, head_dim] slice
over 448, the FP8 KV format's own rule and code (kv_format.py: `scales_for`, `encode`,
`decode`; an all-zero head gets scale 1) — except that the scale is taken per block when the
block is stored (dynamic: no calibration, no key shift). The stored tensor is flat uint8:

    [scales: group_size · planes · kv_heads fp32 (native byte order) | codes: block_size ·
     group_size · planes · kv_heads · head_dim FP8 E4M3, as [block_size, group · plane · head,
     head_dim]]

so a block takes ~1/4 of its fp32 bytes (~1/2 of bf16 / fp16) plus 4 bytes per (layer, K/V,
head): a host budget holds ~4x the fp32 blocks. FP8 is lossy: a reloaded block equals the
FP8 quantize-dequantize of the stored one, not the block (tests/kvcache/test_compact_blocks.py
and the generation test in test_kv_tiers.py state how close). A pool that stores FP8 codes
already (kv_format="fp8_e4m3") gains nothing and is refused, as are the block-quantized KV
formats' names (they are pool formats, not block encodings of the tiers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from infergen.errors import ConfigError
from infergen.kvcache.kv_format import KV_FORMATS, KVFormat, decode, encode
from infergen.kvcache.paged_cache import PagedKVCache
from infergen.registry import Registry


class AsStored:
    """The pool's own bytes: encode / decode are the identity (the tiers copy what they keep)."""

    name = None

    def check(self, kv_cache: PagedKVCache) -> None:
        return None

    def stored_bytes(self, shape: torch.Size, dtype: torch.dtype) -> int:
        return math.prod(shape) * dtype.itemsize

    def encode(self, page: torch.Tensor) -> torch.Tensor:
        return page

    def decode(self, stored: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        return stored


AS_STORED = AsStored()


@dataclass(frozen=True)
class ScaledBlocks:
    """A scaled element KV format's codes with per-(block, layer, K/V, KV head) scales
    (the module docstring gives the layout)."""

    fmt: KVFormat

    @property
    def name(self) -> str:
        return self.fmt.name

    def check(self, kv_cache: PagedKVCache) -> None:
        dtype = kv_cache.storage.dtype
        if not dtype.is_floating_point or dtype.itemsize <= self.fmt.element_bytes:
            raise ConfigError(
                f"kv_offload_format {self.name!r} would not shrink the pool's blocks",
                where="kv_offload_format",
                found=f"a pool of {str(dtype).removeprefix('torch.')} (kv_format "
                f"{kv_cache.kv_format!r})",
                expected="None (blocks stored as the pool stores them), or an engine-dtype "
                "pool (kv_format None) in float32 / bfloat16 / float16",
            )

    def stored_bytes(self, shape: torch.Size, dtype: torch.dtype) -> int:
        groups, planes, block_size, heads, dim = shape
        rows = groups * planes * heads
        return rows * 4 + block_size * rows * dim * self.fmt.element_bytes

    def encode(self, page: torch.Tensor) -> torch.Tensor:
        """page [group, planes, block_size, heads, dim] (any float dtype, any device) → the
        flat uint8 tensor of scales and codes, on the page's device."""
        groups, planes, block_size, heads, dim = page.shape
        # [block_size, group · plane · head, dim]: every (layer, K/V, head) one "KV head" of
        # kv_format.encode, its scale one entry of the flat scale vector
        rows = page.permute(2, 0, 1, 3, 4).reshape(block_size, groups * planes * heads, dim)
        scales = self.fmt.scales_for(rows.float().abs().amax(dim=(0, 2)))  # [rows] fp32
        codes = encode(rows, scales, self.fmt)
        return torch.cat([scales.view(torch.uint8), codes.reshape(-1).view(torch.uint8)])

    def decode(self, stored: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """`encode`'s uint8 tensor → the page [group, planes, block_size, heads, dim] in
        `dtype` (a non-contiguous view: PagedKVCache.write_block copies it)."""
        groups, planes, block_size, heads, dim = shape
        rows = groups * planes * heads
        scales = stored[: rows * 4].view(torch.float32)
        codes = stored[rows * 4 :].view(self.fmt.storage).view(block_size, rows, dim)
        values = decode(codes, scales, dtype)  # [block_size, rows, dim]
        return values.view(block_size, groups, planes, heads, dim).permute(1, 2, 0, 3, 4)


OFFLOAD_FORMATS: Registry[ScaledBlocks] = Registry("KV offload format")
OFFLOAD_FORMATS.register("fp8_e4m3", ScaledBlocks(KV_FORMATS.get("fp8_e4m3")))


def offload_format_of(name: str | None) -> AsStored | ScaledBlocks:
    """The OFFLOAD_FORMATS row `name`, or AS_STORED for None."""
    if name is None:
        return AS_STORED
    if name in KV_FORMATS and name not in OFFLOAD_FORMATS:
        raise ConfigError(
            f"KV format {name!r} is a pool format (block-quantized), not a way the KV tiers "
            "store blocks",
            where="kv_offload_format",
            found=name,
            expected=f"None or one of {OFFLOAD_FORMATS.names()}",
        )
    return OFFLOAD_FORMATS.get(name, where="kv_offload_format")
