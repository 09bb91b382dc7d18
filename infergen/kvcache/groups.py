"""KV cache groups: layers that share one block table per sequence.

A model whose layers all attend the same way has one group. A model that mixes full and
sliding-window layers (Gemma-3: five local layers per global one; GPT-OSS: alternating) keeps a
separate block table per group, so a windowed group lets go of the blocks that fell out of its
window while the full-attention group keeps them (as vLLM's hybrid allocator does).

All groups draw pages from one block pool. A page holds one block of K/V for `group_size`
layers, so every group has the same number of layers: the gcd of the per-kind layer counts
(Gemma-3-270M: 15 sliding + 3 full layers → groups of 3: five sliding groups, one full).
The cache stores [group_size, 2, pages, block_size, kv_heads, head_dim]: layer l of a group
at index j reads storage[j] through its group's block table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NO_BLOCK = -1  # a block-table entry whose block left the window (its tokens are never read)


@dataclass(frozen=True)
class CacheGroup:
    layers: tuple[int, ...]  # model layer indices, in order
    window: int | None = None  # sliding window of these layers (None: full attention)
    sinks: int = 0  # first positions a windowed query reads too (StreamingLLM)

    def first_needed_block(self, position: int, block_size: int) -> int:
        """The first block after the sink blocks a query at `position` (or later) still
        reads."""
        if self.window is None:
            return 0
        return max(self.sink_blocks(block_size), max(0, position - self.window + 1) // block_size)

    def sink_blocks(self, block_size: int) -> int:
        """Blocks holding the sink positions: kept for the whole sequence."""
        return -(-self.sinks // block_size)

    def blocks_held(self, tokens: int, chunk: int, block_size: int) -> int:
        """The most blocks this group holds for a sequence of `tokens` tokens computed in
        steps of at most `chunk` tokens."""
        total = -(-tokens // block_size)
        if self.window is None:
            return total
        window = -(-(self.window - 1 + chunk) // block_size) + 1
        return min(total, window + self.sink_blocks(block_size))


def cache_groups(config, max_layers: int | None = None) -> tuple[CacheGroup, ...]:
    """The model's cache groups (equal sizes; one group when every layer attends alike; none
    for a model without attention layers); `max_layers`: groups of at most that many layers
    (a KV press with per-layer budgets, PyramidKV: each group keeps its own count)."""
    windows = {
        layer: config.window(layer)
        for layer in range(config.num_hidden_layers)
        if config.has_kv(layer)  # recurrent layers keep a state slot instead
    }
    return group_layers(windows, config.sink_tokens, max_layers)


def group_layers(
    windows: dict[int, int | None], sinks: int = 0, max_layers: int | None = None
) -> tuple[CacheGroup, ...]:
    """Cache groups of the layers with a KV cache ({layer: its window, None for full
    attention}): the layers of each window in groups of the gcd of the per-window counts (or
    of its largest divisor up to `max_layers`)."""
    by_window: dict[int | None, list[int]] = {}
    for layer, window in sorted(windows.items()):
        by_window.setdefault(window, []).append(layer)
    if not by_window:
        return ()
    size = math.gcd(*(len(layers) for layers in by_window.values()))
    if max_layers is not None:
        size = max(d for d in range(1, min(size, max_layers) + 1) if size % d == 0)
    return tuple(
        CacheGroup(tuple(layers[i : i + size]), window, sinks if window else 0)
        for window, layers in by_window.items()
        for i in range(0, len(layers), size)
    )


def needed_entries(groups: tuple[CacheGroup, ...], block_size: int, group: int, blocks: list,
                   n: int) -> list:  # fmt: skip
    """The entries of `blocks` (group `group`'s first n) that a query at position
    n·block_size still reads: all of them, or a windowed group's sink blocks and window."""
    grp = groups[group]
    first = grp.first_needed_block(n * block_size, block_size)
    return blocks[: min(grp.sink_blocks(block_size), first)] + blocks[first:n]


def needed_positions(groups: tuple[CacheGroup, ...], block_size: int, group: int,
                     n: int) -> list[int]:  # fmt: skip
    """needed_entries of the positions 0 .. n-1 themselves."""
    return needed_entries(groups, block_size, group, list(range(n)), n)


def sequence_blocks(
    groups: tuple[CacheGroup, ...], tokens: int, chunk: int, block_size: int
) -> int:
    """The most blocks one sequence of `tokens` tokens computed in steps of at most `chunk`
    tokens holds over all groups."""
    return sum(group.blocks_held(tokens, chunk, block_size) for group in groups)


def page_bytes(groups: tuple[CacheGroup, ...], bytes_per_token: float, block_size: int) -> float:
    """Bytes of one pool page: one block of one group's layers (all groups are the same size),
    given the KV bytes of one token over all layers."""
    share = len(groups[0].layers) / sum(len(g.layers) for g in groups)
    return bytes_per_token * block_size * share
