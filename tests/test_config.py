"""Config helpers: byte sizes, validation messages."""

from __future__ import annotations

import pytest

from infergen.config import CacheConfig, parse_bytes
from infergen.errors import ConfigError
from infergen.kvcache.sizing import blocks_for


@pytest.mark.parametrize(
    "text,expected",
    [("1GiB", 2**30), ("512MiB", 512 * 2**20), ("2GB", 2 * 10**9), ("1.5G", 1_500_000_000),
     ("100B", 100), ("4096", 4096), (77, 77), ("16 KiB", 16 * 1024)],
)  # fmt: skip
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


def test_parse_bytes_rejects_garbage():
    with pytest.raises(ConfigError, match="kv_cache_memory"):
        parse_bytes("lots", where="kv_cache_memory")


def test_cache_budget_smaller_than_a_block():
    from infergen.config import ModelConfig

    model = ModelConfig("llama", 10, 64, 128, 2, 4, 2, 16)
    with pytest.raises(ConfigError, match="smaller than one block"):
        blocks_for(CacheConfig(memory_bytes=100), model, 4)
