"""`infergen predict`: a model on a device with chosen formats and parallelism, serving a
workload — predicted TTFT / ITL / TPOT / e2e, throughput, memory, the concurrency that fits,
and the cost per million output tokens.

A `Deployment` fixes everything but the load; `predict` simulates one load (closed loop at a
concurrency, or open loop at a rate) and returns the JSON-ready result. Latencies are those
of REFERENCES §6, from the simulated requests (the same `summarize` as `infergen bench`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

from infergen.bench.report import summarize
from infergen.bench.workloads import Shape
from infergen.config import CacheConfig, SchedulerConfig
from infergen.config.description import ModelDesc
from infergen.kvcache.groups import sequence_blocks
from infergen.perf import memory, roofline
from infergen.perf.hardware import Hardware
from infergen.perf.kv_tiers import TierSpec
from infergen.perf.simulate import Simulator, SpecDecode
from infergen.perf.step_cost import Chunk, Formats, Parallel


@dataclass(frozen=True)
class Deployment:
    desc: ModelDesc
    hw: Hardware
    fmt: Formats = Formats()
    compute_format: str = "bf16"
    par: Parallel = Parallel()
    scheduler: SchedulerConfig = SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=8192)
    block_size: int = 16
    prefix_caching: bool = True  # admission: scheduler.admission (engine/admission.py)
    memory_utilization: float = 0.9
    kv_capacity: float | None = None  # bytes per device; None: what the memory plan leaves
    spec_tokens: int = 0
    spec_acceptance: float = 0.0
    spec_verify_fraction: float = 1.0  # of decodes that verify drafts (the others: none)
    spec_drafts: dict[int, float] | None = None  # {drafts: share of verifying steps}
    draft: ModelDesc | None = None
    tiers: TierSpec | None = None  # KV tiers below the pool (perf/kv_tiers.py), per device
    kv_blocks: int | None = None  # the pool's exact blocks (the engine's num_kv_blocks)
    # prefix checkpoints' budget (the engine's state_checkpoint_bytes; 0: none kept)
    state_checkpoint_bytes: int = CacheConfig.state_checkpoint_bytes

    @property
    def devices(self) -> int:
        return max(self.par.tp, self.par.ep)

    @cached_property
    def memory(self) -> memory.MemoryPlan:
        capacity = self.kv_capacity
        if capacity is None and self.kv_blocks is not None:  # the pages of the given pool
            capacity = self.kv_pool.num_blocks * self.kv_pool.page_bytes
        return memory.plan(
            self.desc,
            self.hw,
            self.fmt,
            self.par,
            self.scheduler.max_num_batched_tokens,
            self.scheduler.max_num_seqs,
            self.memory_utilization,
            capacity,
        )

    @cached_property
    def kv_pool(self) -> memory.PoolShape:
        capacity = self.memory.kv_capacity_bytes if self.kv_blocks is None else 0.0
        return memory.kv_pool(
            self.desc,
            self.fmt,
            self.par,
            capacity,
            self.block_size,
            self.scheduler.max_num_seqs,
            self.kv_blocks,
        )

    def step_times(self, chunks: list[Chunk]) -> list[roofline.OpTime]:
        return roofline.predict_step(
            self.desc, self.hw, chunks, self.fmt, self.compute_format, self.par
        )

    def step_seconds(self, chunks: list[Chunk]) -> float:
        return roofline.step_seconds(self.step_times(chunks))

    def simulator(self, seed: int = 0) -> Simulator:
        spec = None
        if self.spec_tokens:
            draft_time = None
            if self.draft is not None:
                draft = dataclasses.replace(self, desc=self.draft, draft=None, spec_tokens=0)
                draft_time = draft.step_seconds
            spec = SpecDecode(self.spec_tokens, self.spec_acceptance, draft_time,
                              self.spec_verify_fraction, self.spec_drafts)  # fmt: skip
        tiers = self.tiers.for_hardware(self.hw) if self.tiers is not None else None
        return Simulator(
            self.step_seconds, self.kv_pool, self.scheduler, self.prefix_caching, spec, seed,
            tiers, self.state_checkpoint_bytes,
        )  # fmt: skip

    def max_concurrency(self, tokens: int) -> int:
        """Sequences of `tokens` tokens whose KV fits at once (the batch limit aside; a model
        without attention layers: its state slots)."""
        pool = self.kv_pool
        chunk = self.scheduler.max_num_batched_tokens
        per_seq = sequence_blocks(pool.groups, tokens, chunk, pool.block_size)
        if not per_seq:
            return pool.state_slots or 10**9
        return pool.num_blocks // per_seq


def _ms(stats: dict) -> dict:
    return {k: (v * 1e3 if v is not None and k != "n" else v) for k, v in stats.items()}


def predict(
    dep: Deployment,
    shapes: list[Shape],
    concurrency: int | None = None,
    rate: float | None = None,
    usd_per_gpu_hour: float = 3.0,
    seed: int = 0,
    warmup: int = 0,
    lockstep: bool = False,
    shared_prefix: int = 0,
    rotate: bool = False,
) -> dict:
    """Simulate the load and summarize it as `infergen predict --json` prints it; the first
    `warmup` requests (sessions) are simulated but not counted. `lockstep`, `shared_prefix`,
    `rotate`: as `Simulator.run`."""
    sim = dep.simulator(seed)
    _, _, stats = sim.run(shapes, concurrency, rate, seed, lockstep, shared_prefix, rotate)
    results, wall = sim.steady_state(warmup)
    summary = summarize(results, wall)
    later = summarize([r for r in results if r.turn > 0], wall)["ttft_s"]
    turns = [(s.prompt_tokens, s.max_tokens) for s in shapes]
    mean_tokens = round(sum(p + o for p, o in turns) / max(1, len(turns)))
    out_tok_s = summary["output_tok_s"]
    hour_cost = usd_per_gpu_hour * dep.devices
    return {
        "model": dep.desc.name,
        "gpu": dep.hw.name,
        "gpus": dep.devices,
        "tp": dep.par.tp,
        "ep": dep.par.ep,
        "weights_bits": dep.fmt.weight_bits,
        "expert_weights_bits": dep.fmt.expert_weight_bits,
        "kv_bits": dep.fmt.kv_bits,
        "activation_bytes": dep.fmt.act_bytes,
        "compute_format": dep.compute_format,
        "concurrency": concurrency,
        "rate": rate,
        "warmup": warmup,
        "params_total": dep.desc.params_total(),
        "params_active": dep.desc.params_active(),
        "weight_bytes": dep.desc.weight_bytes(dep.fmt.weight_bits, dep.fmt.expert_weight_bits),
        "kv_bytes_per_token": dep.desc.kv_bytes_per_token(dep.fmt.kv_bits / 8),
        "memory_per_device": dep.memory.as_dict(),
        "max_concurrency": min(dep.max_concurrency(mean_tokens), dep.scheduler.max_num_seqs),
        "max_concurrency_kv": dep.max_concurrency(mean_tokens),
        "requests": summary["requests"],
        "failed": summary["failed"],
        "errors": summary["errors"],
        "ttft_ms": _ms(summary["ttft_s"]),
        "ttft_ms_turn2on": _ms(later) if later["n"] else None,  # multi-turn workloads
        "itl_ms": _ms(summary["itl_s"]),
        "tpot_ms": _ms(summary["tpot_s"]),
        "e2e_ms": _ms(summary["e2e_s"]),
        "output_tok_s": out_tok_s,
        "total_tok_s": summary["total_tok_s"],
        "request_s": summary["request_s"],
        "wall_s": wall,
        "usd_per_gpu_hour": usd_per_gpu_hour,
        "cost_per_mtok_usd": hour_cost / 3600 / out_tok_s * 1e6 if out_tok_s else None,
        "simulation": stats.as_dict(wall),
        "kv_tiers": sim.tiers.stats() if sim.tiers is not None else None,
        "efficiencies": efficiencies(dep),
    }


def efficiencies(dep: Deployment) -> dict:
    """Where the row's efficiency factors came from (its own calibration, or borrowed from a
    calibrated row: `Hardware.efficiency_source`) and the values this deployment runs at."""
    hw = dep.hw
    return hw.efficiency_source() | {
        "compute_efficiency": hw.compute_efficiency_for(dep.compute_format),
        "memory_efficiency": hw.memory_efficiency,
        "launch_overhead_s": hw.launch_overhead_s,
    }


def fixed_shapes(isl: int, osl: int, count: int) -> list[Shape]:
    """`--isl/--osl`: every request the same."""
    return [Shape(isl, osl) for _ in range(count)]


def explain(dep: Deployment, batch: int, context: int, new: int = 1) -> str:
    """The per-op table of one step: `batch` sequences, `new` tokens each, at `context`."""
    times = dep.step_times([Chunk(new, context)] * batch)
    what = "decode" if new == 1 else f"{new}-token prefill chunks"
    head = f"{dep.desc.name} on {dep.hw.description}: {what}, batch {batch}, context {context}"
    return f"{head}\n{dep.hw.efficiency_note()}\n{roofline.explain(times)}"
