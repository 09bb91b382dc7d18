"""Per-sequence state of the recurrent mixers (Mamba2 SSM, gated DeltaNet): constant size
whatever the sequence length, one slot per running sequence.

Every state layer owns tensors [num_slots, *shape] (its mixer's `state_shapes()`); a sequence
holds one slot index into all of them while it runs, and gives it back when it finishes or is
preempted. A sequence admitted with no computed token starts from zeros (the step's `fresh`
flag); one resumed from a prefix gets a checkpointed state copied into its slot first
(state_checkpoints.py). The slots are allocated from the same memory budget as the
KV blocks (engine.py sets the slots aside first).
"""

from __future__ import annotations

import math
from collections import deque

import torch


def slots_for(max_num_seqs: int) -> int:
    """State slots a cache sets aside: one per sequence the batch may hold, + one for a
    teacher-forced scoring pass (engine/scoring.py)."""
    return max_num_seqs + 1


class SlotPool:
    """Slot indices, one per running sequence: what the scheduler allocates and releases (the
    state tensors aside, so that the performance model's simulator can run the same rules)."""

    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._free: deque[int] = deque(range(num_slots))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int | None:
        """A free slot, or None when every slot is held."""
        return self._free.popleft() if self._free else None

    def release(self, slot: int) -> None:
        assert slot not in self._free, f"state slot {slot} released twice"
        self._free.append(slot)


class StateCache(SlotPool):
    def __init__(
        self,
        layer_states: dict[int, dict[str, tuple[tuple[int, ...], torch.dtype]]],
        num_slots: int,
        device: torch.device | str = "cpu",
    ):
        """layer_states: model layer → {state name: (shape, dtype)}; on `device`."""
        super().__init__(num_slots)
        self.states = {
            layer: {
                name: torch.zeros(num_slots, *shape, dtype=dtype, device=device)
                for name, (shape, dtype) in shapes.items()
            }
            for layer, shapes in layer_states.items()
        }

    @staticmethod
    def bytes_per_slot(layer_states: dict[int, dict[str, tuple[tuple[int, ...], torch.dtype]]]):
        """Bytes one sequence's state takes over all layers."""
        return sum(
            math.prod(shape) * torch.finfo(dtype).bits // 8
            for shapes in layer_states.values()
            for shape, dtype in shapes.values()
        )

    def layer(self, index: int) -> dict[str, torch.Tensor]:
        return self.states[index]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for s in self.states.values() for t in s.values())
