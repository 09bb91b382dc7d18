"""The KV press in the engine (issue 25): when a sequence's prefill ends, a press
(kvcache/presses/) scores its cached tokens per layer and KV head, each head keeps its best
`kept_count` of them, and they move into fewer, new blocks (kvcache/presses/compact.py); the
old blocks go back to the pool — memory, not just reads, is freed.

- **Positions and cache indices.** A kept key keeps its RoPE position (keys are stored
  rotated); the sequence's cache index of a later position p is p − removed
  (`Sequence.kv_removed`, per cache group), which the runner's slots and attention plans use
  (engine/runner.rows_batch) and the scheduler's block counts (scheduler.grow).
- **Which groups.** Full-attention groups are pressed; sliding-window groups already hold
  only their window and are left as they are (Gemma-3's local layers).
- **Observation window.** A query-aware press (`Press.window` > 0, SnapKV) reads the queries
  of the last `window` computed tokens of every attention layer: captured during the steps
  that compute them (layers/forward_batch.QueryCapture; such steps take the per-op path).
- **Prefix cache.** The uncompressed blocks were hashed as the prompt was computed; they are
  released, not rewritten, so they stay valid prefix-cache entries for later requests. The
  new blocks are never hashed (a pressed sequence never serves a hit), never swapped or kept
  as a tail (scheduler.py checks `Sequence.pressed`).
- **Preemption** recomputes a pressed sequence as it first ran: the scheduler's chunks stop
  at the prompt's end (`stop_at_prompt_end`), the press runs there, and the tokens it had
  generated are computed after it, at the same cache indices as before.
- **No room.** The kept tokens go to fresh blocks while the pool has them (the old blocks
  then stay prefix-cache entries); when it does not, they are compacted in place into the
  sequence's own first blocks — those it alone holds, which stop being prefix-cache entries
  (handed to the KV tiers first, as an eviction's are) — and fresh blocks only where a first
  block is shared. Only when even those cannot be had is the sequence left unpressed
  (counted: `stats["skipped"]`), never corrupted.
"""

from __future__ import annotations

import torch

from infergen.engine.request import Sequence, Status
from infergen.kvcache.block_pool import BlockPool
from infergen.kvcache.paged_cache import PagedKVCache
from infergen.kvcache.presses import Press, kept_count, kept_positions
from infergen.kvcache.presses.compact import compact_layer
from infergen.layers.forward_batch import QueryCapture


