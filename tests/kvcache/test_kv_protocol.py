"""Every KV format through the one protocol (kvcache/kv_protocol.py): each KV_FORMATS row and
ENGINE_DTYPE (no format) stores K / V and reads back exactly what the format's own reference
encode / decode gives, and its bytes_per_token / tail_bytes are what its allocation grows by
per token / per tail block."""

from __future__ import annotations

import pytest
import torch

from infergen.config import ModelConfig
from infergen.errors import InfergenError
from infergen.kvcache.kv_format import KV_FORMATS, kv_format_of
from infergen.kvcache.kv_protocol import ENGINE_DTYPE, KVCacheFormat, KVPool
from infergen.kvcache.paged_cache import PagedKVCache
from infergen.ops.kv_store import kv_store
from tests.hf_models import BASE

NAMES = [None, *KV_FORMATS.names()]  # None: ENGINE_DTYPE
BLOCK = 8


def _config(head_dim: int = 32) -> ModelConfig:
    return ModelConfig(architecture="llama", head_dim=head_dim, num_key_value_heads=2, **BASE)


def _cache(name, num_blocks=12, tail_slots=4) -> PagedKVCache:
    cache = PagedKVCache(_config(), num_blocks, BLOCK, torch.float32, name, tail_slots)
    fmt = cache.format
    if fmt.calibrate:  # per-head scales and a key shift, as calibration would set them
        gen = torch.Generator().manual_seed(5)
        cache.scales.copy_(fmt.scales_for(torch.rand(cache.scales.shape, generator=gen) + 2))
        cache.k_shift.copy_(torch.randn(cache.k_shift.shape, generator=gen) * 0.5)
    return cache


@pytest.mark.parametrize("name", NAMES)
def test_rows_implement_the_protocol(name):
    fmt = kv_format_of(name)
    assert isinstance(fmt, KVCacheFormat)
    assert isinstance(_cache(name).pool, KVPool)
    assert (fmt is ENGINE_DTYPE) == (name is None)
    assert fmt.name == name and fmt.min_block_size >= 1


@pytest.mark.parametrize("name", NAMES)
def test_store_then_read_equals_the_reference(name):
    """Three whole blocks written in one step at scattered blocks (two steps for the last),
    read back by slot: the format's plain encode / decode of the same values, bit for bit."""
    cache = _cache(name)
    config = _config()
    blocks = torch.tensor([7, 2, 9])
    slots = (blocks[:, None] * BLOCK + torch.arange(BLOCK)).flatten()  # [24]
    gen = torch.Generator().manual_seed(len(str(name)))
    for layer in range(config.num_hidden_layers):
        kv = cache.layer(layer)
        k = torch.randn(len(slots), 2, 32, generator=gen) * 3
        v = torch.randn(len(slots), 2, 32, generator=gen)
        for part in (slice(0, 20), slice(20, None)):  # the last block completed a step later
            cache.begin_step(slots[part])
            kv_store(k[part], v[part], kv.k, kv.v, slots[part], kv)
        keys, values = kv.fmt.read(kv, slots, torch.float32)
        want_k, want_v = kv.fmt.reference(kv, k, v, torch.float32)
        assert keys.shape == values.shape == (len(slots), 2, 32)
        assert torch.equal(keys, want_k), (name, layer)
        assert torch.equal(values, want_v), (name, layer)


@pytest.mark.parametrize("name", NAMES)
def test_bytes_per_token_is_what_the_allocation_grows_by(name):
    fmt, config = kv_format_of(name), _config()
    small, large = _cache(name, num_blocks=10), _cache(name, num_blocks=13)
    per_token = (large.nbytes - small.nbytes) / (3 * BLOCK)
    assert per_token == fmt.bytes_per_token(config, 4, BLOCK)
    more_tails = _cache(name, num_blocks=10, tail_slots=6)
    assert more_tails.nbytes - small.nbytes == fmt.tail_bytes(config, BLOCK, 2)


@pytest.mark.parametrize("name,head_dim", [("int2_kivi", 30), ("nvfp4", 24)])
def test_head_dim_must_hold_whole_groups(name, head_dim):
    """A head_dim that is not a whole number of the format's code groups (four 2-bit codes a
    byte, NVFP4's 16 values) is refused when the cache is made."""
    with pytest.raises(InfergenError, match=f"head_dim {head_dim}"):
        PagedKVCache(_config(head_dim), 4, BLOCK, torch.float32, name, 1)
