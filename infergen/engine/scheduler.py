"""Continuous batching scheduler: which sequences compute how many tokens this step.

Every step (under `max_num_batched_tokens` and `max_num_seqs`):
1. Running sequences, oldest admission first: a decode needs 1 token, an unfinished chunked
   prefill takes what is left of the budget. If the pool cannot supply a block, the most
   recently admitted running sequence is preempted (blocks freed, recomputed later, back at
   the head of the queue) — possibly the sequence itself. Never a crash, never a drop.
2. Waiting sequences in arrival order, if nothing was preempted this step: the longest cached
   prefix of full blocks is reused (refcounted), then the rest of the prompt is scheduled,
   chunked to the remaining budget.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from infergen.config import SchedulerConfig
from infergen.engine.request import Sequence, Status
from infergen.kvcache.block_pool import BlockPool
from infergen.kvcache.prefix import extend_hashes


@dataclass
class ScheduledBatch:
    seqs: list[Sequence]
    num_tokens: list[int]  # tokens computed per sequence this step

    def __bool__(self) -> bool:
        return bool(self.seqs)


class Scheduler:
    def __init__(self, config: SchedulerConfig, pool: BlockPool, block_size: int):
        self.config = config
        self.pool = pool
        self.block_size = block_size
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- block accounting -------------------------------------------------------------------
    def _blocks_needed(self, seq: Sequence, num_new: int) -> int:
        total = -(-(seq.num_computed_tokens + num_new) // self.block_size)
        return max(0, total - len(seq.block_ids))

    def grow(self, seq: Sequence, num_new: int) -> bool:
        needed = self._blocks_needed(seq, num_new)
        if needed > self.pool.num_free:
            return False
        seq.block_ids.extend(self.pool.allocate() for _ in range(needed))
        return True

    def _release(self, seq: Sequence) -> None:
        self.pool.release(seq.block_ids)
        seq.block_ids = []

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.num_computed_tokens = 0
        seq.num_registered_blocks = 0
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
        self._release(seq)
        seq.status = Status.FINISHED

    # ---- prefix cache -----------------------------------------------------------------------
    def _reuse_prefix(self, seq: Sequence) -> None:
        """Attach cached blocks for the longest shared prefix (at least one token stays
        uncomputed so the step produces logits)."""
        limit = (seq.num_tokens - 1) // self.block_size
        extend_hashes(seq.block_hashes, seq.token_ids, self.block_size, limit)
        for j in range(limit):
            block = self.pool.lookup(seq.block_hashes[j])
            if block is None:
                break
            self.pool.acquire(block)
            seq.block_ids.append(block)
        seq.num_computed_tokens = len(seq.block_ids) * self.block_size
        seq.num_registered_blocks = len(seq.block_ids)

    def register_full_blocks(self, seq: Sequence) -> None:
        """After a step: publish the sequence's newly completed blocks to the prefix cache."""
        full = seq.num_computed_tokens // self.block_size
        if full <= seq.num_registered_blocks:
            return
        extend_hashes(seq.block_hashes, seq.token_ids, self.block_size, full)
        for j in range(seq.num_registered_blocks, full):
            self.pool.register(seq.block_ids[j], seq.block_hashes[j])
        seq.num_registered_blocks = full

    # ---- the step ---------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        budget = self.config.max_num_batched_tokens
        batch = ScheduledBatch([], [])
        preempted = False
        for seq in list(self.running):
            if budget <= 0:
                break
            if seq.status is not Status.RUNNING:  # preempted earlier in this loop
                continue
            num_new = min(seq.num_uncomputed, budget)
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
        while self.waiting and not preempted and budget > 0:
            if len(self.running) >= self.config.max_num_seqs:
                break
            seq = self.waiting[0]
            first_admission = seq.num_cached_prompt_tokens is None
            self._reuse_prefix(seq)
            num_new = seq.num_uncomputed
            if num_new > budget:
                if not self.config.enable_chunked_prefill and batch:
                    self._release(seq)
                    break
                num_new = budget if self.config.enable_chunked_prefill else num_new
            if not self.grow(seq, num_new):
                self._release(seq)
                seq.num_computed_tokens = 0
                break
            if first_admission:
                seq.num_cached_prompt_tokens = seq.num_computed_tokens
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_tokens.append(num_new)
            budget -= num_new
        return batch
