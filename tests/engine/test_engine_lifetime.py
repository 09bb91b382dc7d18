"""An engine's memory goes with its last reference: no reference cycle holds its model, KV
pool, scheduler or tiers, so they are freed by reference counting alone, with Python's cyclic
collector disabled (it runs by object-allocation counts, which tensors barely move: engines
in cycles piled up 1 GiB pools until a host ran out of memory). Checked on the default
model (its fused decode fast path), a hybrid model (state checkpoints) and an attention model
with host + disk tiers written through (the tiers' writer thread)."""

from __future__ import annotations

import gc
import weakref

import pytest

from infergen import LLM, SamplingParams
from tests.hf_models import build_hf_model

GREEDY = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)


def _parts(llm: LLM) -> dict[str, weakref.ref]:
    engine = llm.engine
    parts = {
        "engine": engine,
        "model": engine.runner.model,
        "kv_cache": engine.kv_cache,
        "scheduler": engine.scheduler,
        "block_pool": engine.scheduler.pool,
    }
    if engine.kv_tiers is not None:
        parts["kv_tiers"] = engine.kv_tiers
    return {name: weakref.ref(part) for name, part in parts.items()}


def _alive_after_del(make) -> list[str]:
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        llm = make()
        llm.generate([[5, 6, 7, 8] * 10], GREEDY)
        llm.generate([[5, 6, 7, 8] * 12], GREEDY)  # a prefix hit (and its tier traffic)
        if llm.engine.kv_tiers is not None:
            llm.engine.kv_tiers.flush()
        parts = _parts(llm)
        assert all(ref() is not None for ref in parts.values())
        del llm
        return [name for name, ref in parts.items() if ref() is not None]
    finally:
        if enabled:
            gc.enable()
        gc.collect()


def test_the_default_model_engine_is_freed_by_reference_counting():
    assert _alive_after_del(lambda: LLM(num_kv_blocks=64, block_size=16)) == []


@pytest.mark.parametrize("name", ["qwen3_next", "llama_gqa"])
def test_tiered_engines_are_freed_by_reference_counting(name, tmp_path):
    build_hf_model(name, tmp_path / "model")
    options = dict(
        block_size=4,
        num_kv_blocks=64,
        kv_offload_memory="16MiB",
        kv_offload_dir=str(tmp_path / "kv"),
        kv_offload_write_through=True,
    )
    assert _alive_after_del(lambda: LLM(str(tmp_path / "model"), **options)) == []
