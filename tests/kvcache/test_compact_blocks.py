"""Compact blocks in the KV tiers (kv_offload_format="fp8_e4m3", kvcache/tiers/compact.py):
a block saved to the host or the disk tier and loaded back equals its FP8 E4M3
quantize-dequantize with one scale per (layer, K/V, KV head) = amax / 448, computed here
with ml_dtypes on the same values (bit for bit); the host tier holds ~4x the fp32 blocks
(~2x bf16) in the same budget; the option is refused where it makes no sense."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from infergen import LLM, SamplingParams
from infergen.config import ModelConfig
from infergen.errors import ConfigError
from infergen.kvcache.paged_cache import PagedKVCache
from infergen.kvcache.prefix import block_hash
from infergen.kvcache.tiers.compact import OFFLOAD_FORMATS, offload_format_of
from infergen.kvcache.tiers.disk import DiskTier
from infergen.kvcache.tiers.host import HostTier
from infergen.kvcache.tiers.tiered import KVTiers
from tests.hf_models import BASE, build_hf_model

FP8 = OFFLOAD_FORMATS.get("fp8_e4m3")
NUMPY = {torch.float32: np.float32, torch.bfloat16: ml_dtypes.bfloat16,
         torch.float16: np.float16}  # fmt: skip
BITS = {torch.float32: (torch.int32, np.int32), torch.bfloat16: (torch.int16, np.int16),
        torch.float16: (torch.int16, np.int16)}  # fmt: skip


def _cache(dtype: torch.dtype, num_blocks: int = 8, block_size: int = 8, head_dim: int = 16,
           kv_format: str | None = None) -> PagedKVCache:  # fmt: skip
    config = ModelConfig(architecture="llama", head_dim=head_dim, num_key_value_heads=2, **BASE)
    return PagedKVCache(config, num_blocks, block_size, dtype, kv_format)


def _fill(cache: PagedKVCache, seed: int = 0) -> None:
    """Random values whose magnitude differs by (layer, K/V, head) over six decades, one head
    of one block all zeros (its scale: 1), a few values at ±0."""
    storage = cache.storage  # [layers, 2, blocks, block_size, heads, dim]
    gen = torch.Generator().manual_seed(seed)
    layers, planes, _, _, heads, _ = storage.shape
    magnitude = 10 ** (torch.rand(layers, planes, 1, 1, heads, 1, generator=gen) * 6 - 3)
    values = torch.randn(storage.shape, generator=gen) * magnitude
    values[1, 0, 2, :, 1] = 0.0
    values[0, 1, 2, 0, 0, :3] = torch.tensor([-0.0, 0.0, -0.0])
    storage.copy_(values.to(storage.dtype))


def _oracle(page: torch.Tensor) -> np.ndarray:
    """FP8 E4M3 quantize-dequantize of page [layers, 2, block_size, heads, dim] per (layer,
    K/V, head) with ml_dtypes, back in the page's dtype."""
    x = page.float().numpy()
    amax = np.abs(x).max(axis=(2, 4), keepdims=True)
    scale = np.where(amax > 0, amax / np.float32(448.0), np.float32(1.0)).astype(np.float32)
    codes = np.clip(x / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    return (codes.astype(np.float32) * scale).astype(NUMPY[page.dtype])


def _assert_bits_equal(got: torch.Tensor, want: np.ndarray) -> None:
    torch_bits, numpy_bits = BITS[got.dtype]
    got_bits = got.contiguous().view(torch_bits).numpy()
    assert np.array_equal(got_bits, want.view(numpy_bits))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tier", ["host", "disk"])
def test_a_reloaded_compact_block_is_its_fp8_quantize_dequantize(dtype, tier, tmp_path):
    cache = _cache(dtype)
    _fill(cache)
    if tier == "host":
        tiers = KVTiers(cache, [HostTier(1 << 20)], codec=FP8)
    else:
        tiers = KVTiers(cache, [DiskTier(tmp_path, 1 << 20, "fingerprint")], codec=FP8)
    original = cache.storage[:, :, 2].clone()
    want = _oracle(original)
    key = block_hash(None, [1, 2, 3])
    tiers.save(2, key, None)
    cache.storage[:, :, 2] = 0  # the pool reused the block
    assert tiers.load(key, 5) and tiers.loaded == 1
    _assert_bits_equal(cache.storage[:, :, 5], want)
    assert not torch.equal(cache.storage[:, :, 5], original)  # lossy: FP8, not the block
    stored = tiers.tiers[0].get(key)
    assert stored.dtype == torch.uint8 and stored.numel() == tiers.block_bytes
    layers, planes, _, block_size, heads, dim = cache.storage.shape
    assert tiers.block_bytes == layers * planes * heads * (4 + block_size * dim)
    if tier == "disk":  # a restarted tier reads the same compact block back
        again = KVTiers(cache, [DiskTier(tmp_path, 1 << 20, "fingerprint")], codec=FP8)
        assert again.load(key, 6)
        _assert_bits_equal(cache.storage[:, :, 6], want)


def test_the_scales_are_amax_over_448_per_layer_plane_and_head():
    """The stored scales (the tensor's first bytes) are amax / 448 of each (layer, K/V, head)
    slice of the block, 1 for the all-zero head."""
    cache = _cache(torch.float32)
    _fill(cache)
    page = cache.storage[:, :, 2]
    stored = FP8.encode(page)
    layers, planes, block_size, heads, dim = page.shape
    scales = stored[: layers * planes * heads * 4].view(torch.float32)
    amax = page.abs().amax(dim=(2, 4))  # [layers, planes, heads]
    want = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    assert torch.equal(scales.view(layers, planes, heads), want)
    assert scales.view(layers, planes, heads)[1, 0, 1] == 1.0  # the zero head


@pytest.mark.parametrize(("dtype", "least"), [(torch.float32, 3.9), (torch.bfloat16, 1.95)])
def test_the_host_tier_holds_about_four_times_the_fp32_blocks(dtype, least):
    """The same budget (twenty plain blocks) through the plain and the compact path: the compact
    tier holds as many blocks as its byte size says (block_size 16, head_dim 32: the scales
    add 4 bytes per 512 codes), >= 3.9x the fp32 blocks, >= 1.95x the bf16 ones."""
    held = {}
    for codec in (offload_format_of(None), FP8):
        cache = _cache(dtype, num_blocks=96, block_size=16, head_dim=32)
        _fill(cache)
        budget = 20 * cache.block_bytes
        tier = HostTier(budget)
        tiers = KVTiers(cache, [tier], codec=codec)
        keys = [block_hash(None, [i]) for i in range(96)]
        for block, key in enumerate(keys):
            tiers.save(block, key, None)
        held[codec.name] = sum(key in tier for key in keys)
        assert held[codec.name] == budget // tiers.block_bytes == tier.nbytes // tiers.block_bytes
        assert tier.nbytes <= budget
    assert held[None] == 20
    assert held["fp8_e4m3"] / held[None] >= least


def test_the_option_is_refused_where_it_makes_no_sense(tmp_path):
    with pytest.raises(ConfigError, match="would not shrink"):
        KVTiers(_cache(torch.float32, kv_format="fp8_e4m3"), [HostTier(1 << 20)], codec=FP8)
    with pytest.raises(ConfigError, match="block-quantized"):
        offload_format_of("int4_kivi")
    with pytest.raises(ConfigError, match="unknown KV offload format"):
        offload_format_of("fp4")
    build_hf_model("llama_gqa", tmp_path)
    with pytest.raises(ConfigError, match="kv_offload_format.*there are none"):
        LLM(str(tmp_path), kv_offload_format="fp8_e4m3")
    with pytest.raises(ConfigError, match="would not shrink"):  # the build checks it
        LLM(str(tmp_path), kv_format="fp8_e4m3", kv_offload_memory="1MiB",
            kv_offload_format="fp8_e4m3")  # fmt: skip


def test_compact_disk_blocks_serve_only_engines_that_store_them(tmp_path):
    """The fingerprint names the offload format: blocks written compact are loaded by a
    restarted compact engine, never by one storing blocks as the pool does."""
    build_hf_model("llama_gqa", tmp_path / "model")
    model, params = str(tmp_path / "model"), SamplingParams(max_tokens=4, temperature=0)
    options = dict(block_size=4, num_kv_blocks=24, kv_offload_dir=str(tmp_path / "kv"))
    prompt = list(range(3, 43))
    LLM(model, kv_offload_format="fp8_e4m3", kv_offload_write_through=True,
        **options).generate(prompt, params)  # fmt: skip
    plain = LLM(model, **options)
    assert plain.generate(prompt, params)[0].num_cached_prompt_tokens == 0
    assert plain.engine.kv_tiers.loaded == 0
    compact = LLM(model, kv_offload_format="fp8_e4m3", **options)
    assert compact.generate(prompt, params)[0].num_cached_prompt_tokens >= 32
    assert compact.engine.kv_tiers.loaded >= 8
    assert compact.engine.kv_tiers.stats()["tiers"]["disk"]["hits"] >= 8
