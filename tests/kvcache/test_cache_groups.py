"""KV cache groups (kvcache/groups.py): the grouping rule, and windowed groups' memory staying
flat while the sequence grows past the window."""

from __future__ import annotations

import pytest

from infergen import LLM, SamplingParams
from infergen.config import ModelConfig
from infergen.kvcache.groups import NO_BLOCK, cache_groups, group_layers
from tests.hf_models import build_hf_model


def _config(layer_types: list[str] | None, window: int | None = 512) -> ModelConfig:
    return ModelConfig(
        architecture="gemma3", vocab_size=16, hidden_size=8, intermediate_size=8,
        num_hidden_layers=len(layer_types) if layer_types else 4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=4, sliding_window=window,
        layer_types=tuple(layer_types or ()),
    )  # fmt: skip


@pytest.mark.parametrize(
    "pattern,layers,expected",
    [
        (6, 18, [3] * 6),  # Gemma-3-270M: 15 local + 3 global layers → six groups of 3
        (6, 26, [2] * 13),  # Gemma-3-1B: 22 + 4 → thirteen groups of 2
        (2, 24, [12, 12]),  # GPT-OSS: alternating
    ],
)
def test_groups_have_equal_sizes_and_one_window_each(pattern, layers, expected):
    types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
             for i in range(layers)]  # fmt: skip
    groups = cache_groups(_config(types))
    assert [len(g.layers) for g in groups] == expected
    assert sorted(i for g in groups for i in g.layers) == list(range(layers))
    for group in groups:
        assert {types[i] == "sliding_attention" for i in group.layers} == {bool(group.window)}


def test_a_uniform_model_is_one_group():
    assert [g.layers for g in cache_groups(_config(None, None))] == [(0, 1, 2, 3)]
    uniform_window = cache_groups(_config(None, 7))
    assert len(uniform_window) == 1 and uniform_window[0].window == 7


def test_windowed_groups_hold_a_flat_number_of_blocks(tmp_path):
    """Generate far past the window: each windowed group's blocks stay within window + chunk
    tokens, the full-attention group's grow with the sequence, and all return to the pool."""
    build_hf_model("gemma3", tmp_path)  # window 8, two sliding groups and one full group
    chunk, block = 16, 4
    llm = LLM(str(tmp_path), block_size=block, max_num_batched_tokens=chunk, num_kv_blocks=200)
    engine = llm.engine
    groups = engine.kv_cache.groups
    engine.add_request(list(range(1, 41)), SamplingParams(max_tokens=80, ignore_eos=True))
    seq = engine.scheduler.waiting[0]
    held = []
    while engine.has_unfinished():
        engine.step()
        if seq.blocks:
            held.append([sum(b != NO_BLOCK for b in blocks) for blocks in seq.blocks])
    windowed = [g for g, group in enumerate(groups) if group.window]
    full = [g for g, group in enumerate(groups) if not group.window]
    assert windowed and full
    bound = groups[windowed[0]].blocks_held(10**6, chunk, block)
    assert bound < 10
    for g in windowed:
        assert max(step[g] for step in held) <= bound
        assert held[-1][g] <= -(-8 // block) + 1  # decoding: the window's blocks (+ partial)
    for g in full:
        assert held[-1][g] == -(-119 // block)  # every token of 40 + 79 computed
    assert engine.pool.num_free == 200


def test_groups_of_at_most_max_layers():
    """max_layers (a press with per-layer budgets): groups of the largest divisor of the usual
    size that fits — 30 full layers in five groups of 6, Gemma-3-270M's groups of 3 kept at
    3 (or single layers under a limit of 2) — every group still the same size."""
    full = group_layers(dict.fromkeys(range(30)), max_layers=6)
    assert [g.layers for g in full] == [tuple(range(i, i + 6)) for i in range(0, 30, 6)]
    windows = {i: (None if i % 6 == 5 else 512) for i in range(18)}
    assert {len(g.layers) for g in group_layers(windows, max_layers=6)} == {3}
    single = group_layers(windows, max_layers=2)
    assert len(single) == 18 and sum(g.window is None for g in single) == 3
