"""The KV tiers below the pool (kvcache/tiers/, issue 23), simulated: the engine's own `KVTiers`
over its own `HostTier`s (byte budgets, least recently used leaves first: `LeafLRU`; the host
tier spilling into the disk tier), on a cache stand-in that holds no data — a block's contents
are only their size. The simulator (perf/simulate.py) gives it to the engine's `Scheduler` as
the engine does (`tiers=`, `BlockPool.on_evict` / `on_register`), so the same prefix keys,
budgets, eviction order and load-or-recompute rule (`KVTiers.worth_loading`) decide what is
loaded, what is recomputed and what falls out.

Loads run inline or in the background as the engine's rule says (`KVTiers.loads_inline`, fed
the simulated decode step and the modeled bandwidths: inline when the copy takes at most a
tenth of a decode step, or, where a background load would not overlap the steps, up to one
step; before measures, only from the host tier). A block's load takes its bytes / the read
bandwidth of the tier holding it (these modeled seconds are also what `worth_loading` and
`loads_inline` measure the tier's bandwidth from). Whether a background load overlaps
(`TierSpec.loads_overlap`): on a GPU row, yes (copies on a side stream, all of a load's time
hidden); on `cpu-local`, no: the engine's forward uses every core, so a read there is CPU
work that a background thread would take from the steps (its seconds count as run time, no
I/O wait, as the engine measures page-cache reads).
- An inline load adds its seconds to the step that admits its sequence (the engine loads at
  admission, in `schedule`, on the engine thread).
- A background load runs on one simulated loader thread, jobs one after another: it is done
  at `ready_at` = max(now, the previous job's ready_at) + its seconds, on the simulator's
  clock; until then its sequence waits in the queue holding its pool blocks (others may pass
  it: engine/tier_moves.py) and is admitted at the first `schedule()` after that time. Its
  seconds overlap the steps (added to none); when nothing else can run the simulator waits
  for it, as the engine's `Scheduler.wait_for_loads` (perf/simulate.py). Its blocks are read
  from the tiers when it is submitted (the engine's loader starts at once: one job at a time).
Costs, in seconds of the engine thread, added to the step that pays them:
- an inline load (above);
- a save: the block's bytes / the bandwidth of each tier it enters (a host tier's spill writes
  the disk tier; write-through writes every tier), paid by the step whose allocation evicts
  or registers the block;
- a recompute: nothing here — the step computes those tokens, and the rule's prefill cost per
  token is the engine's (engine/backlog.py `StepCost`, a moving average of the step costs, fed
  the simulated steps: perf/simulate.py).
Bandwidths, bytes/s per device (each device holds its share of a block, over its own link):
- host: the flag (`infergen predict --host-bandwidth`), else the hardware row's
  `host_bandwidth` (cpu-local: measured by `infergen perf calibrate`, a memory copy), else
  DEFAULT_HOST_BANDWIDTH;
- disk: the flag (`--disk-bandwidth`), else the row's measured costs (cpu-local: `infergen perf
  calibrate` times the engine's own DiskTier: a fixed time per file plus the bytes at a
  bandwidth, each way; `TierSpec.costs`), else DEFAULT_DISK_BANDWIDTH, for reads and writes.
Budgets are per device too (the engine's tiers serve one device).

Not modeled: the disk tier's file headers (~100 bytes a block), the engine's work around a
tier write (the pool page's copy and encoding), blocks a disk tier holds from an earlier run
(a simulated tier starts empty), I/O faults (no simulated load fails but for a block gone
from the tiers), per-block Python overheads, a background copy slowing the steps it overlaps
(shared links, the GIL).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch

from infergen.config.sections import CacheConfig
from infergen.engine.request import Sequence
from infergen.errors import ConfigError
from infergen.kvcache.tiers.host import HostTier
from infergen.kvcache.tiers.loader import LoadJob
from infergen.kvcache.tiers.tiered import KVTiers
from infergen.perf.hardware import CPU_LOCAL, FileCosts, Hardware

# Assumed, not measured: about 40 % of a PCIe Gen5 x16 link's 64 GB/s per direction, what a
# copy from pageable (not pinned) host memory reaches; the engine's host tier keeps plain CPU
# tensors. A row's host_bandwidth (cpu-local: calibrated) or --host-bandwidth replaces it.
DEFAULT_HOST_BANDWIDTH = 25e9
# Assumed, not measured: a datacenter NVMe SSD reads 3-7 GB/s sequentially; one file per
# block, checksummed, reaches less (bench_kv_tiers measured 1.1-1.5 GB/s on a shared VM's
# disk). --disk-bandwidth replaces it.
DEFAULT_DISK_BANDWIDTH = 2e9


@dataclass(frozen=True)
class TierSpec:
    """The KV tiers of a deployment, per device: a host-memory budget (None: no host tier),
    a disk budget (None: no disk tier), write-through, read/write bandwidths in bytes/s (None:
    not chosen yet: `for_hardware` fills them) and where each bandwidth came from."""

    memory_bytes: int | None = None
    disk_bytes: int | None = None
    write_through: bool = False
    host_bandwidth: float | None = None
    disk_bandwidth: float | None = None
    sources: tuple[tuple[str, str], ...] = ()  # (tier, where its bandwidth came from)
    loads_overlap: bool = True  # a background load runs beside the steps (`for_hardware`)
    disk_costs: FileCosts | None = None  # the row's measured disk tier costs (`for_hardware`)

    def __post_init__(self) -> None:
        if self.memory_bytes is None and self.disk_bytes is None:
            raise ConfigError(
                "KV offload needs a tier",
                where="--kv-offload-memory / --kv-offload-dir",
                expected="a host-memory budget, a disk directory, or both",
            )
        for name, value in (("--kv-offload-memory", self.memory_bytes),
                            ("--kv-offload-disk", self.disk_bytes)):  # fmt: skip
            if value is not None and value < 0:
                raise ConfigError("a tier budget must be >= 0 bytes", where=name, found=value)
        for name, value in (("--host-bandwidth", self.host_bandwidth),
                            ("--disk-bandwidth", self.disk_bandwidth)):  # fmt: skip
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ConfigError(
                    "a bandwidth must be a positive number of bytes/s", where=name, found=value
                )

    @classmethod
    def from_cache(
        cls,
        cache: CacheConfig,
        host_bandwidth: float | None = None,
        disk_bandwidth: float | None = None,
    ) -> TierSpec | None:
        """The tiers an engine of `cache` would build (engine/build.py `_tiers`: a disk tier
        when it has a directory); None without any."""
        if cache.offload_memory_bytes is None and cache.offload_dir is None:
            return None
        disk = cache.offload_disk_bytes if cache.offload_dir is not None else None
        return cls(cache.offload_memory_bytes, disk, cache.offload_write_through,
                   host_bandwidth, disk_bandwidth)  # fmt: skip

    def for_hardware(self, hw: Hardware) -> TierSpec:
        """Bandwidths chosen: the given ones, else the row's host copy rate, else defaults."""
        if self.sources:
            return self
        host, host_from = self.host_bandwidth, "--host-bandwidth"
        if host is None and hw.host_bandwidth is not None:
            host, host_from = hw.host_bandwidth, f"hardware row {hw.name}"
        if host is None:
            host, host_from = DEFAULT_HOST_BANDWIDTH, "default (assumed)"
        disk, disk_from, costs = self.disk_bandwidth, "--disk-bandwidth", None
        if disk is None and hw.disk is not None:
            costs, disk = hw.disk, hw.disk.read_bandwidth
            disk_from = f"hardware row {hw.name} (per-file costs too)"
        if disk is None:
            disk, disk_from = DEFAULT_DISK_BANDWIDTH, "default (assumed)"
        return replace(self, host_bandwidth=host, disk_bandwidth=disk, disk_costs=costs,
                       sources=(("host", host_from), ("disk", disk_from)),
                       loads_overlap=hw.name != CPU_LOCAL)  # fmt: skip

    def costs(self) -> dict[str, FileCosts]:
        """Per tier, what a block costs to read and write (bandwidths chosen first): the host
        tier its bytes at host_bandwidth; the disk tier the row's measured per-file costs, else
        its bytes at disk_bandwidth both ways."""
        host, disk = self.host_bandwidth, self.disk_bandwidth
        return {"host": FileCosts(0.0, host, 0.0, host),
                "disk": self.disk_costs or FileCosts(0.0, disk, 0.0, disk)}  # fmt: skip

    def as_dict(self) -> dict:
        sources = dict(self.sources)
        tiers = {}
        if self.memory_bytes is not None:
            tiers["host"] = {"budget_bytes": self.memory_bytes, "bandwidth": self.host_bandwidth,
                             "bandwidth_from": sources.get("host")}  # fmt: skip
        if self.disk_bytes is not None:
            tiers["disk"] = {"budget_bytes": self.disk_bytes, "bandwidth": self.disk_bandwidth,
                             "bandwidth_from": sources.get("disk")}  # fmt: skip
            if self.disk_costs is not None:
                tiers["disk"]["costs"] = asdict(self.disk_costs)
        return {"tiers": tiers, "write_through": self.write_through}


