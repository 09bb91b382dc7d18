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
- **Under a budget** (`Press.budgeted`, H2O): after the prompt's press the sequence keeps
  at most its kept count + a block: each decode's queries are captured, and once the cache
  has grown a block past the budget, the attention they paid is added to each token's
  accumulated score and the block's worth of lowest-scored tokens (never the `recent` last)
  leaves the cache by the same compaction. Decoding steps of such sequences take the per-op
  path (their queries are captured). A preempted one restarts its budget from the prompt's
  press (the scores accumulated over its decodes are gone).
- **No room.** The kept tokens go to fresh blocks while the pool has them (the old blocks
  then stay prefix-cache entries); when it does not, they are compacted in place into the
  sequence's own first blocks — those it alone holds, which stop being prefix-cache entries
  (handed to the KV tiers first, as an eviction's are) — and fresh blocks only where a first
  block is shared. Only when even those cannot be had is the sequence left unpressed
  (counted: `stats["skipped"]`), never corrupted.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from infergen.engine.kv_reread import reread_scores
from infergen.engine.request import Sequence, Status
from infergen.kvcache.block_pool import BlockPool
from infergen.kvcache.paged_cache import PagedKVCache
from infergen.kvcache.presses import PRESSES, Press, kept_count, kept_positions
from infergen.kvcache.presses.compact import cache_slots, compact_layer
from infergen.layers.forward_batch import ForwardBatch, QueryCapture


class KVPresser:
    """Runs each sequence's press (`Sequence.press`: its row and ratio), removing that share of
    its tokens at the end of its prompt (and, for a budgeted press, keeping it at that many
    during decode)."""

    def __init__(self, kv_cache: PagedKVCache, pool: BlockPool, scale: float,
                 forward: Callable[[ForwardBatch], torch.Tensor] | None = None,
                 encode: Callable[[str], list[int]] | None = None):  # fmt: skip
        self.kv_cache, self.pool = kv_cache, pool
        self.scale = scale  # the attention's softmax scale
        # a re-reading press's pass (engine/kv_reread.py): the model's forward on this cache,
        # and the tokenizer for its instruction (None: the prompt re-read without one)
        self.forward, self.encode = forward, encode
        # attention layers in the order they run (the capture's order)
        self.attention_layers = sorted(layer for group in kv_cache.groups for layer in group.layers)
        self._order = {layer: j for j, layer in enumerate(self.attention_layers)}
        # the groups a press compacts (sliding-window groups keep only their window anyway)
        self.full_groups = [g for g, group in enumerate(kv_cache.groups) if group.window is None]
        self._windows: dict[Sequence, list[list[torch.Tensor]]] = {}  # captured so far
        self._due: list[Sequence] = []  # prefills that end this step
        self._capture: QueryCapture | None = None
        self._owners: list[tuple[Sequence, int]] = []  # (sequence, rows) of the capture
        # budgeted presses: each pressed sequence's budget (tokens kept) and, per attention
        # layer, its cached tokens' accumulated scores [kv_heads, tokens scored]
        self._budgets: dict[Sequence, int] = {}
        self._scores: dict[Sequence, list[torch.Tensor]] = {}
        # pressed / skipped: sequences; blocks_pressed: the blocks they held before the press
        # in_place: groups compacted into their own blocks (the pool had too few free ones);
        # evictions: a budgeted press's decode-time compactions
        self.stats = {"pressed": 0, "skipped": 0, "in_place": 0, "tokens_removed": 0,
                      "blocks_pressed": 0, "blocks_freed": 0, "evictions": 0}  # fmt: skip

    def capture(self, seqs: list[Sequence], num_tokens: list[int]) -> QueryCapture | None:
        """Before a step of `seqs` computing `num_tokens` each: the rows whose queries the
        press needs (None: none), and which sequences it presses after the step."""
        self._due, self._owners = [], []
        rows: list[int] = []
        row = 0
        for seq, n in zip(seqs, num_tokens, strict=True):
            if seq.press is None:
                row += n
                continue
            window = seq.press.window
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            prompt = len(seq.prompt_token_ids)  # (the scheduler's chunks stop there)
            prefill = start < prompt and not seq.pressed
            if prefill and end == prompt:
                self._due.append(seq)
            first = max(start, prompt - window) if prefill and window else end
            budgeted = PRESSES.get(seq.press.name).budgeted
            if budgeted and (prefill or seq in self._budgets):  # every query, as computed
                first = start
            if (prefill or seq in self._budgets) and first < end:
                rows.extend(range(row + first - start, row + n))
                self._owners.append((seq, end - first))
            row += n
        self._capture = QueryCapture(torch.tensor(rows, dtype=torch.int64)) if rows else None
        return self._capture

    def after_step(self) -> None:
        """After the step `capture` saw, its tokens committed: keep the captured queries,
        press the sequences whose prompt ended, evict from those past their budget."""
        if self._capture is not None:
            if len(self._capture.queries) != len(self.attention_layers):
                raise RuntimeError(  # (a layer kind that does not capture its queries)
                    f"the KV press captured {len(self._capture.queries)} layers' queries, "
                    f"expected {len(self.attention_layers)}"
                )
            at = 0
            for seq, n in self._owners:
                queries = [q[at : at + n] for q in self._capture.queries]
                at += n
                if PRESSES.get(seq.press.name).budgeted:  # (scored at once: H2O)
                    if seq.status is Status.RUNNING:
                        self._accumulate(seq, queries)
                    continue
                kept = self._windows.setdefault(seq, [[] for _ in self.attention_layers])
                for layer, q in zip(kept, queries, strict=True):
                    layer.append(q)
            self._capture = None
        for seq in self._due:
            window = self._windows.pop(seq, None)
            if seq.status is Status.RUNNING and seq.num_computed_tokens == len(
                seq.prompt_token_ids
            ):
                queries = None if window is None else [torch.cat(q) for q in window]
                self.press_sequence(seq, queries)
        self._due = []
        size = self.kv_cache.block_size
        for seq, budget in list(self._budgets.items()):
            if seq.status is Status.RUNNING and self._cached(seq) >= budget + size:
                self._evict(seq)
        for seq in [s for s in self._scores if s.status is not Status.RUNNING]:
            self._scores.pop(seq)  # (finished or preempted: its scores go)
            self._budgets.pop(seq, None)
        for seq in [s for s in self._windows if s.status is not Status.RUNNING]:
            del self._windows[seq]  # (preempted or finished mid-prefill)

    def _accumulate(self, seq: Sequence, queries: list[torch.Tensor]) -> None:
        """A budgeted press: the attention the step's queries of `seq` (its last computed
        tokens, per attention layer) paid each of its cached tokens, added to their scores."""
        press, cached = PRESSES.get(seq.press.name), self._cached(seq)
        scores = self._scores.setdefault(seq, [None] * len(self.attention_layers))
        cache = self.kv_cache
        for g in self.full_groups:
            slots = cache_slots(seq.blocks[g], cached, cache.block_size, cache.device)
            for layer in cache.groups[g].layers:
                j = self._order[layer]
                kv = cache.layer(layer)
                keys, _ = kv.fmt.read(kv, slots, torch.float32)
                total = press.accumulated(keys, queries[j], self.scale)
                if scores[j] is not None:
                    total[:, : scores[j].shape[1]] += scores[j]
                scores[j] = total

    def _cached(self, seq: Sequence) -> int:
        """Tokens in `seq`'s cache (its first pressed group's: they all press alike)."""
        return seq.num_computed_tokens - seq.removed(self.full_groups[0])

    def press_sequence(self, seq: Sequence, queries: list[torch.Tensor] | None) -> bool:
        """Press `seq`'s computed tokens (`queries`: per attention layer in run order, the
        window's [window, heads, head_dim]); False when the pool had no room."""
        tokens = seq.num_computed_tokens
        press = PRESSES.get(seq.press.name)
        full = self.full_groups
        keeps = {g: kept_count(tokens, seq.press.ratio, share)
                 for g, share in zip(full, press.shares(len(full)), strict=True)}  # fmt: skip
        keep = kept_count(tokens, seq.press.ratio)
        if press.budgeted:  # (scores accumulated as the prompt was computed)
            choose = functools.partial(self._choose_budgeted, press=press,
                                       accumulated=self._scores[seq])  # fmt: skip
        elif press.rereads:  # (a second pass over the prompt scores it)
            instruction = self.encode(press.instruction) if self.encode is not None else []
            scores = reread_scores(seq, press, instruction, self.kv_cache, self.pool,
                                   self.forward, self.attention_layers, self.scale)  # fmt: skip
            if scores is None:
                self.stats["skipped"] += 1
                return False
            choose = functools.partial(self._choose_scored, scores=scores)
        else:
            choose = functools.partial(self._choose_once, press=press, queries=queries)
        if not self._compact(seq, keeps, choose):
            return False
        self.stats["pressed"] += 1
        self.stats["tokens_removed"] += sum(tokens - k for k in keeps.values()) // max(
            1, len(keeps)
        )
        if press.budgeted:
            self._budgets[seq] = keep
        return True

    def _evict(self, seq: Sequence) -> None:
        """A budgeted sequence a block past its budget: the lowest-scored tokens out."""
        keep, cached = self._budgets[seq], self._cached(seq)
        choose = functools.partial(self._choose_budgeted, press=PRESSES.get(seq.press.name),
                                   accumulated=self._scores[seq])  # fmt: skip
        if self._compact(seq, dict.fromkeys(self.full_groups, keep), choose):
            self.stats["evictions"] += 1
            self.stats["tokens_removed"] += cached - keep

    @staticmethod
    def _choose_scored(j: int, keys: torch.Tensor, keep: int, scores: list) -> torch.Tensor:
        """Layer j's kept positions by scores already computed (a re-reading press's)."""
        return kept_positions(scores[j], keep)

    def _choose_once(self, j: int, keys: torch.Tensor, keep: int, press: Press,
                     queries) -> torch.Tensor:  # fmt: skip
        """Attention layer j's kept positions [kv_heads, keep] by the press's scores."""
        q = None if queries is None else queries[j]
        return kept_positions(press.scores(keys, q, self.scale, self.attention_layers[j]), keep)

    @staticmethod
    def _choose_budgeted(j: int, keys: torch.Tensor, keep: int, press: Press,
                         accumulated: list) -> torch.Tensor:  # fmt: skip
        """Layer j's kept positions by its tokens' accumulated scores (`accumulated[j]`, every
        cached token's), the `recent` last always kept; `accumulated[j]` becomes the kept
        tokens' scores."""
        tokens = keys.shape[0]
        total = accumulated[j]
        ranked = total.clone()
        ranked[:, max(0, tokens - press.recent) :] = float("inf")
        chosen = kept_positions(ranked, keep)
        accumulated[j] = total.gather(1, chosen)
        return chosen

    def _compact(self, seq: Sequence, keeps: dict[int, int], choose) -> bool:
        """Keep `keeps[g]` of each full-attention group g's cached tokens, `choose(j, keys,
        keep)` picking attention layer j's [kv_heads, keep] cache indices; moved to fresh
        blocks, or in place when the pool has too few; False (nothing changed) when even that
        fails."""
        size = self.kv_cache.block_size
        groups = list(keeps)
        if not groups:
            return True
        counts = {g: -(-keeps[g] // size) for g in groups}  # each group's blocks after
        in_place = self.pool.num_free < sum(counts.values())
        # in place: each group's first blocks it alone holds are rewritten (None: fresh)
        reused = {
            g: [b if in_place and self.pool.refcount(b) == 1 else None
                for b in seq.blocks[g][: counts[g]]]
            for g in groups
        }  # fmt: skip
        if self.pool.num_free < sum(row.count(None) for row in reused.values()):
            self.stats["skipped"] += 1
            return False
        removed = list(seq.kv_removed or [0] * len(self.kv_cache.groups))
        device = self.kv_cache.device
        for g in groups:
            old, keep = seq.blocks[g], keeps[g]
            cached = seq.num_computed_tokens - removed[g]
            slots = cache_slots(old, cached, size, device)
            for block in (b for b in reused[g] if b is not None):
                self.pool.unpublish(block)
            new = [self.pool.allocate() if b is None else b for b in reused[g]]
            new_slots = cache_slots(new, keep, size, device)
            for layer in self.kv_cache.groups[g].layers:
                kv = self.kv_cache.layer(layer)
                keys, _ = kv.fmt.read(kv, slots, torch.float32)  # [cached, kv_heads, head_dim]
                chosen = choose(self._order[layer], keys, keep)
                compact_layer(kv, slots[chosen], new_slots)
            kept_blocks = set(new)  # (in place: the rewritten ones stay)
            self.pool.release([b for b in old if b not in kept_blocks])
            seq.blocks[g] = new
            removed[g] += cached - keep
            self.stats["in_place"] += in_place
            self.stats["blocks_pressed"] += len(old)
            self.stats["blocks_freed"] += len(old) - counts[g]
        seq.kv_removed = removed
        return True
