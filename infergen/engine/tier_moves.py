"""`TierMoves`: the scheduler's traffic with the KV tiers below its pool (kvcache/tiers/):
prefix blocks loaded back at admission, inline or in the background, and preempted sequences
swapped out to the host tier and back (issue 23, items 2 and 3).

Loads (`fetch`, from Scheduler._reuse_prefix when a waiting sequence is considered):
- the longest prefix whose needed blocks are each in the pool or a tier is found; its tier
  blocks are loaded when the tiers' cost rule says loading beats recomputing them (always for
  a swapped-out sequence: its blocks went there to come back);
- pool blocks are allocated for them (as many as the pool can give) and the prefix's pool hits
  are held, so that no allocation evicts them meanwhile;
- a load expected to stall the next step by little (`KVTiers.loads_inline`: host-tier hits of
  a few dozen blocks) runs at once: its blocks are registered in the prefix index and go back
  to idle with the held ones, for _reuse_prefix to acquire;
- any other goes to the tiers' background loader. The sequence stays in the waiting queue,
  loading (`loading` / `waits`), while the running sequences step and later ones may be
  admitted past it. Its blocks stay held and unregistered (no step reads them, no one else
  gets them) until a `schedule()` finds the job done (`reap`, after the running sequences
  grew, before any admission): the blocks that loaded are registered then (a job stops at its
  first block no tier serves; the rest is recomputed) and the sequence is admitted through
  the prefix index like any other, in its place in the queue. While held, the blocks count as
  reserved in the admission check (the "reserve" policy's guarantee holds).
- one background load at a time (the loader copies one job after another anyway): a sequence
  whose load would go to the background while another is in flight waits for its turn
  (`deferred`), in arrival order among those that load, and sequences that load nothing
  are still admitted past it; so the blocks held by loads stay one job's worth, and a finished
  job's blocks never keep the head of the queue out.
- one background load per sequence until it is admitted: after one has settled, what is
  missing (a block that failed; one evicted again while the sequence waited for room) is
  loaded inline when that is cheap, else recomputed — a sequence waiting at the head of the
  queue is never passed over again, so none starves.
- a loading sequence that finishes (aborted: `forget`) cancels its job: its blocks go back to
  the pool as soon as the job stops (the block being copied completes first), at the next
  `reap` (every `schedule()`; `in_flight` keeps the engine stepping until then).

Swaps (`swap_out` from Scheduler.preempt; `swap_in` at re-admission), with preemption_mode
"swap", or "auto" when the tiers can swap (a host tier; prefix caching on) and their cost rule
says loading the sequence's computed tokens back beats recomputing them:
- the preempted sequence's full blocks are copied to the host tier under their prefix keys,
  and its last partial block under a key of its own (`_partial_key`: unique to this process
  and preemption; parented by the last full block's key, so the tier keeps the chain while the
  copy waits);
- at re-admission the full blocks come back through the prefix index (loaded whatever the cost
  rule says, inline or in the background by the same rule), then the partial one is loaded
  into a new block and the sequence resumes with all its computed tokens: nothing is
  recomputed. The partial copy leaves the tier once the sequence is admitted (or finishes).
- what the host tier could not take is recomputed.

Counted in the tiers' stats: loads inline / in the background / failed / cancelled and their
seconds, preemptions swapped / recomputed.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from infergen.engine.request import Sequence
from infergen.errors import ConfigError
from infergen.kvcache.block_pool import BlockPool
from infergen.kvcache.groups import NO_BLOCK
from infergen.kvcache.prefix import extend_hashes
from infergen.kvcache.tiers.loader import LoadJob
from infergen.kvcache.tiers.tiered import KVTiers

Key = Callable[[int, bytes], bytes]  # (group, block hash) → the block's prefix-cache key
Needed = Callable[[int, int], list[int]]  # (group, n) → positions of the first n blocks read


@dataclass(eq=False)
class _Load:
    # per block of the job: group, position, prefix key, parent key
    entries: list[tuple[int, int, bytes, bytes | None]]
    held: list[int]  # pool blocks held meanwhile: the prefix's pool hits and the job's blocks
    job: LoadJob | None = None
    settled: bool = False


@dataclass(eq=False)
class _Swap:
    computed: int  # tokens computed when preempted
    partial_keys: list[bytes] = field(default_factory=list)  # per group, if a partial block


class TierMoves:
    def __init__(
        self,
        tiers: KVTiers | None,
        pool: BlockPool,
        block_size: int,
        num_groups: int,
        key: Key,
        needed: Needed,
        preemption_mode: str,
    ):
        self.tiers = tiers
        self.pool = pool
        self.block_size = block_size
        self.num_groups = num_groups
        self.key = key
        self.needed = needed
        self.loads: dict[Sequence, _Load] = {}
        self.cancelled: list[_Load] = []  # jobs of finished sequences, until they stop
        self.deferred: set[Sequence] = set()  # their load waits for the loader to be free
        self.swapped: dict[Sequence, _Swap] = {}
        self._salt = secrets.token_bytes(16)  # partial keys of this process only
        can_swap = tiers is not None and tiers.can_swap and pool.enable_prefix_caching
        if preemption_mode == "swap" and not can_swap:
            raise ConfigError(
                "preemption by swap needs a host-memory KV tier and prefix caching",
                where="preemption_mode",
                found="swap",
                expected="kv_offload_memory set and prefix caching on (no sparse decode), "
                "or preemption_mode 'auto' / 'recompute'",
            )
        self.mode = preemption_mode if can_swap else "recompute"

    # ---- loads ------------------------------------------------------------------------------
    @property
    def held(self) -> int:
        """Pool blocks held by background loads (the admission check counts them reserved)."""
        pending = [load for load in self.loads.values() if not load.settled] + self.cancelled
        return sum(len(load.held) for load in pending)

    @property
    def in_flight(self) -> bool:
        """A background load has not been settled yet."""
        return self._busy()

    def loading(self, seq: Sequence) -> bool:
        """`seq` has a background load not settled yet, or one deferred until the loader is
        free: it is not admitted now."""
        load = self.loads.get(seq)
        return seq in self.deferred or (load is not None and not load.settled)

    def waits(self, seq: Sequence) -> bool:
        """Whether `seq` still waits on its background load, or for the loader to take it
        (a done load is settled here)."""
        if seq in self.deferred:
            return self._busy()
        if not self.loading(seq):
            return False
        load = self.loads[seq]
        if not load.job.done:
            return True
        self._settle(load)
        return False

    def wait(self, timeout: float) -> bool:
        """Block until a background load is done (at most `timeout` s); whether one is."""
        pending = [load for load in self.loads.values() if not load.settled] + self.cancelled
        return self.tiers is not None and self.tiers.wait_any([p.job for p in pending], timeout)

    def reap(self) -> None:
        """Settle every job that is done: the blocks that loaded are registered, the held ones
        let go (a finished job never holds blocks that a waiting sequence needs)."""
        for load in [load for load in self.cancelled if load.job.done]:
            self.cancelled.remove(load)
            self._settle(load)
        for load in self.loads.values():
            if not load.settled and load.job.done:
                self._settle(load)

    def fetch(self, seq: Sequence, hits: list[list[int | None]], limit: int, room: int) -> None:
        """Fill pool misses of `seq`'s first `limit` blocks (`hits`: per group, the pool block
        of each position or None) from the tiers, inline (`hits` filled in) or in the
        background (`loading(seq)` afterwards); `room`: blocks a background load may hold."""
        self.deferred.discard(seq)
        if self.tiers is None or not self.pool.enable_prefix_caching:
            return
        groups = range(len(hits))
        keys = [[self.key(g, h) for h in seq.block_hashes[:limit]] for g in groups]
        n = limit
        while n > 0 and not all(
            hits[g][j] is not None or keys[g][j] in self.tiers
            for g in groups
            for j in self.needed(g, n)
        ):
            n -= 1
        wanted = sorted((j, g) for g in groups for j in self.needed(g, n) if hits[g][j] is None)
        if not wanted:
            return
        inline = self.tiers.loads_inline([keys[g][j] for j, g in wanted])
        if not inline and seq in self.loads:  # its one background load has settled
            return
        if not inline and self._busy():  # another load is in flight: this one waits its turn
            self.deferred.add(seq)
            return
        wanted_keys = [keys[g][j] for j, g in wanted]
        if seq not in self.swapped and not self.tiers.worth_loading(wanted_keys):
            return
        self.tiers.touch(wanted_keys)  # (the allocations' evictions must not push them out)
        held = [hits[g][j] for g in groups for j in self.needed(g, n) if hits[g][j] is not None]
        for block in held:  # (acquired first: allocating must not evict them)
            self.pool.acquire(block)
        count = min(len(wanted), self.pool.num_free)
        if not inline:
            count = min(count, room - len(held))
        if count <= 0:
            self.pool.release(held)
            return
        blocks = [self.pool.allocate() for _ in range(count)]
        entries = [(g, j, keys[g][j], keys[g][j - 1] if j else None) for j, g in wanted[:count]]
        load = _Load(entries, held + blocks)
        block_keys = [key for _, _, key, _ in entries]
        if inline:
            loaded = self.tiers.load_now(block_keys, blocks)
            for (g, j, _, _), block in zip(entries[:loaded], blocks, strict=False):
                hits[g][j] = block
            self._publish(load, blocks, loaded)
        else:
            load.job = self.tiers.load_async(block_keys, blocks)
            self.loads[seq] = load

    def _busy(self) -> bool:
        return bool(self.cancelled) or any(not load.settled for load in self.loads.values())

    def admitted(self, seq: Sequence) -> None:
        """`seq` was admitted: its settled load and its swapped partial copies are done with."""
        self.loads.pop(seq, None)
        self._drop_swap(seq)

    def forget(self, seq: Sequence) -> None:
        """`seq` finished (or was aborted): cancel its background load, drop its swap."""
        self.deferred.discard(seq)
        load = self.loads.pop(seq, None)
        if load is not None and not load.settled:
            load.job.cancelled = True
            self.cancelled.append(load)
            self.reap()
        self._drop_swap(seq)

    def _settle(self, load: _Load) -> None:
        try:
            loaded = self.tiers.settle(load.job)
        except BaseException:  # the loader failed (a bug): its blocks go back, the error up
            self._publish(load, load.job.blocks, 0)
            raise
        self._publish(load, load.job.blocks, loaded)

    def _publish(self, load: _Load, blocks: list[int], loaded: int) -> None:
        """Register the first `loaded` blocks in the prefix index; let go of the held ones
        (registered: idle, found by lookups; the others: free)."""
        for (_, _, key, parent), block in zip(load.entries[:loaded], blocks, strict=False):
            self.pool.register(block, key, parent)
        self.pool.release(load.held)
        load.settled = True

    # ---- swaps ------------------------------------------------------------------------------
    def swap_out(self, seq: Sequence) -> None:
        """`seq` is being preempted (its blocks still held): copy them to the host tier when
        the preemption mode says swap; counted either way."""
        if self.tiers is None:
            return
        computed = seq.num_computed_tokens
        swap = self.mode == "swap" or (self.mode == "auto" and self.tiers.worth_swapping(computed))
        if not swap or not computed or seq.pressed:  # (pressed: its blocks ≠ positions)
            self.tiers.preemptions["recompute"] += 1
            return
        full, partial = divmod(computed, self.block_size)
        extend_hashes(seq.block_hashes, seq.token_ids, self.block_size, full)
        record = _Swap(computed)
        for g, blocks in enumerate(seq.blocks):
            for j in range(full):
                if blocks[j] != NO_BLOCK:
                    key = self.key(g, seq.block_hashes[j])
                    self.tiers.swap_out(blocks[j], key, self._parent(seq, g, j))
            if partial:
                record.partial_keys.append(self._partial_key(seq, g))
                self.tiers.swap_out(
                    blocks[full], record.partial_keys[-1], self._parent(seq, g, full)
                )
        self.swapped[seq] = record
        self.tiers.preemptions["swap"] += 1

    def swap_in(self, seq: Sequence) -> None:
        """After _reuse_prefix attached a swapped-out sequence's full blocks: load its partial
        block into a new block of each group, and the sequence has all its computed tokens
        again (left as it is when a full block or the partial copy did not come back)."""
        record = self.swapped.get(seq)
        if record is None or not record.partial_keys:
            return
        full_tokens = record.computed // self.block_size * self.block_size
        if seq.num_computed_tokens != full_tokens or self.pool.num_free < len(seq.blocks):
            return
        blocks = [self.pool.allocate() for _ in seq.blocks]
        if self.tiers.load_now(record.partial_keys, blocks) < len(blocks):
            self.pool.release(blocks)
            return
        for group_blocks, block in zip(seq.blocks, blocks, strict=True):
            group_blocks.append(block)
        seq.num_computed_tokens = record.computed

    def _drop_swap(self, seq: Sequence) -> None:
        record = self.swapped.pop(seq, None)
        if record is not None:
            for key in record.partial_keys:
                self.tiers.discard(key)

    def _parent(self, seq: Sequence, group: int, j: int) -> bytes | None:
        return self.key(group, seq.block_hashes[j - 1]) if j else None

    def _partial_key(self, seq: Sequence, group: int) -> bytes:
        """The tier key of `seq`'s partial block of `group` at this preemption (24 bytes:
        never a prefix key, which has 16 or 20)."""
        name = f"{seq.request_id}\0{seq.arrival}\0{seq.num_preemptions}\0{group}".encode()
        return hashlib.blake2b(name, digest_size=24, key=self._salt).digest()