class KVPresser:
    """Runs `press` removing `ratio` of each sequence's tokens at the end of its prefill."""

    def __init__(self, press: Press, ratio: float, kv_cache: PagedKVCache, pool: BlockPool,
                 scale: float):  # fmt: skip
        self.press, self.ratio, self.kv_cache, self.pool = press, ratio, kv_cache, pool
        self.scale = scale  # the attention's softmax scale
        # attention layers in the order they run (the capture's order)
        self.attention_layers = sorted(layer for group in kv_cache.groups for layer in group.layers)
        self._windows: dict[Sequence, list[list[torch.Tensor]]] = {}  # captured so far
        self._due: list[Sequence] = []  # prefills that end this step
        self._capture: QueryCapture | None = None
        self._owners: list[tuple[Sequence, int]] = []  # (sequence, rows) of the capture
        # pressed / skipped: sequences; blocks_pressed: the blocks they held before the press
        # in_place: groups compacted into their own blocks (the pool had too few free ones)
        self.stats = {"pressed": 0, "skipped": 0, "in_place": 0, "tokens_removed": 0,
                      "blocks_pressed": 0, "blocks_freed": 0}  # fmt: skip

    def capture(self, seqs: list[Sequence], num_tokens: list[int]) -> QueryCapture | None:
        """Before a step of `seqs` computing `num_tokens` each: the rows whose queries the
        press needs (None: none), and which sequences it presses after the step."""
        self._due, self._owners = [], []
        rows: list[int] = []
        row = 0
        window = self.press.window
        for seq, n in zip(seqs, num_tokens, strict=True):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            prompt = len(seq.prompt_token_ids)  # (the scheduler's chunks stop there)
            prefill = start < prompt and not seq.pressed
            if prefill and end == prompt:
                self._due.append(seq)
            first = max(start, prompt - window) if prefill and window else end
            if prefill and first < end:
                rows.extend(range(row + first - start, row + n))
                self._owners.append((seq, end - first))
            row += n
        self._capture = QueryCapture(torch.tensor(rows, dtype=torch.int64)) if rows else None
        return self._capture

    def after_step(self) -> None:
        """After the step `capture` saw, its tokens committed: keep the window's queries,
        press the sequences whose prefill ended (those still running)."""
        if self._capture is not None:
            if len(self._capture.queries) != len(self.attention_layers):
                raise RuntimeError(  # (a layer kind that does not capture its queries)
                    f"the KV press captured {len(self._capture.queries)} layers' queries, "
                    f"expected {len(self.attention_layers)}"
                )
            at = 0
            for seq, n in self._owners:
                kept = self._windows.setdefault(seq, [[] for _ in self.attention_layers])
                for layer, q in zip(kept, self._capture.queries, strict=True):
                    layer.append(q[at : at + n])
                at += n
            self._capture = None
        for seq in self._due:
            window = self._windows.pop(seq, None)
            if seq.status is Status.RUNNING and seq.num_computed_tokens == len(
                seq.prompt_token_ids
            ):
                queries = None if window is None else [torch.cat(q) for q in window]
                self.press_sequence(seq, queries)
        self._due = []
        for seq in [s for s in self._windows if s.status is not Status.RUNNING]:
            del self._windows[seq]  # (preempted or finished mid-prefill)

    def press_sequence(self, seq: Sequence, queries: list[torch.Tensor] | None) -> bool:
        """Press `seq`'s computed tokens (`queries`: per attention layer in run order, the
        window's [window, heads, head_dim]); False when the pool had no room."""
        tokens, size = seq.num_computed_tokens, self.kv_cache.block_size
        keep = kept_count(tokens, self.ratio)
        groups = [g for g, group in enumerate(self.kv_cache.groups) if group.window is None]
        if not groups:  # (ratio 0 still compacts: every token kept, moved to new blocks)
            return True
        new_count = -(-keep // size)
        in_place = self.pool.num_free < new_count * len(groups)
        # in place: each group's first blocks it alone holds are rewritten (None: fresh)
        reused = {
            g: [b if in_place and self.pool.refcount(b) == 1 else None
                for b in seq.blocks[g][:new_count]]
            for g in groups
        }  # fmt: skip
        if self.pool.num_free < sum(row.count(None) for row in reused.values()):
            self.stats["skipped"] += 1
            return False
        order = {layer: j for j, layer in enumerate(self.attention_layers)}
        removed = [0] * len(self.kv_cache.groups)
        for g in groups:
            old = seq.blocks[g]
            positions = torch.arange(tokens)
            table = torch.tensor(old, dtype=torch.int64)
            slots = (table[positions // size] * size + positions % size).to(self.kv_cache.device)
            for block in filter(None.__ne__, reused[g]):
                self.pool.unpublish(block)
            new = [self.pool.allocate() if b is None else b for b in reused[g]]
            new_table = torch.tensor(new, dtype=torch.int64)
            index = torch.arange(keep)
            new_slots = (new_table[index // size] * size + index % size).to(slots.device)
            for layer in self.kv_cache.groups[g].layers:
                kv = self.kv_cache.layer(layer)
                keys, _ = kv.fmt.read(kv, slots, torch.float32)  # [tokens, kv_heads, head_dim]
                q = None if queries is None else queries[order[layer]]
                chosen = kept_positions(self.press.scores(keys, q, self.scale, layer), keep)
                compact_layer(kv, slots[chosen], new_slots)
            kept_blocks = set(new)  # (in place: the rewritten ones stay)
            self.pool.release([b for b in old if b not in kept_blocks])
            seq.blocks[g] = new
            removed[g] = tokens - keep
            self.stats["in_place"] += in_place
            self.stats["blocks_pressed"] += len(old)
            self.stats["blocks_freed"] += len(old) - new_count
        seq.kv_removed = removed
        self.stats["pressed"] += 1
        self.stats["tokens_removed"] += tokens - keep
        return True
