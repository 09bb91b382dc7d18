"""Recurrent-state checkpoints in the simulator (perf/simulate.py): the engine's own
`StateCheckpoints` (kvcache/state_checkpoints.py) — its keys, budget, least-recently-used
eviction, spill to the KV tiers and write-through, `shared_end` chunk cuts and deepest-usable
lookup — over checkpoints that are a size and a position, no data. So a model with recurrent
layers (Mamba2, Falcon-H1, Qwen3-Next) resumes a prefix in the simulation exactly where the
engine would, and its checkpoints occupy the tiers as the engine's do.

A checkpoint's bytes are the engine's: 8 (the position) + one sequence's recurrent state
(`ModelDesc.state_bytes_per_sequence` in fp32, as the engine keeps states) + a page per
attention group when the position is inside a block.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import SimpleNamespace

import torch

from infergen.kvcache.state_checkpoints import Fetch, Spill, StateCheckpoints
from infergen.perf.kv_tiers import _Contents


class _Checkpoint(_Contents):
    """A checkpoint's size and the position it resumes at."""

    __slots__ = ("position",)

    def __init__(self, nbytes: int, position: int):
        super().__init__(nbytes)
        self.position = position


class _StateRows:
    """One state tensor [slots, ...] without data: a row is one sequence's bytes."""

    def __init__(self, nbytes: int):
        self._row = _Contents(nbytes)

    def __getitem__(self, slot: int) -> _Contents:
        return self._row

    def element_size(self) -> int:
        return 1


class _DatalessStateCache:
    """What StateCheckpoints asks of a PagedKVCache with recurrent layers, without data."""

    device = torch.device("cpu")

    def __init__(self, state_bytes: int, page_bytes: int, block_size: int):
        self.block_size = block_size
        # kv_cache.states.states: layer → {name: tensor}; one tensor holds a sequence's state
        self.states = SimpleNamespace(states={0: {"state": _StateRows(state_bytes)}})
        self._page = _Contents(page_bytes)

    def page(self, block: int) -> _Contents:
        return self._page


class SimulatedCheckpoints(StateCheckpoints):
    """`StateCheckpoints` for the simulator: `state_bytes` per sequence, `page_bytes` per
    attention page, a `budget_bytes` store spilling to (`spill`), found in (`fetch`) and
    written through to (`through`) the simulated tiers."""

    def __init__(
        self,
        state_bytes: float,
        page_bytes: float,
        block_size: int,
        budget_bytes: int,
        spill: Spill | None = None,
        fetch: Fetch | None = None,
        through: Spill | None = None,
    ):
        cache = _DatalessStateCache(math.ceil(state_bytes), math.ceil(page_bytes), block_size)
        self.page_bytes = math.ceil(page_bytes)
        super().__init__(cache, budget_bytes, spill, fetch, through)

    def _pack(self, slot: int, position: int, partial_blocks: Sequence[int]) -> _Checkpoint:
        pages = len(partial_blocks) if position % self.block_size else 0
        return _Checkpoint(8 + self.state_bytes + pages * self.page_bytes, position)

    @staticmethod
    def position(data: _Checkpoint) -> int:
        return data.position

    def restore(self, data: _Checkpoint, slot: int, partial_blocks: Sequence[int]) -> int:
        return data.position
