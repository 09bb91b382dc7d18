"""Continuous batching scheduler: which sequences compute how many tokens this step.

Every step (under `max_num_batched_tokens` and `max_num_seqs`):
1. Running sequences, oldest admission first: a decode needs 1 token, an unfinished chunked
   prefill takes what is left of the budget. If the pool cannot supply a block, the most
   recently admitted running sequence is preempted (blocks freed, recomputed later, back at
   the head of the queue) — possibly the sequence itself. Never a crash, never a drop.
2. Waiting sequences in arrival order, if nothing was preempted this step: the longest cached
   prefix of full blocks is reused (refcounted), then the rest of the prompt is scheduled,
   chunked to the remaining budget. The admission policy (engine/admission.py) may reserve
   blocks for the sequence's whole life first: admitted only while the reservations fit.
   With KV tiers below the pool, prefix blocks found there are loaded back first — inline,
   or in the background while the sequence waits and those behind it may pass it — and a
   preempted sequence may be swapped out to the host tier instead of recomputed
   (engine/tier_moves.py, `preemption_mode`).

With `lookahead` k (speculative decoding), a decoding sequence is scheduled 1 + k tokens: its
last token and k drafts to verify (fewer near max_tokens); the caller commits the tokens that
were accepted (`commit`).

The performance model's simulator (perf/simulate.py) runs this class on predicted step times:
one set of scheduling rules for the engine and its prediction.

Blocks are kept per KV cache group (kvcache/groups.py). A sliding-window group returns a
block to the pool as soon as no later query can read it, so its share of a sequence stays
about window + chunk tokens however long the sequence grows; a prefix hit for such a group
needs only the blocks inside the window of the prefix's end. A model with recurrent layers
also gives each scheduled sequence a state slot (kvcache/state_cache.py), freed with its blocks;
its prompts resume from the prefix cache only where a state checkpoint exists
(kvcache/state_checkpoints.py): taken at block boundaries where a prefill chunk ends (the first
chunk of a prompt is cut at the end of the part earlier prompts computed), at a prompt's end,
and where a sequence finishes or is preempted; a hit resumes from the deepest checkpoint whose
full blocks are available, its partial block's KV restored from the checkpoint. An
attention-only model with the same store keeps "tails": the partial block where a prompt ends
or a sequence finishes inside a block, so the next turn of a conversation (prompt + answer +
new tokens) resumes after the last computed token, not at the last full block.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Sequence as Sequence_
from dataclasses import dataclass

from infergen.config import SchedulerConfig
from infergen.engine.admission import ADMISSION
from infergen.engine.request import Sequence, Status
from infergen.engine.tier_moves import TierMoves
from infergen.kvcache.block_pool import BlockPool
from infergen.kvcache.groups import (
    NO_BLOCK,
    CacheGroup,
    needed_entries,
    needed_positions,
    sequence_blocks,
)
from infergen.kvcache.prefix import extend_hashes, group_key
from infergen.kvcache.state_cache import SlotPool
from infergen.kvcache.state_checkpoints import StateCheckpoints, checkpoint_key
from infergen.kvcache.tiers.tiered import KVTiers


@dataclass
class ScheduledBatch:
    seqs: list[Sequence]
    num_tokens: list[int]  # tokens computed per sequence this step

    def __bool__(self) -> bool:
        return bool(self.seqs)


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        pool: BlockPool,
        block_size: int,
        groups: Sequence_[CacheGroup] = (CacheGroup(()),),
        states: SlotPool | None = None,
        max_model_len: int | None = None,
        lookahead: int = 0,
        tiers: KVTiers | None = None,
        checkpoints: StateCheckpoints | None = None,
    ):
        self.config = config
        self.pool = pool
        self.block_size = block_size
        self.groups = tuple(groups)
        self._windowed = any(group.window is not None for group in self.groups)
        self.states = states  # recurrent layers' state slots (one per running sequence)
        self.max_model_len = max_model_len
        self.lookahead = lookahead  # drafted tokens a decode step verifies
        # the KV tiers below the pool (kvcache/tiers/): prefix blocks missing from the pool are
        # loaded back from there at admission
        self.tiers = tiers
        # recurrent layers' states, and partial blocks, at chosen positions (None: none kept;
        # then a model with recurrent layers never resumes a prompt)
        self.checkpoints = checkpoints
        self.moves = TierMoves(
            tiers, pool, block_size, len(self.groups), group_key,
            functools.partial(needed_positions, self.groups, block_size), config.preemption_mode,
        )  # fmt: skip
        self.admission = ADMISSION.get(config.admission, where="scheduler.admission")
        self.reserved_blocks = 0  # the running sequences' reservations (admission policy)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running) or self.moves.in_flight

    def wait_for_loads(self, timeout: float) -> bool:
        """Block until a background tier load is done (at most `timeout` s); whether one
        is (False at once when none is in flight)."""
        return self.moves.wait(timeout)

    def longest(self, seq: Sequence) -> int:
        """The most tokens `seq` can reach: prompt + max_tokens, capped by the context."""
        tokens = len(seq.prompt_token_ids) + seq.params.max_tokens
        return tokens if self.max_model_len is None else min(tokens, self.max_model_len)

    def remaining(self, seq: Sequence) -> int:
        """The most tokens `seq` may still generate: max_tokens, capped by the context."""
        return self.longest(seq) - seq.num_tokens

    def blocks_for_tokens(self, tokens: int) -> int:
        """The most blocks one sequence of `tokens` tokens holds over all groups (a windowed
        group only its window and the chunk being computed)."""
        chunk = self.config.max_num_batched_tokens
        return sequence_blocks(self.groups, tokens, chunk, self.block_size)

    def commit(self, seq: Sequence, num_computed: int) -> None:
        """After a step: `num_computed` more tokens of `seq` have their KV in the cache (all
        that were scheduled, or a verify step's accepted ones); publish the full blocks."""
        seq.num_computed_tokens += num_computed
        registered = seq.num_registered_blocks
        self.register_full_blocks(seq)
        if self.checkpoints is None:
            return
        done, prompt = seq.num_computed_tokens, len(seq.prompt_token_ids)
        if seq.state_slot is not None:
            self.checkpoints.note(seq.block_hashes[registered : seq.num_registered_blocks])
            if done <= prompt and (done % self.block_size == 0 or done == prompt):
                self._checkpoint(seq)  # a prefill chunk's end on a boundary, the prompt's end
        elif self.states is None and done == prompt:
            self._checkpoint(seq)  # the prompt's tail (attention only)

    # ---- block accounting -------------------------------------------------------------------
    def grow(self, seq: Sequence, num_new: int) -> bool:
        """Give `seq` the blocks for its next `num_new` tokens in every group (after letting
        go of those that left a window). False when the pool cannot supply them."""
        if not seq.blocks:
            seq.blocks = [[] for _ in self.groups]
        if self._windowed:
            self._drop_out_of_window(seq)
        end = seq.num_computed_tokens + num_new
        # blocks per group (a pressed sequence's: fewer, engine/kv_press.py)
        totals = [-(-(end - seq.removed(g)) // self.block_size) for g in range(len(seq.blocks))]
        needed = sum(
            max(0, total - len(blocks)) for total, blocks in zip(totals, seq.blocks, strict=True)
        )
        if needed > self.pool.num_free:
            return False
        if self.states is not None and seq.state_slot is None:
            seq.state_slot = self.states.allocate()
            if seq.state_slot is None:
                return False
        if needed:
            for total, blocks in zip(totals, seq.blocks, strict=True):
                blocks.extend(self.pool.allocate() for _ in range(total - len(blocks)))
        return True

    def _drop_out_of_window(self, seq: Sequence) -> None:
        """Release the blocks of windowed groups that no query from here on reads. Those let
        go earlier form one run after the sink blocks, so the scan walks back from the first
        block still read until it meets one."""
        size = self.block_size
        for group, blocks in zip(self.groups, seq.blocks, strict=True):
            if group.window is None:
                continue
            keep = group.sink_blocks(size)  # (0 without sink tokens)
            j = min(group.first_needed_block(seq.num_computed_tokens, size), len(blocks)) - 1
            gone = []
            while j >= keep and blocks[j] != NO_BLOCK:
                gone.append(blocks[j])
                blocks[j] = NO_BLOCK
                j -= 1
            if gone:
                self.pool.release(gone[::-1])

    def release_blocks(self, seq: Sequence) -> None:
        """Drop the sequence's references to all its blocks (and its state slot)."""
        for blocks in seq.blocks:
            self.pool.release([b for b in blocks if b != NO_BLOCK])
        seq.blocks = []
        self.reserved_blocks -= seq.reserved_blocks
        seq.reserved_blocks = 0
        if seq.state_slot is not None:
            self.states.release(seq.state_slot)
            seq.state_slot = None

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        if self.states is None:
            self.moves.swap_out(seq)  # (preemption_mode: its blocks to the host tier)
        else:  # recurrent layers: a checkpoint (state + partial block) is their swap
            self._checkpoint(seq)
        self.release_blocks(seq)
        seq.num_computed_tokens = 0
        seq.num_registered_blocks = 0
        seq.kv_removed = []  # (recomputed in full, then pressed again)
        seq.num_preemptions += 1
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence) -> None:
        """Free a finished (or aborted) sequence's blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._checkpoint(seq)  # (a next turn extends prompt + answer)
        self.release_blocks(seq)
        self.moves.forget(seq)  # (a background load cancelled, a swapped copy dropped)
        seq.status = Status.FINISHED

    # ---- prefix cache -----------------------------------------------------------------------
    def _needed(self, group: int, blocks: list, n: int) -> list:
        return needed_entries(self.groups, self.block_size, group, blocks, n)

    def _key(self, group: int, block_hash: bytes) -> bytes:
        return group_key(group, block_hash)

    def _reuse_prefix(self, seq: Sequence) -> None:
        """Attach cached blocks for the longest shared prefix (at least one token stays
        uncomputed so the step produces logits): n blocks hit when every full-attention group
        has blocks 0..n-1 cached and every windowed group those its window still reads. With
        recurrent layers, the deepest state checkpoint over available blocks (none: 0)."""
        # the prefix may reach up to `last`: a query-aware KV press reads the queries of the
        # prompt's last `window` tokens (engine/kv_press.py), computed even when cached
        window = 1 if seq.press is None else max(1, seq.press.window)
        last = max(0, seq.num_tokens - window)
        limit = last // self.block_size
        if self.states is not None and self.checkpoints is None:
            limit = 0  # no state kept: no prefix to resume from
        extend_hashes(seq.block_hashes, seq.token_ids, self.block_size, limit)
        hits = [
            [self.pool.lookup(self._key(g, h)) for h in seq.block_hashes[:limit]]
            for g in range(len(self.groups))
        ]
        if self.tiers is not None:
            self._load_from_tiers(seq, hits, limit)
            if self.moves.loading(seq):  # in the background: admitted once it is done
                seq.blocks, seq.num_computed_tokens = [], 0
                return
        n = limit
        while n > 0:
            if all(None not in self._needed(g, hit, n) for g, hit in enumerate(hits)):
                break
            n -= 1
        resume = None
        if self.states is not None and limit:
            resume = self._find_checkpoint(seq, hits, last)
            n = 0 if resume is None else resume[0] // self.block_size
        elif self.states is None and self.checkpoints is not None:  # a tail past n blocks
            resume = self._find_checkpoint(seq, hits, last, tail_of=n)
        seq.blocks = []
        for group, hit in enumerate(hits):
            needed = set(self._needed(group, list(range(n)), n))
            for j in needed:
                self.pool.acquire(hit[j])
            seq.blocks.append([hit[j] if j in needed else NO_BLOCK for j in range(n)])
        seq.num_computed_tokens = n * self.block_size
        seq.num_registered_blocks = n
        if resume is not None:
            self._resume(seq, *resume)

    # ---- recurrent-state checkpoints --------------------------------------------------------
    def _checkpoint(self, seq: Sequence) -> None:
        """Keep the state of `seq` after its computed tokens (recurrent layers), with its
        partial block's pages when that position is inside a block (attention only: that
        tail alone, and only there)."""
        done = seq.num_computed_tokens
        if self.checkpoints is None or not done or seq.pressed:
            return
        if self.states is not None and seq.state_slot is None:
            return  # (recurrent layers: no state to keep)
        if self.states is None and done % self.block_size == 0:
            return  # (attention only: the full blocks say it all)
        q, r = divmod(done, self.block_size)
        extend_hashes(seq.block_hashes, seq.token_ids, self.block_size, q)
        key = checkpoint_key(
            seq.block_hashes[q - 1] if q else None, seq.token_ids[q * self.block_size : done]
        )
        partial = [blocks[q] for blocks in seq.blocks] if r else []
        self.checkpoints.save(seq.state_slot, done, key, partial)

    def _find_checkpoint(
        self, seq: Sequence, hits: list[list[int | None]], last: int, tail_of: int | None = None
    ):
        """(position ≤ `last`, checkpoint) of the deepest checkpoint of `seq` whose full
        blocks are in the pool (`hits`) and, inside a block, for which a state slot and a
        fresh block per group are free; None when there is none. `tail_of` n (attention
        only): a tail inside block n, after the n full blocks the prefix reuses."""
        if self.states is not None and self.states.num_free == 0:
            return None
        groups = range(len(hits))

        def usable(q: int, inside: bool) -> bool:
            needed = [b for g in groups for b in self._needed(g, hits[g], q)]
            if None in needed:
                return False
            idle = sum(1 for b in set(needed) if self.pool.refcount(b) == 0)
            return not inside or self.pool.num_free - idle >= len(hits)

        return self.checkpoints.find(seq.token_ids, seq.block_hashes, last, usable, block=tail_of)

    def _resume(self, seq: Sequence, position: int, data) -> None:
        """Restore the checkpoint found at `position` into `seq`: a state slot, and a fresh
        block per group for its partial block when the position is inside one."""
        if self.states is not None:
            seq.state_slot = self.states.allocate()
        partial = [self.pool.allocate() for _ in seq.blocks] if position % self.block_size else []
        for blocks, block in zip(seq.blocks, partial, strict=False):  # (none: at a boundary)
            blocks.append(block)
        self.checkpoints.restore(data, seq.state_slot, partial)
        seq.num_computed_tokens = position

    def _load_from_tiers(self, seq: Sequence, hits: list[list[int | None]], limit: int) -> None:
        """Fill pool misses from the tiers: the longest prefix whose needed blocks (every
        block of a full-attention group; a windowed group's sinks and last window) are each in
        the pool or a tier, when loading its tier blocks beats recomputing them (the tiers'
        cost rule). Loaded now (`hits` filled in, the blocks idle for the caller to acquire)
        or in the background (the sequence then waits: engine/tier_moves.py)."""
        room = self.pool.num_blocks - self.reserved_blocks - self.moves.held
        self.moves.fetch(seq, hits, limit, room)

    def register_full_blocks(self, seq: Sequence) -> None:
        """After a step: publish the sequence's newly completed blocks to the prefix cache."""
        full = seq.num_computed_tokens // self.block_size
        if full <= seq.num_registered_blocks or seq.pressed:  # (pressed: blocks ≠ positions)
            return
        extend_hashes(seq.block_hashes, seq.token_ids, self.block_size, full)
        for g, blocks in enumerate(seq.blocks):
            for j in range(seq.num_registered_blocks, full):
                if blocks[j] != NO_BLOCK:
                    parent = self._key(g, seq.block_hashes[j - 1]) if j else None
                    self.pool.register(blocks[j], self._key(g, seq.block_hashes[j]), parent)
        seq.num_registered_blocks = full

    # ---- the step ---------------------------------------------------------------------------
    def _wanted(self, seq: Sequence) -> int:
        """Tokens a running sequence computes next: what is uncomputed, or when it decodes
        with a lookahead, its last token + the drafts it may still use (the engine's drafts
        for this step, `seq.drafts`; the whole lookahead when none are given)."""
        if not self.lookahead:
            return seq.num_uncomputed
        generated = seq.num_tokens - len(seq.prompt_token_ids)
        if seq.num_uncomputed != 1 or not generated:
            return seq.num_uncomputed
        left = self.remaining(seq)
        drafted = self.lookahead if seq.drafts is None else min(self.lookahead, len(seq.drafts))
        return 1 + max(0, min(drafted, left - 1))

    def _prompt_blocks(self, seq: Sequence) -> int:
        """Blocks `seq` still needs for its whole prompt (beyond those it holds; a windowed
        group only its window)."""
        held = sum(b != NO_BLOCK for blocks in seq.blocks for b in blocks)
        return max(0, self.blocks_for_tokens(len(seq.prompt_token_ids)) - held)

    def _to_prompt_end(self, seq: Sequence, num_new: int) -> int:
        """`num_new`, cut at the prompt's end for a sequence with a KV press: the press runs
        there, so a preempted one's recompute reaches it as the first run did. (Such a
        sequence is also admitted only while its whole prompt's blocks are free: the press
        frees most of them at the prompt's end, and admitted on its first chunk alone a
        newcomer would run out mid-prompt and be preempted, again and again.)"""
        prompt = len(seq.prompt_token_ids)
        if seq.press is not None and seq.num_computed_tokens < prompt:
            return min(num_new, prompt - seq.num_computed_tokens)
        return num_new

    def schedule(self) -> ScheduledBatch:
        budget = self.config.max_num_batched_tokens
        batch = ScheduledBatch([], [])
        preempted = False
        for seq in list(self.running):
            if budget <= 0:
                break
            if seq.status is not Status.RUNNING:  # preempted earlier in this loop
                continue
            num_new = self._to_prompt_end(seq, min(self._wanted(seq), budget))
            while not self.grow(seq, num_new):
                victim = self.running[-1]
                self.preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                continue
            batch.seqs.append(seq)
            batch.num_tokens.append(num_new)
            budget -= num_new
        self.moves.reap()
        i = 0  # waiting[i]: the next to consider (those loading from a tier are passed over)
        while i < len(self.waiting) and not preempted and budget > 0:
            if len(self.running) >= self.config.max_num_seqs:
                break
            seq = self.waiting[i]
            if self.moves.waits(seq):  # its prefix is being loaded from a tier
                i += 1
                continue
            first_admission = seq.num_cached_prompt_tokens is None
            self._reuse_prefix(seq)
            if self.moves.loading(seq):  # a background load began: it waits for it
                self.release_blocks(seq)
                seq.num_computed_tokens = 0
                i += 1
                continue
            self.moves.swap_in(seq)
            num_new = self._to_prompt_end(seq, seq.num_uncomputed)
            if self.states is not None and self.checkpoints is not None:
                # (recurrent layers) end the chunk where earlier prompts' part ends
                end = self.checkpoints.shared_end(
                    seq.block_hashes, seq.num_computed_tokens, seq.num_tokens
                )
                num_new = num_new if end is None else end - seq.num_computed_tokens
            if num_new > budget:
                if not self.config.enable_chunked_prefill and batch:
                    self.release_blocks(seq)
                    break
                num_new = budget if self.config.enable_chunked_prefill else num_new
            reserve = self.admission(self, seq)
            fits = self.reserved_blocks + self.moves.held + reserve <= self.pool.num_blocks
            if fits and seq.press is not None and self.running:  # its prompt, a block a decode
                fits = self._prompt_blocks(seq) + len(self.running) <= self.pool.num_free
            if not fits or not self.grow(seq, num_new):
                self.release_blocks(seq)
                seq.num_computed_tokens = 0
                break
            seq.reserved_blocks, self.reserved_blocks = reserve, self.reserved_blocks + reserve
            if first_admission:
                seq.num_cached_prompt_tokens = seq.num_computed_tokens
            del self.waiting[i]
            self.moves.admitted(seq)
            seq.status = Status.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_tokens.append(num_new)
            budget -= num_new
        return batch
