"""How much a KV cache takes and holds: bytes per cached element and per token for a cache
section's KV format, and the number of blocks a memory budget buys (`blocks_for`)."""

from __future__ import annotations

from infergen.config import CacheConfig, ModelConfig
from infergen.errors import ConfigError
from infergen.kvcache.groups import cache_groups
from infergen.kvcache.kv_blocked import BlockedKVFormat
from infergen.kvcache.kv_format import KV_FORMATS


def is_blocked(kv_format: str | None) -> bool:
    """The KV format quantizes whole blocks (kvcache/kv_blocked.py)."""
    return kv_format is not None and isinstance(KV_FORMATS.get(kv_format), BlockedKVFormat)


def element_bytes(cache: CacheConfig, dtype_bytes: int) -> int:
    """Bytes a cached K / V element takes: the KV format's, else the engine dtype's (a
    block-quantized format has no element size: see bytes_per_token)."""
    if cache.kv_format is None:
        return dtype_bytes
    return KV_FORMATS.get(cache.kv_format).element_bytes


def bytes_per_token(cache: CacheConfig, model: ModelConfig, dtype_bytes: int) -> float:
    """KV cache bytes one token takes over all layers (codes and their scales)."""
    if not is_blocked(cache.kv_format):
        return model.kv_bytes_per_token(element_bytes(cache, dtype_bytes))
    fmt = KV_FORMATS.get(cache.kv_format)
    per_block = fmt.bytes_per_block(cache.block_size, model.num_key_value_heads, model.head_dim)
    return model.num_hidden_layers * per_block / cache.block_size


def blocks_for(
    cache: CacheConfig,
    model: ModelConfig,
    dtype_bytes: int,
    tail_blocks: int = 0,
    reserved_bytes: int = 0,
) -> int:
    """Blocks in the pool: `num_blocks`, or as many as `memory_bytes` holds at this format's
    bytes per token (the per-head scales of a scaled format are not counted: a few bytes a
    layer) after `reserved_bytes` (recurrent layers' state slots); a block-quantized format
    first sets aside `tail_blocks` fp32 blocks for the blocks being filled. A model without
    attention layers gets one (unused) block."""
    if cache.num_blocks is not None:
        return cache.num_blocks
    groups = cache_groups(model)
    if not groups:
        return 1
    blocked = is_blocked(cache.kv_format)
    budget = cache.memory_bytes - reserved_bytes
    if blocked:
        budget -= tail_blocks * model.kv_bytes_per_token(4) * cache.block_size
    # a block is a page of one cache group's layers (kvcache/groups.py)
    group_share = len(groups[0].layers) / sum(len(g.layers) for g in groups)
    per_block = bytes_per_token(cache, model, dtype_bytes) * cache.block_size * group_share
    if cache.sparse_decode_blocks is not None:  # + each block's key min / max per layer
        kv_layers = len(groups[0].layers)
        per_block += kv_layers * model.num_key_value_heads * 2 * model.head_dim * 4
    blocks = budget // per_block
    if blocks < 1:
        raise ConfigError(
            "KV cache memory budget is smaller than one block",
            where="cache.memory_bytes",
            found=cache.memory_bytes,
            expected=f">= {per_block:.0f} bytes (one block of {cache.block_size} tokens"
            + (", after the fp32 blocks being filled)" if blocked else ")"),
        )
    return int(blocks)
