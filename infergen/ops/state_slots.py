"""Reading and writing the recurrent layers' per-sequence states by slot
(kvcache/state_cache.py) for one step.

A decode batch's slots are usually a contiguous range (slots are handed out in order): the
states are then a view of the slot tensor and the step updates them in place — no gather of
[seqs, heads, ...] before and no scatter after, which at batch 16 was most of a Mamba2
decode step here. Otherwise the states are gathered into a copy and written back. A fresh
sequence's state is replaced by zeros (its slot may hold anything, even NaN from an earlier
sequence: a multiply by 0 would keep the NaN).
"""

from __future__ import annotations

import torch


def read_states(
    state: torch.Tensor,  # [slots, ...]
    slots: torch.Tensor,  # [n] int64
    fresh: torch.Tensor,  # [n] bool
) -> tuple[torch.Tensor, bool]:
    """(the n sequences' states in fp32, whether they are a view of `state`)."""
    n = slots.numel()
    first = int(slots[0]) if n else 0
    in_place = (
        state.dtype == torch.float32
        and n > 0
        and bool((slots == torch.arange(first, first + n, device=slots.device)).all())
    )
    h = state[first : first + n] if in_place else state.index_select(0, slots).float()
    if bool(fresh.any()):
        h[fresh.to(h.device)] = 0
    return h, in_place


def write_states(state: torch.Tensor, slots: torch.Tensor, h: torch.Tensor, in_place: bool) -> None:
    """Store the updated states (nothing to do when they were a view updated in place)."""
    if not in_place:
        state.index_copy_(0, slots, h.to(state.dtype))
