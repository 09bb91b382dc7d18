"""Riders (kvcache/tiers/riders.py): another paged cache whose blocks travel with the pool's
through the KV tiers (the `mtp` layer's KV). A block saved and loaded back into another
block brings the rider's page bit for bit, as stored, whatever the pool's offload format
(the pool's page: as stored, or its FP8 quantize-dequantize computed with ml_dtypes); with
write-through, the rider's page is taken at the step's end, not when the block registered;
a rider with other blocks is refused. The engine-level check (MTP outputs after a tier hit
equal the oracle's) is in tests/engine/test_spec_mtp.py."""

from __future__ import annotations

import pytest
import torch

from infergen.config import ModelConfig
from infergen.errors import ConfigError
from infergen.kvcache.paged_cache import PagedKVCache
from infergen.kvcache.prefix import block_hash
from infergen.kvcache.tiers.disk import DiskTier
from infergen.kvcache.tiers.host import HostTier
from infergen.kvcache.tiers.tiered import KVTiers
from tests.hf_models import BASE
from tests.kvcache.test_compact_blocks import FP8, _assert_bits_equal, _cache, _fill, _oracle

KEY = block_hash(None, [1, 2, 3])


def _rider(num_blocks: int = 8, block_size: int = 8) -> PagedKVCache:
    """A one-layer bf16 cache of another head shape than the pool's (1 head of 6: a page of
    192 bytes beside the pool's 8192 in fp32)."""
    config = ModelConfig(architecture="llama", **dict(BASE, num_hidden_layers=1, head_dim=6,
                                                      num_key_value_heads=1))  # fmt: skip
    cache = PagedKVCache(config, num_blocks, block_size, torch.bfloat16)
    gen = torch.Generator().manual_seed(5)
    cache.storage.copy_(torch.randn(cache.storage.shape, generator=gen))
    return cache


@pytest.mark.parametrize("codec", [None, FP8], ids=["as-stored", "fp8"])
@pytest.mark.parametrize("tier", ["host", "disk"])
def test_a_rider_page_comes_back_with_its_block(codec, tier, tmp_path):
    cache, rider = _cache(torch.float32), _rider()
    _fill(cache)
    made = {"host": lambda: HostTier(1 << 20), "disk": lambda: DiskTier(tmp_path, 1 << 20, "fp")}
    tiers = KVTiers(cache, [made[tier]()], **({} if codec is None else {"codec": FP8}))
    tiers.carry(rider)
    page, rider_page = cache.storage[:, :, 2].clone(), rider.storage[:, :, 2].clone()
    tiers.save(2, KEY, None)
    cache.storage[:, :, 2] = 0  # the pool reused the block
    rider.storage[:, :, 2] = 0
    assert tiers.load(KEY, 5)
    assert torch.equal(rider.storage[:, :, 5].view(torch.int16), rider_page.view(torch.int16))
    if codec is None:
        assert torch.equal(cache.storage[:, :, 5], page)
    else:
        _assert_bits_equal(cache.storage[:, :, 5], _oracle(page))
    stored = tiers.tiers[0].get(KEY)
    pool_bytes = (page.numel() * 4 if codec is None
                  else FP8.stored_bytes(page.shape, page.dtype))  # fmt: skip
    assert stored.numel() == tiers.block_bytes >= pool_bytes + rider_page.numel() * 2


def test_write_through_takes_the_rider_page_at_the_step_end(tmp_path):
    """A block registered in a step is written through once the step is over (`end_step`):
    the rider's KV of its positions is written after the step's tokens are kept."""
    cache, rider = _cache(torch.float32), _rider()
    _fill(cache)
    tiers = KVTiers(cache, [DiskTier(tmp_path, 1 << 20, "fp")], write_through=True)
    tiers.carry(rider)
    tiers.save_through(3, KEY, None)
    assert KEY not in tiers  # held until the step's end
    rider.storage[:, :, 3] = 1.5  # the rider's after-step KV of the block's positions
    tiers.end_step()
    tiers.flush()
    assert KEY in tiers
    rider.storage[:, :, 3] = 0
    assert tiers.load(KEY, 6)
    assert bool((rider.storage[:, :, 6] == 1.5).all())
    assert torch.equal(cache.storage[:, :, 6], cache.storage[:, :, 3])


def test_a_held_block_is_written_before_the_pool_reuses_any(tmp_path):
    """An eviction (`save`) first writes the held blocks through, whatever block it evicts."""
    cache, rider = _cache(torch.float32), _rider()
    _fill(cache)
    tiers = KVTiers(cache, [HostTier(1 << 20), DiskTier(tmp_path, 1 << 20, "fp")],
                    write_through=True)  # fmt: skip
    tiers.carry(rider)
    tiers.save_through(3, KEY, None)
    tiers.save(4, block_hash(None, [4]), None)
    tiers.flush()
    assert KEY in tiers.tiers[1]


def test_a_rider_with_other_blocks_is_refused():
    tiers = KVTiers(_cache(torch.float32), [HostTier(1 << 20)])
    with pytest.raises(ConfigError, match="the pool's blocks"):
        tiers.carry(_rider(num_blocks=9))
