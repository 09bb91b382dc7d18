"""How much a KV cache takes and holds: bytes per token for a cache section's KV format, and
the number of blocks a memory budget buys (`blocks_for`)."""

from __future__ import annotations

from infergen.config import CacheConfig, ModelConfig
from infergen.config.sections import DEFAULT_KV_MEMORY
from infergen.errors import ConfigError
from infergen.kvcache.groups import cache_groups, page_bytes
from infergen.kvcache.kv_format import kv_format_of


def bytes_per_token(cache: CacheConfig, model: ModelConfig, dtype_bytes: int) -> float:
    """KV cache bytes one token takes over all layers (codes and their scales): the KV
    format's (kv_protocol.KVCacheFormat.bytes_per_token), else the engine dtype's."""
    return kv_format_of(cache.kv_format).bytes_per_token(model, dtype_bytes, cache.block_size)


def blocks_for(
    cache: CacheConfig,
    model: ModelConfig,
    dtype_bytes: int,
    tail_blocks: int = 0,
    reserved_bytes: int = 0,
    extra_block_bytes: float = 0.0,
    groups: tuple | None = None,
) -> int:
    """Blocks in the pool: `num_blocks`, or as many as `memory_bytes` holds at this format's
    bytes per token (the per-head scales of a scaled format are not counted: a few bytes a
    layer) after `reserved_bytes` (recurrent layers' state slots) and what the format sets
    aside for `tail_blocks` blocks being filled (a block-quantized format keeps them in fp32:
    KVCacheFormat.tail_bytes); `extra_block_bytes`: what each block costs besides (a draft
    model's KV of the same block). A model without attention layers gets one (unused)
    block."""
    if cache.num_blocks is not None:
        return cache.num_blocks
    groups = cache_groups(model) if groups is None else groups  # (the model's own)
    if not groups:
        return 1
    tails = kv_format_of(cache.kv_format).tail_bytes(model, cache.block_size, tail_blocks)
    memory = DEFAULT_KV_MEMORY if cache.memory_bytes is None else cache.memory_bytes
    budget = memory - reserved_bytes - tails
    per_block = page_bytes(groups, bytes_per_token(cache, model, dtype_bytes), cache.block_size)
    per_block += extra_block_bytes
    if cache.sparse_decode_blocks is not None:  # + each block's key min / max per layer
        kv_layers = len(groups[0].layers)
        per_block += kv_layers * model.num_key_value_heads * 2 * model.head_dim * 4
    blocks = budget // per_block
    if blocks < 1:
        raise ConfigError(
            "KV cache memory budget is smaller than one block",
            where="cache.memory_bytes",
            found=memory,
            expected=f">= {per_block:.0f} bytes (one block of {cache.block_size} tokens"
            + (", after the fp32 blocks being filled)" if tails else ")"),
        )
    return int(blocks)
