"""Rolling back the recurrent state of a sequence whose drafts were rejected (issue 24).

A recurrent mixer (Mamba2 SSM, gated DeltaNet) folds every token it computes into the
sequence's state slot (kvcache/state_cache.py): a step that verifies k drafts leaves the state
after all of them, and when only a < k were kept that state is wrong — attention layers just
ignore the KV past the kept tokens, a recurrent state cannot be cut back.

So before such a step the slot is copied (`save`: a few KB to a few MB a sequence; the
tensors of every state layer at the slot); after it, a sequence that kept every draft keeps
its state (`drop`), and one that did not gets the copy back (`restore`) and commits none of
the step's tokens: its last token, the kept drafts and the target's token become a chunk the
next step computes again (as a short prefill, which samples the token after them). The
attention layers' KV of those positions is rewritten with the same values. What a rejection
costs here is that recomputation, one step's worth of a+2 tokens.
"""

from __future__ import annotations

import torch

from infergen.kvcache.state_cache import StateCache


class StateRollback:
    def __init__(self, states: StateCache):
        self.states = states
        self._saved: dict[str, dict[int, dict[str, torch.Tensor]]] = {}

    def save(self, request_id: str, slot: int) -> None:
        """Copy the state in `slot` (the sequence's), before a step that verifies drafts."""
        self._saved[request_id] = {
            layer: {name: t[slot].clone() for name, t in tensors.items()}
            for layer, tensors in self.states.states.items()
        }

    def restore(self, request_id: str, slot: int) -> None:
        """Put the saved state back into `slot` (and forget it)."""
        for layer, tensors in self._saved.pop(request_id).items():
            for name, saved in tensors.items():
                self.states.states[layer][name][slot].copy_(saved)

    def drop(self, request_id: str) -> None:
        """Forget the saved state (the step's state was kept)."""
        self._saved.pop(request_id, None)
