"""Prefix checkpoints: reuse past the full blocks of the prefix index (issue 23, item 5).

KV blocks alone cannot resume a prompt of a model with recurrent (SSM / DeltaNet) layers: those
need their state after the shared tokens. And the prefix index registers full blocks only, so
any model recomputes the tokens of a shared part's last, partial block — a conversation's next
turn recomputes up to block_size - 1 tokens of the previous prompt + answer before its new
ones (SGLang's radix cache reuses at token granularity). This store keeps, at chosen positions,
a copy of what resuming there needs beyond the full blocks before it: a sequence's state
(every recurrent layer's tensors of its slot, state_cache.py; none for an attention-only
model), and for a position inside a block the partial block's contents in each attention
group. Full blocks before the position come from the prefix index (the pool or the KV tiers),
as for any model.

Key of position p: BLAKE2b over b"state", the chained hash of the full blocks before p
(kvcache/prefix.py; none at the first block) and the token ids of the partial block — two
sequences share a key only if they share tokens[:p].

The scheduler takes checkpoints (engine/scheduler.py) where a later request is likely to
resume: with recurrent layers at block boundaries where a prefill chunk ends (a chunk is cut
at the end of the part a prompt shares with earlier ones), at the end of each prompt, and where
a sequence finishes or is preempted (a conversation's next turn extends prompt + answer); an
attention-only model only where a prompt ends or a sequence finishes inside a block (a
partial block's "tail"; at a boundary the full blocks say it all). A lookup takes the deepest
position whose checkpoint exists and whose full blocks are available (attention-only: a tail
just past the prefix's full blocks).

Budget: the checkpoints held here never exceed `budget_bytes`; least recently used go first —
to the KV tiers (the host tier, then disk: `spill`) when there are, where a later lookup
finds them again (and, on disk, after a restart). With the tiers' write-through, each new
checkpoint is also copied to the disk tier at once (`through`), as the KV blocks are.

A checkpoint is one flat byte tensor on the cache's device: the position (int64), then each
recurrent layer's state tensors of one slot (layers and names in a fixed order; none without
recurrent layers), then — when the position is inside a block — the partial block's page of
each attention group.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from infergen.kvcache.paged_cache import PagedKVCache

Spill = Callable[[bytes, torch.Tensor], None]  # (key, flat checkpoint on the host)
Fetch = Callable[[bytes], torch.Tensor | None]  # key → a spilled checkpoint, or None
SEEN_LIMIT = 1 << 18  # chained block hashes remembered as computed (16 B each + dict cost)


def checkpoint_key(anchor: bytes | None, partial: Sequence[int]) -> bytes:
    """The key of the position after `partial` tokens following the full blocks of `anchor`."""
    digest = hashlib.blake2b(b"state", digest_size=16)
    digest.update(anchor or b"root")
    digest.update(array("q", partial).tobytes())
    return digest.digest()


class StateCheckpoints:
    def __init__(
        self,
        kv_cache: PagedKVCache,
        budget_bytes: int,
        spill: Spill | None = None,
        fetch: Fetch | None = None,
        through: Spill | None = None,
    ):
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.budget_bytes = budget_bytes
        self.spill, self.fetch = spill, fetch
        self.through = through  # each new checkpoint copied down at once (write-through)
        states = kv_cache.states.states if kv_cache.states is not None else {}
        self._tensors = [  # (none: an attention-only model's checkpoints are tails)
            (layer, name, tensor)
            for layer, layer_states in sorted(states.items())
            for name, tensor in sorted(layer_states.items())
        ]
        self.state_bytes = sum(t[0].numel() * t.element_size() for _, _, t in self._tensors)
        self._held: OrderedDict[bytes, torch.Tensor] = OrderedDict()  # LRU first
        self._seen: OrderedDict[bytes, None] = OrderedDict()  # block hashes computed lately
        self.nbytes = 0
        self.stats = dict(saved=0, hits=0, tier_hits=0, misses=0, evictions=0, spilled=0,
                          tokens_resumed=0)  # fmt: skip

    # ---- which prefixes were computed ---------------------------------------------------
    def note(self, block_hashes: Sequence[bytes]) -> None:
        """These chained block hashes were computed by a sequence (a later prompt sharing them
        gets a checkpoint at their end: `shared_end`)."""
        for key in block_hashes:
            self._seen[key] = None
            self._seen.move_to_end(key)
        while len(self._seen) > SEEN_LIMIT:
            self._seen.popitem(last=False)

    def shared_end(self, block_hashes: Sequence[bytes], start: int, stop: int) -> int | None:
        """The last block boundary j·block_size in (start, stop) whose tokens before it an
        earlier sequence computed (its chained hash noted), or None."""
        size = self.block_size
        for j in range(min(len(block_hashes), (stop - 1) // size), start // size, -1):
            if block_hashes[j - 1] in self._seen:
                return j * size
        return None

    # ---- save -----------------------------------------------------------------------------
    def save(
        self, slot: int | None, position: int, key: bytes, partial_blocks: Sequence[int]
    ) -> None:
        """Keep the state of `slot` (after `position` tokens; None: no recurrent layers) under
        `key`, with the pages of `partial_blocks` (one per attention group) when `position` is
        inside a block."""
        if key in self._held:
            self._held.move_to_end(key)
            return
        flat = self._pack(slot, position, partial_blocks)
        size = flat.numel()
        self.stats["saved"] += 1
        if self.through is not None:
            self.through(key, flat.to("cpu"))
        if size > self.budget_bytes:  # larger than the budget: straight to the tiers
            if self.spill is not None:
                self.spill(key, flat.to("cpu"))
                self.stats["spilled"] += 1
            return
        while self.nbytes + size > self.budget_bytes:
            self._evict()
        self._held[key] = flat
        self.nbytes += size

    def _pack(self, slot: int | None, position: int, partial_blocks: Sequence[int]) -> torch.Tensor:
        """The flat checkpoint of the module docstring (its bytes, on the cache's device)."""
        parts = [torch.tensor([position], dtype=torch.int64, device=self.kv_cache.device)]
        parts += [tensor[slot] for _, _, tensor in self._tensors]  # (none: slot None)
        if position % self.block_size:
            parts += [self.kv_cache.page(block) for block in partial_blocks]
        return torch.cat([p.detach().contiguous().view(torch.uint8).flatten() for p in parts])

    def _evict(self) -> None:
        key, flat = self._held.popitem(last=False)
        self.nbytes -= flat.numel()
        self.stats["evictions"] += 1
        if self.spill is not None:
            self.spill(key, flat.to("cpu"))
            self.stats["spilled"] += 1

    # ---- find and restore -----------------------------------------------------------------
    def find(
        self,
        token_ids: Sequence[int],
        block_hashes: Sequence[bytes],
        last: int,
        usable: Callable[[int, bool], bool],
        block: int | None = None,
    ) -> tuple[int, torch.Tensor] | None:
        """The deepest checkpoint at a position p ≤ `last` of these tokens whose full blocks
        are available (`usable(p // block_size, p inside a block)`): (p, its data) or None.
        `block` q: only positions inside block q (a tail after q full blocks)."""
        size = self.block_size
        deepest = min(last // size, len(block_hashes))
        depths = range(deepest, -1, -1) if block is None else [block] if block <= deepest else []
        for q in depths:
            anchor = block_hashes[q - 1] if q else None
            top = min(size - 1, last - q * size)
            stop = -1 if q and block is None else 0  # (position 0 is no checkpoint; a tail r > 0)
            whole, inside = stop < 0 and usable(q, False), usable(q, True)  # (whole: r = 0)
            for r in range(top, stop, -1):
                if not (inside if r else whole):
                    continue
                key = checkpoint_key(anchor, token_ids[q * size : q * size + r])
                data = self._get(key)
                if data is not None:
                    self.stats["hits"] += 1
                    self.stats["tokens_resumed"] += q * size + r
                    return q * size + r, data
        self.stats["misses"] += 1
        return None

    def _get(self, key: bytes) -> torch.Tensor | None:
        data = self._held.get(key)
        if data is not None:
            self._held.move_to_end(key)
            return data
        if self.fetch is not None:
            data = self.fetch(key)
            if data is not None and data.numel() >= 8:
                self.stats["tier_hits"] += 1
                return data.to(self.kv_cache.device)
        return None

    @staticmethod
    def position(data: torch.Tensor) -> int:
        """The position a checkpoint's state is after (its tokens)."""
        return int(data[:8].view(torch.int64).item())

    def restore(self, data: torch.Tensor, slot: int | None, partial_blocks: Sequence[int]) -> int:
        """Write a checkpoint's state into `slot` (None: no recurrent layers) and its partial
        pages into `partial_blocks` (one per attention group, when its position is inside a
        block); returns the position."""
        position = self.position(data)
        offset = 8
        for _, _, tensor in self._tensors:
            row = tensor[slot]
            n = row.numel() * row.element_size()
            row.copy_(data[offset : offset + n].view(row.dtype).view(row.shape))
            offset += n
        if position % self.block_size:
            for block in partial_blocks:
                page = self.kv_cache.page(block)
                n = page.numel() * page.element_size()
                page.copy_(data[offset : offset + n].view(page.dtype).view(page.shape))
                offset += n
        return position