class _Contents:
    """A block's contents as the simulated tiers keep them: a size and no data (what HostTier
    and KVTiers ask of a tensor: numel, element_size, shape, dtype, detach, to)."""

    __slots__ = ("nbytes",)
    dtype = torch.uint8

    def __init__(self, nbytes: int):
        self.nbytes = nbytes

    @property
    def shape(self) -> tuple[int]:
        return (self.nbytes,)

    def numel(self) -> int:
        return self.nbytes

    def element_size(self) -> int:
        return 1

    def detach(self) -> _Contents:
        return self

    def to(self, *args, **kwargs) -> _Contents:
        return self


class _DatalessCache:
    """What KVTiers asks of a PagedKVCache, without data: a block's bytes and tokens."""

    device = torch.device("cpu")
    summaries: list = []  # (no per-block key summaries: swaps are possible)

    def __init__(self, block_bytes: int, block_size: int):
        self.block_bytes, self.block_size = block_bytes, block_size
        self._contents = _Contents(block_bytes)
        self.storage = self  # KVTiers reads a page as storage[:, :, block]

    def __getitem__(self, index) -> _Contents:
        return self._contents

    def block_data(self, block: int) -> _Contents:
        return self._contents

    def write_block(self, block: int, data: _Contents) -> None:
        pass


