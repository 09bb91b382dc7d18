"""`KVTiers`: the tiers below one paged KV cache, in order (host, then disk), and the two
moves between them and the pool (issue 23, items 1–2):

- `save(block, key, parent)`: a block the pool evicts (write-back) — its contents copied to
  the first tier that takes it (one too small for it passes it on), which spills its own
  least recently used leaves to the next; with write-through (`save_through`), every block
  is copied to the disk tier as it is registered (by the ThroughWriter's thread, writer.py),
  so the disk tier holds whole prefixes;
- `load(key, block)`: a prefix block found in a tier copied into a pool block (the first tier
  holding it serves it; a tier that finds its copy corrupt answers None and the block is
  recomputed instead).

Load or recompute (`worth_loading`): a hit is loaded only when reading its blocks from the
tiers is expected to take less time than recomputing their tokens — each block at the read
bandwidth measured for the tier holding it (bytes / seconds of its `get`s so far; loaded while
a holder is not measured) against the
engine's measured prefill cost per token (`recompute_seconds_per_token`, set by the engine from
its step costs; None: not measured yet → load). Each decision is counted.

Inline or in the background (`loads_inline`, issue 23 item 2): a load runs in the engine thread
(`load_now`) while it is expected to stall the running sequences' next step by at most
INLINE_STEP_SHARE of a decode step (the engine's measured `step_seconds`) — its blocks' bytes
at the holding tiers' measured bandwidths, each tier's reads timed without the reading
thread's waits for a core (`ReadTimes`, thread_clock.py). Otherwise `load_async` hands it to
the background loader (tiers/loader.py) and the sequence waits at least a step while the
others step — unless a background load would hide little: on a CPU whose cores all run the
forward (`overlaps` False) the loader's reads take those cores from the steps, and only the
reads' I/O waits (wall time neither running nor queued) are hidden; a load whose hidden part
is within that share runs inline too, up to one decode step. Before the measures, only loads
wholly from memory tiers run inline. Measured on the CPU this was built on (SmolLM2-135M,
16-token blocks of 737 KB, 2 cores, both running the forward): a host-tier block loads in
0.04–0.2 ms, a disk-tier block in 0.25 ms uncontended (page cache: the read, its checksum, the
copy; no I/O wait), a decode step of two sequences takes 20 ms; so a 48-block disk hit loads
inline in 12 ms where the background took it a step later and its reads stole about as much
from the steps. On a GPU, or from a disk that makes reads wait, the background takes them.

Preemption by swap (issue 23 item 3; the scheduler's rule, engine/tier_moves.py): `swap_out`
copies a preempted sequence's blocks into the first tier (host memory) at once; `can_swap` /
`worth_swapping` say whether swapping may / should be chosen (the cost rule on the host tier).

Counted (`stats`): blocks saved / loaded, the load-or-recompute decisions, loads inline /
in the background / failed / cancelled and their seconds (the background ones overlapped with
engine steps), preemptions swapped / recomputed.

Keys are the scheduler's prefix-cache keys (chained block hashes, kvcache/prefix.py); a key's
parent is the previous block of its chain. A block's contents are one page of the cache
(PagedKVCache.block_data: every layer of its cache group, K and V, in the storage dtype),
encoded by the cache's offload format before the tiers get it (`codec`, compact.py: as stored,
or FP8 codes with per-block scales) and decoded into the pool's dtype when it comes back. The
encoding runs where the pool lives (on a GPU, fewer bytes cross to the host); the copies
between the pool's device and the host tier are the cache's `copies` (copies.py: pinned
memory on a side stream on a GPU, the compute stream waiting on events for what it reads).
Riders (`carry`, riders.py): caches with the pool's block ids whose pages travel with each
block (the `mtp` layer's KV); with them, write-through waits for the step's end (`end_step`).
Recurrent-state checkpoints the store evicts (kvcache/state_checkpoints.py) are kept here too
(`save_state` / `load_state`: flat byte tensors, each a chain of its own).
Threads: the engine thread calls everything but `read` (and `place` on a GPU) and the counters
they update, which the background loader calls too (the tiers and the counters are locked).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch

from infergen.kvcache.paged_cache import PagedKVCache
from infergen.kvcache.tiers.compact import AS_STORED, AsStored, ScaledBlocks
from infergen.kvcache.tiers.copies import HostCopies, host_copies
from infergen.kvcache.tiers.loader import BackgroundLoader, LoadJob
from infergen.kvcache.tiers.riders import Riders
from infergen.kvcache.tiers.thread_clock import thread_times
from infergen.kvcache.tiers.writer import ThroughWriter

# an inline load may stall the running sequences' next step by this share of a step at most
INLINE_STEP_SHARE = 0.1


@dataclass
class ReadTimes:
    """A tier's reads so far: bytes, wall seconds, and of those the reading threads' seconds
    on a core (`run`) and runnable but waiting for one (`queued`; thread_clock.py)."""

    nbytes: int = 0
    wall: float = 0.0
    run: float = 0.0
    queued: float = 0.0

    @property
    def own(self) -> float:
        """What the reads took, the waits for a core left out (what they take uncontended)."""
        return self.wall - self.queued

    @property
    def io(self) -> float:
        """What the reads spent blocked on the device (neither running nor queued)."""
        return max(0.0, self.wall - self.run - self.queued)


class KVTier(Protocol):
    name: str
    budget_bytes: int
    stats: dict[str, int]
    in_memory: bool  # a load is a memcpy (inline until measured), not I/O

    def __contains__(self, key: bytes) -> bool: ...
    def put(self, key: bytes, parent: bytes | None, data: torch.Tensor) -> bool: ...
    def get(self, key: bytes) -> torch.Tensor | None: ...
    def discard(self, key: bytes) -> None: ...
    def touch(self, key: bytes) -> None: ...


class KVTiers:
    background_writes = True  # write-through off the engine thread (writer.py)

    def __init__(
        self,
        kv_cache: PagedKVCache,
        tiers: list[KVTier],
        write_through: bool = False,
        codec: AsStored | ScaledBlocks = AS_STORED,  # how the tiers store a block (compact.py)
        copies: HostCopies | None = None,  # None: the cache device's (shared with a host tier)
    ):
        self.kv_cache = kv_cache
        self.tiers = tiers
        self.write_through = write_through  # save blocks as they are registered, too
        page = kv_cache.block_data(0)  # a KV format the tiers cannot move: ConfigError
        self._page = (page.shape, page.dtype)  # what a stored block decodes to
        self.codec = codec
        codec.check(kv_cache)
        self.copies = copies if copies is not None else _shared_copies(kv_cache, tiers)
        if any(getattr(tier, "copies", self.copies) is not self.copies for tier in tiers):
            raise ValueError("a host tier must share its cache's KVTiers copies (one stream)")
        self.block_bytes = codec.stored_bytes(*self._page)  # bytes a tier holds per block
        self.riders: Riders | None = None  # caches whose blocks travel with the pool's (`carry`)
        # blocks registered in this step, written through once the riders' KV is in (`end_step`)
        self._held: list[tuple[int, bytes, bytes | None]] = []
        self.saved = self.loaded = 0  # blocks moved down / brought back
        self.states_saved = self.states_loaded = 0  # recurrent-state checkpoints, likewise
        self.decisions = {"load": 0, "recompute": 0}  # hits loaded vs recomputed (cost rule)
        self.recompute_seconds_per_token: float | None = None  # the engine's measured prefill
        self.step_seconds: float | None = None  # the engine's measured decode step
        self.loads = {"inline": 0, "background": 0, "failed": 0, "cancelled": 0}  # jobs
        self.load_seconds = {"inline": 0.0, "background": 0.0}  # background: overlapped
        self.preemptions = {"swap": 0, "recompute": 0}  # counted by the scheduler
        self._read = {tier.name: ReadTimes() for tier in tiers}  # of the tiers' gets
        self._lock = threading.Lock()  # the counters the background loader updates too
        self._loader: BackgroundLoader | None = None  # started by the first background load
        # (each save names its writer: one kept here would tie this object into a reference
        # cycle, and the pool's pages with it, until the cyclic collector ran)
        self._writer = ThroughWriter()

    def __contains__(self, key: bytes) -> bool:
        return any(key in tier for tier in self.tiers)

    def save(self, block: int, key: bytes, parent: bytes | None) -> None:
        """The pool is about to reuse `block` (holding `key`): keep its contents below, in
        the first tier from the top that takes it — down to a tier that holds it already
        (written through to disk: the host tier still takes a copy, it reads faster)."""
        self.end_step()  # (a held block's write-through copy comes before its reuse)
        data = None
        for tier in self.tiers:
            if key in tier:
                return
            data = self._stored(block) if data is None else data
            if tier.put(key, parent, data):
                with self._lock:  # (the writer thread counts too)
                    self.saved += 1
                return

    def save_through(self, block: int, key: bytes, parent: bytes | None) -> None:
        """`block` was just computed and registered: a copy into the tiers that persist (the
        disk tier, so whole prefixes outlive a restart; the host tier alone when there is no
        disk). The host tier is filled by the pool's evictions (`save`): written through, it
        would only mirror the pool. Disk writes go through the `ThroughWriter` (writer.py: off
        the engine thread; `flush` waits for them). With riders, the block waits for the
        step's end (`end_step`): their KV of its positions is written after the step's
        tokens are kept."""
        if self.riders is not None:
            self._held.append((block, key, parent))
            return
        self._save_through_now(block, key, parent)

    def end_step(self) -> None:
        """The engine's step is over, riders' KV included: the blocks it registered are
        written through now (their copies taken before the pool can reuse them: `save`,
        `flush` and `swap_out` call this first too)."""
        held, self._held = self._held, []
        for block, key, parent in held:
            self._save_through_now(block, key, parent)

    def carry(self, cache: PagedKVCache) -> None:
        """Carry `cache`'s blocks with the pool's from now on (riders.py: the `mtp` layer's
        KV); before this object stores or loads a block (what a disk tier holds from an
        earlier engine was packed alike: its fingerprint says so, engine/build.py)."""
        if self.saved or self.loaded:
            raise ValueError("riders are attached before the KV tiers move any block")
        caches = [] if self.riders is None else self.riders.caches
        encoded = self.codec.encode(self.kv_cache.page(0))
        self.riders = Riders(self.kv_cache, encoded, [*caches, cache])
        self.block_bytes = self.riders.nbytes

    def _save_through_now(self, block: int, key: bytes, parent: bytes | None) -> None:
        persistent = self._persistent
        if not persistent or not self.background_writes:
            self._put_through(key, parent, self._stored(block), persistent or self.tiers[:1])
        elif any(key not in tier for tier in persistent):  # (the writer skips a pending key)
            self._writer.save(key, parent, self._stored(block), self._write_through)

    @property
    def _persistent(self) -> list[KVTier]:
        """The tiers that outlive the process (the disk tier), which write-through fills."""
        return [tier for tier in self.tiers if not tier.in_memory]

    def _write_through(self, key: bytes, parent: bytes | None, data) -> None:
        self._put_through(key, parent, data, self._persistent)

    def _put_through(self, key: bytes, parent: bytes | None, data, tiers: list) -> None:
        """Put `data` into those of `tiers` that lack `key` (any thread); counted once."""
        if sum(tier.put(key, parent, data) for tier in tiers if key not in tier):
            with self._lock:
                self.saved += 1

    def flush(self) -> None:
        """Return once every block queued for writing through is in its tiers (before another
        engine opens the same disk directory)."""
        self.end_step()
        self._writer.flush()

    def load(self, key: bytes, block: int) -> bool:
        """Copy `key`'s contents into pool block `block`; False when no tier has a good copy."""
        data = self.read(key)
        if data is not None:
            self.place(block, data)
        return data is not None

    def read(self, key: bytes) -> torch.Tensor | None:
        """`key`'s contents as the first tier holding it stores them (None: no tier has a good
        copy); timed for the tier's read bandwidth. Any thread."""
        for tier in self.tiers:
            if key in tier:
                start, (run, queued) = time.perf_counter(), thread_times()
                data = tier.get(key)
                if data is not None:
                    end, (run_end, queued_end) = time.perf_counter(), thread_times()
                    self._count_read(tier.name, data.numel() * data.element_size(),
                                     end - start, run_end - run, queued_end - queued)  # fmt: skip
                    return data
        return None

    def _count_read(self, tier: str, nbytes: int, wall: float, run: float, queued: float) -> None:
        with self._lock:
            times = self._read[tier]
            times.nbytes += nbytes
            times.wall += wall
            times.run += run
            times.queued += queued

    def place(self, block: int, data: torch.Tensor) -> None:
        """What `read` returned, decoded into pool block `block` (the engine thread, or the
        background loader's on a GPU: tiers/loader.py)."""
        data = self.copies.to_device(data)
        if self.riders is not None:  # (their pages written into `block` of their caches)
            data = self.riders.unpack(data, block)
        self.kv_cache.write_block(block, self.codec.decode(data, *self._page))
        with self._lock:
            self.loaded += 1

    def save_state(self, key: bytes, data: torch.Tensor) -> None:
        """A recurrent-state checkpoint (kvcache/state_checkpoints.py) the store evicts: kept
        in the first tier that takes it, as a chain of its own (no parent)."""
        if self.tiers and key not in self and any(t.put(key, None, data) for t in self.tiers):
            with self._lock:  # (the writer thread counts write-through saves)
                self.states_saved += 1

    def save_state_through(self, key: bytes, data: torch.Tensor) -> None:
        """A checkpoint just taken, with write-through: a copy into the tiers that persist
        (as `save_through` does for blocks, off the engine thread), so a restarted engine
        resumes from it."""
        persistent = self._persistent
        if not persistent or not self.background_writes:
            self._put_state(key, data, persistent or self.tiers[:1])
        elif any(key not in tier for tier in persistent):
            self._writer.save(key, None, data, lambda k, _, copy: self._put_state(
                k, copy, self._persistent))  # fmt: skip

    def _put_state(self, key: bytes, data: torch.Tensor, tiers: list) -> None:
        """Put a checkpoint into those of `tiers` that lack it (any thread); counted once."""
        if sum(tier.put(key, None, data) for tier in tiers if key not in tier):
            with self._lock:
                self.states_saved += 1

    def load_state(self, key: bytes) -> torch.Tensor | None:
        """A spilled checkpoint's bytes (None: no tier holds a good copy)."""
        for tier in self.tiers:
            if key in tier:
                data = tier.get(key)
                if data is not None:
                    self.states_loaded += 1
                    return data
        return None

    def load_now(self, keys: list[bytes], blocks: list[int]) -> int:
        """Load `keys` into `blocks` in this thread, up to the first one no tier serves; how
        many were loaded."""
        start, loaded = time.perf_counter(), 0
        for key, block in zip(keys, blocks, strict=True):
            if not self.load(key, block):
                break
            loaded += 1
        self.loads["inline"] += 1
        self.loads["failed"] += loaded < len(keys)
        self.load_seconds["inline"] += time.perf_counter() - start
        return loaded

    def load_async(self, keys: list[bytes], blocks: list[int]) -> LoadJob:
        """Load `keys` into `blocks` in the background (tiers/loader.py); the caller holds the
        blocks until the job is done and then `settle`s it."""
        if self._loader is None:
            self._loader = BackgroundLoader(self.read, self.place, self.kv_cache.device)
        return self._loader.submit(keys, blocks)

    def settle(self, job: LoadJob) -> int:
        """A finished background job counted, the blocks it read placed (on the CPU, here:
        tiers/loader.py); how many of its blocks were loaded (raises what the loader
        raised)."""
        job.result()
        for block, data in zip(job.blocks, job.read, strict=False):
            self.place(block, data)
        job.read.clear()
        self.loads["background"] += 1
        self.loads["failed"] += job.failed
        self.loads["cancelled"] += job.cancelled and job.loaded < len(job.keys)
        self.load_seconds["background"] += job.seconds
        return job.loaded

    @staticmethod
    def wait_any(jobs: Iterable[LoadJob], timeout: float) -> bool:
        """Block until one of the background `jobs` is done (at most `timeout` s)."""
        return BackgroundLoader.wait_any(jobs, timeout)

    def loads_inline(self, keys: list[bytes]) -> bool:
        """Whether loading `keys` should run in the engine thread (the module's docstring has
        the rule and the numbers): its expected seconds (each block at the measured own
        bandwidth of the tier holding it) within INLINE_STEP_SHARE of a decode step, or, when
        a background load would hide little of them (`hidden`), within one step. Before
        measures: only when every key is in a memory tier."""
        holders = [tier for key in keys if (tier := self._holder(key)) is not None]
        with self._lock:
            times = [self._read[tier.name] for tier in holders]
            if self.step_seconds is None or any(t.own <= 0 or not t.nbytes for t in times):
                return all(tier.in_memory for tier in holders)
            seconds = sum(self.block_bytes * t.own / t.nbytes for t in times)
            io = sum(self.block_bytes * t.io / t.nbytes for t in times)
        bound = INLINE_STEP_SHARE * self.step_seconds
        hidden = seconds if self.overlaps else io
        return seconds <= bound or (hidden <= bound and seconds <= self.step_seconds)

    @property
    def overlaps(self) -> bool:
        """Whether a background load runs beside the steps whole: on a GPU (copies on a side
        stream), or on a CPU with a core the forward leaves free. Else the loader's reads take
        the cores from the forward, and only their I/O waits are hidden."""
        if self.kv_cache.device.type != "cpu":
            return True
        affinity = getattr(os, "sched_getaffinity", None)  # (Linux)
        cores = len(affinity(0)) if affinity is not None else os.cpu_count() or 1
        return cores > torch.get_num_threads()

    def worth_loading(self, keys: list[bytes]) -> bool:
        """Whether to load these blocks (a prefix hit's blocks found in the tiers) rather
        than recompute their tokens: each block costs its bytes at the measured bandwidth of
        the tier holding it (a chain may start in the host tier and go on on disk); loaded
        while a holder's bandwidth or the prefill cost is not measured yet. Counted."""
        holders = [self._holder(key) for key in keys]
        load = None not in holders
        per_token = self.recompute_seconds_per_token
        bandwidths = [self.bandwidth(tier.name) for tier in holders] if load else []
        if load and per_token is not None and None not in bandwidths:
            seconds = sum(self.block_bytes / bandwidth for bandwidth in bandwidths)
            load = seconds < len(keys) * self.kv_cache.block_size * per_token
        self.decisions["load" if load else "recompute"] += 1
        return load

    # ---- preemption by swap (engine/tier_moves.py) -------------------------------------------
    @property
    def can_swap(self) -> bool:
        """A preempted sequence's blocks can go to a memory tier and come back as they were
        (not with per-block key summaries: a restored partial block's would be lost)."""
        return bool(self.tiers) and self.tiers[0].in_memory and not self.kv_cache.summaries

    def worth_swapping(self, tokens: int) -> bool:
        """The cost rule for a preempted sequence of `tokens` computed tokens: loading them
        back from the host tier beats recomputing them."""
        return self.can_swap and self._load_beats_recompute(self.tiers[0], tokens)

    def swap_out(self, block: int, key: bytes, parent: bytes | None) -> bool:
        """Copy pool block `block` into the first tier (host memory) under `key`, unless a
        tier holds `key` already; whether a tier holds it now."""
        self.end_step()
        if key in self:
            return True
        return self.tiers[0].put(key, parent, self._stored(block))

    def touch(self, keys: list[bytes]) -> None:
        """These keys are about to be loaded: most recently used in the tiers holding them,
        so that the pool's evictions while their blocks are allocated (entering the host
        tier) push other entries down first."""
        for key in keys:
            for tier in self.tiers:
                if key in tier:
                    tier.touch(key)

    def discard(self, key: bytes) -> None:
        """Drop `key` from every tier (a one-time entry that was used)."""
        for tier in self.tiers:
            tier.discard(key)

    def _holder(self, key: bytes) -> KVTier | None:
        return next((tier for tier in self.tiers if key in tier), None)

    def _load_beats_recompute(self, tier: KVTier, tokens: int) -> bool:
        """Reading `tokens` tokens' blocks from `tier` at its measured bandwidth takes less
        time than recomputing them at the measured prefill cost (True until measured)."""
        bandwidth = self.bandwidth(tier.name)
        per_token = self.recompute_seconds_per_token
        if per_token is None or bandwidth is None:
            return True
        blocks = tokens / self.kv_cache.block_size
        return blocks * self.block_bytes / bandwidth < tokens * per_token

    def _stored(self, block: int) -> torch.Tensor:
        """What the tiers get for pool block `block`: its page (a view where the pool
        lives: each tier copies what it keeps) encoded by the codec; with riders, packed with
        their pages of `block` (riders.py)."""
        encoded = self.codec.encode(self.kv_cache.storage[:, :, block])
        return encoded if self.riders is None else self.riders.pack(encoded, block)

    def bandwidth(self, tier: str) -> float | None:
        """The tier's measured read bandwidth in bytes / s, the reading threads' waits for a
        core left out (None before any read)."""
        with self._lock:
            times = self._read[tier]
            return times.nbytes / times.own if times.own > 0 and times.nbytes else None

    def stats(self) -> dict:
        """Per tier: hits, misses, puts, evictions, bytes read / written, bytes held, read
        GB/s; the blocks saved / loaded, the load-or-recompute decisions, the loads (jobs)
        inline / in the background / failed / cancelled and their seconds (`load_seconds`:
        the background ones ran overlapped with engine steps), the preemptions swapped /
        recomputed."""
        tiers = {}
        for tier in self.tiers:
            bandwidth = self.bandwidth(tier.name)
            gb_s = None if bandwidth is None else bandwidth / 1e9
            tiers[tier.name] = dict(tier.stats, nbytes=tier.nbytes, read_gb_s=gb_s)
        return dict(tiers=tiers, saved=self.saved, loaded=self.loaded,
                    states_saved=self.states_saved, states_loaded=self.states_loaded,
                    decisions=dict(self.decisions), loads=dict(self.loads),
                    load_seconds=dict(self.load_seconds),
                    preemptions=dict(self.preemptions))  # fmt: skip


def _shared_copies(kv_cache: PagedKVCache, tiers: list[KVTier]) -> HostCopies:
    """A host tier's copies (one side stream for both directions), else the device's."""
    shared = [tier.copies for tier in tiers if hasattr(tier, "copies")]
    return shared[0] if shared else host_copies(kv_cache.device)