class _DiskTier(HostTier):
    """The disk tier as the engine keeps it (DiskTier: a byte budget, least recently used
    leaves deleted first, nothing below it), without files."""

    name = "disk"
    in_memory = False  # (a load is I/O: the engine's rule sends it to the background)


class _TimedJob(LoadJob):
    """A background load of the simulated loader: done once the simulator's clock reaches
    `ready_at` (the engine's LoadJob is done when its worker's future is)."""

    def __init__(self, keys: list[bytes], blocks: list[int], clock: Callable[[], float]):
        super().__init__(list(keys), list(blocks))
        self.clock = clock
        self.ready_at = 0.0

    @property
    def done(self) -> bool:
        return self.clock() >= self.ready_at

    def result(self) -> None:
        """(The simulated loader raises nothing.)"""


class SimulatedTiers(KVTiers):
    """`KVTiers` over data-less tiers of `spec` (bandwidths chosen: `TierSpec.for_hardware`)
    for a pool of `block_bytes`-byte blocks. `admitting()`: the sequence the scheduler is
    considering for admission (whose prefix `TierMoves.fetch` loads), whose loads before its
    first admission are counted per tier in `first_loads` (a preempted sequence's reloads are
    not). `clock()`: the simulator's time, which background loads complete by (`ready_at`).
    `take_seconds()`: the inline load and the save seconds since the last call."""

    # (writes through in the step that registers the block, priced there: on cpu-local the
    # engine's writer thread takes the same cores from the steps; on a GPU this overstates
    # what the steps pay)
    background_writes = False

    def __init__(
        self,
        spec: TierSpec,
        block_bytes: int,
        block_size: int,
        admitting: Callable[[], Sequence],
        clock: Callable[[], float],
    ):
        if spec.host_bandwidth is None or spec.disk_bandwidth is None:
            raise ValueError("choose the tiers' bandwidths first (TierSpec.for_hardware)")
        disk = _DiskTier(spec.disk_bytes) if spec.disk_bytes is not None else None
        tiers: list = []  # as engine/build.py `_tiers`: host (spilling to disk), then disk
        if spec.memory_bytes is not None:
            tiers.append(HostTier(spec.memory_bytes, disk.put if disk is not None else None))
        if disk is not None:
            tiers.append(disk)
        super().__init__(_DatalessCache(block_bytes, block_size), tiers, spec.write_through)
        self.spec = spec
        self.costs = spec.costs()  # per tier: a block's read and write seconds
        self.admitting = admitting
        self.clock = clock
        self.first_loads: dict[Sequence, dict[str, int]] = {}
        self._pending = 0.0
        self._written = {tier.name: (0, 0) for tier in tiers}  # puts, bytes written
        self._loader_free = 0.0  # when the simulated loader thread finishes its last job
        self._jobs: list[_TimedJob] = []  # background jobs not done at the last look

    def load(self, key: bytes, block: int) -> bool:
        """KVTiers.load, timed by the model instead of the clock."""
        for tier in self.tiers:
            if key in tier:
                data = tier.get(key)
                if data is not None:
                    nbytes = data.numel() * data.element_size()
                    seconds = self.costs[tier.name].read_seconds(nbytes)
                    run = 0.0 if self.spec.loads_overlap else seconds  # (else: I/O waits)
                    self._count_read(tier.name, nbytes, seconds, run, 0.0)
                    self.loaded += 1
                    self._pending += seconds
                    seq = self.admitting()
                    if seq.num_cached_prompt_tokens is None:
                        counts = self.first_loads.setdefault(seq, {})
                        counts[tier.name] = counts.get(tier.name, 0) + 1
                    return True
        return False

    def load_state(self, key: bytes) -> _Contents | None:
        """KVTiers.load_state (a spilled recurrent-state checkpoint, read on the engine thread
        as the scheduler looks it up), its read seconds the model's, added to the step."""
        data = super().load_state(key)
        if data is not None:
            name = next(tier.name for tier in self.tiers if key in tier)
            self._pending += self.costs[name].read_seconds(data.numel() * data.element_size())
        return data

    @property
    def overlaps(self) -> bool:
        """The modeled hardware's (TierSpec.loads_overlap), not this machine's."""
        return self.spec.loads_overlap

    def load_now(self, keys: list[bytes], blocks: list[int]) -> int:
        """KVTiers.load_now, its seconds the model's (added to the admitting step)."""
        pending, counted = self._pending, self.load_seconds["inline"]
        loaded = super().load_now(keys, blocks)  # (counts the Python's time: replaced)
        self.load_seconds["inline"] = counted + self._pending - pending
        return loaded

    def load_async(self, keys: list[bytes], blocks: list[int]) -> LoadJob:
        """A background load (the engine's rule, `loads_inline`, chose it) on one simulated
        loader thread: its blocks are read from the tiers now (the tiers' order and counters
        as the engine's worker leaves them, which starts at once), and the job is done when
        the simulator's clock reaches `ready_at`: the time its loader is free (now, or the end
        of the job before) plus its blocks' seconds. Those seconds overlap the steps (not
        added to one); its sequence waits meanwhile (engine/tier_moves.py)."""
        pending = self._pending
        job = _TimedJob(keys, blocks, self.clock)
        for key, block in zip(keys, blocks, strict=True):
            if not self.load(key, block):
                job.failed = True
                break
            job.loaded += 1
        job.seconds, self._pending = self._pending - pending, pending
        job.ready_at = self._loader_free = max(self.clock(), self._loader_free) + job.seconds
        self._jobs.append(job)
        return job

    def next_ready(self) -> float | None:
        """When the next background job not done yet is done (None: none in flight)."""
        self._jobs = [job for job in self._jobs if not job.done]
        return min((job.ready_at for job in self._jobs), default=None)

    def take_seconds(self) -> float:
        """Seconds of the inline loads and the saves since the last call."""
        seconds, self._pending = self._pending, 0.0
        for tier in self.tiers:
            puts, written = tier.stats["puts"], tier.stats["bytes_written"]
            costs, (puts_before, written_before) = self.costs[tier.name], self._written[tier.name]
            seconds += (puts - puts_before) * costs.write_file_s
            seconds += (written - written_before) / costs.write_bandwidth
            self._written[tier.name] = puts, written
        return seconds
