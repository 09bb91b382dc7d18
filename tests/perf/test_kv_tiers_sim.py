"""The simulated KV tiers (infergen/perf/kv_tiers.py) in the serving simulator, and the
offload comparison (perf/offload.py). Oracles: a hand count of which prefix blocks must be
found where on a tiny deterministic workload, the engine's own tier counters on the same
turns, the run without tiers (tiers that hold nothing change nothing), a closed form of the
load and save seconds, and a bigger host budget never finding fewer reusable tokens
(metamorphic)."""

from __future__ import annotations

import random

import pytest

from infergen.bench.workloads import Shape
from infergen.config import SchedulerConfig
from infergen.errors import ConfigError
from infergen.kvcache.groups import CacheGroup
from infergen.perf.kv_tiers import DEFAULT_DISK_BANDWIDTH, DEFAULT_HOST_BANDWIDTH, TierSpec
from infergen.perf.memory import PoolShape
from infergen.perf.offload import predicted_tier_gain
from infergen.perf.simulate import Simulator

BLOCK_BYTES = 1000
LLAMA_8B = "tests/perf/configs/llama-3.1-8b.json"


def tiers(host_blocks: int | None, disk_blocks: int | None = None, bandwidth: float = 1e9,
          write_through: bool = False) -> TierSpec:  # fmt: skip
    """Tiers of so many blocks (None: no such tier), both at `bandwidth` bytes/s."""

    def size(blocks: int | None) -> int | None:
        return None if blocks is None else blocks * BLOCK_BYTES

    return TierSpec(size(host_blocks), size(disk_blocks), write_through, bandwidth, bandwidth)


def run(shapes, num_blocks, tier_spec, step_time=lambda chunks: 1e-3, block_size=4,
        max_num_seqs=1, lockstep=True):  # fmt: skip
    shape = PoolShape(num_blocks, (CacheGroup((0,)),), block_size, page_bytes=BLOCK_BYTES)
    limits = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=64)
    sim = Simulator(step_time, shape, limits, tiers=tier_spec)
    results, wall, stats = sim.run(shapes, concurrency=len(shapes), lockstep=lockstep)
    return sim, results, wall, stats


# Two sessions, 2 turns, one request at a time (max_num_seqs 1), blocks of 4 tokens, a pool
# of 5 blocks. Turn 1: each session prompts 8 tokens and answers 4: 11 tokens computed, its
# 2 full blocks k0 k1 registered. s0 takes pool blocks 0 1 2, s1 (block 2 freed: not full)
# 3 4 2; idle, least recent first: s0-k1 s0-k0 s1-k1 s1-k0. Turn 2 resends 12 + 4 = 16
# tokens: 8 reusable each. s0 finds its k0 k1 in the pool (8 tokens) and grows by evicting
# s1-k1, then s1-k0 (the pool's order: a sequence's last block first). s1 finds nothing in
# the pool:
# - no tier / a 0-byte tier: 8 recomputed;
# - a 1-block host tier: s1-k1 came first and went when s1-k0 arrived (the least recently
#   used leaf): k0 loaded (4 tokens), k1 recomputed;
# - 2 blocks: both stored, but loading k0 takes a pool block whose eviction (s0's block 3)
#   enters the tier and pushes out k1, its leaf, before it is loaded: 4 loaded;
# - 4 blocks or more: both loaded (8 tokens);
# - a 1-block host over a disk tier: k1 spilled to disk; k0 loaded from host, then the next
#   eviction spills k0 too, and k1 comes from disk: 4 + 4.
HAND_COUNT = [  # host blocks, disk blocks → tokens found in (pool, host, disk), recomputed
    (None, None, (8, 0, 0), 8),
    (0, None, (8, 0, 0), 8),
    (1, None, (8, 4, 0), 4),
    (2, None, (8, 4, 0), 4),
    (4, None, (8, 8, 0), 0),
    (100, None, (8, 8, 0), 0),
    (1, 100, (8, 4, 4), 0),
    (None, 100, (8, 0, 8), 0),
]


@pytest.mark.parametrize("host, disk, found, recomputed", HAND_COUNT)
def test_tier_hits_match_a_hand_count(host, disk, found, recomputed):
    spec = None if host is None and disk is None else tiers(host, disk)
    shapes = [Shape(8, 4, (4,), f"s{i}") for i in range(2)]
    sim, results, _, stats = run(shapes, 5, spec)
    assert all(r.ok for r in results) and len(results) == 4
    reuse = stats.reuse()
    assert reuse["reusable_tokens"] == 16
    got = tuple(round(reuse[where] * 16) for where in ("pool", "host", "disk"))
    assert got == found and round(reuse["recomputed"] * 16) == recomputed
    if spec is not None:  # every loaded block is a tier hit: the tiers' own counters agree
        hits = {name: t["hits"] for name, t in sim.tiers.stats()["tiers"].items()}
        assert sum(hits.values()) * 4 == found[1] + found[2]


def agentic(rng: random.Random, sessions: int) -> list[Shape]:
    return [
        Shape(rng.randint(20, 80), rng.randint(4, 20),
              tuple(rng.randint(4, 30) for _ in range(rng.randint(1, 4))), f"s{i}")
        for i in range(sessions)
    ]  # fmt: skip


def linear_step(chunks) -> float:
    return 1e-3 + 1e-4 * sum(c.new for c in chunks)


@pytest.mark.parametrize("write_through", [False, True])
def test_tiers_that_hold_nothing_predict_exactly_the_run_without_tiers(write_through):
    """0-byte tiers take no block: the same steps, times and results as no tiers at all."""
    rng = random.Random(1)
    shapes = agentic(rng, 5)
    runs = [
        run(shapes, 30, spec, linear_step, block_size=16, max_num_seqs=4, lockstep=False)
        for spec in (None, tiers(0, 0, write_through=write_through))
    ]
    (_, off, off_wall, off_stats), (sim, on, on_wall, on_stats) = runs
    assert [r.as_dict() for r in on] == [r.as_dict() for r in off]
    assert on_wall == off_wall and on_stats == off_stats
    assert sim.tiers.stats()["saved"] == 0 and sim.tiers.stats()["loaded"] == 0


def test_loads_and_saves_add_their_bytes_over_the_bandwidth_to_the_steps():
    """One request at a time (the schedule does not depend on step times) and every decision
    a load: the wall time is the steps' time plus every byte read or written / bandwidth."""
    shapes = [Shape(40, 8, (12, 12), f"s{i}") for i in range(3)]
    walls = {}
    for bandwidth in (1e6, 1e7):
        sim, results, wall, _ = run(shapes, 8, tiers(100, bandwidth=bandwidth), linear_step,
                                    block_size=16)  # fmt: skip
        assert all(r.ok for r in results)
        stats = sim.tiers.stats()
        assert stats["decisions"]["recompute"] == 0 and stats["loaded"] > 0
        moved = stats["tiers"]["host"]["bytes_read"] + stats["tiers"]["host"]["bytes_written"]
        walls[bandwidth] = wall, moved
    (slow, moved), (fast, moved_again) = walls[1e6], walls[1e7]
    assert moved == moved_again > 0
    assert slow - fast == pytest.approx(moved / 1e6 - moved / 1e7, rel=1e-9)


def test_a_bigger_host_budget_never_finds_fewer_reusable_tokens():
    """Metamorphic, one request at a time over random multi-turn sessions in lockstep. (Not
    a theorem with a batch: a tier's loads take pool blocks other waiting prompts would have
    hit.)"""
    for seed in range(20):
        rng = random.Random(seed)
        shapes = agentic(rng, rng.randint(2, 6))
        longest = max(s.prompt_tokens + sum(s.follow_up_tokens)
                      + s.max_tokens * (len(s.follow_up_tokens) + 1) for s in shapes)  # fmt: skip
        num_blocks = longest // 16 + 2 + rng.randint(0, 10)
        found = []
        for host in (0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 1000):
            *_, stats = run(shapes, num_blocks, tiers(host), linear_step, block_size=16)
            reuse = stats.reuse()
            found.append(round(reuse["reusable_tokens"] * (1 - reuse["recomputed"])))
        assert found == sorted(found), (seed, found)
        assert found[-1] == stats.reusable_tokens  # a tier holding everything: all found


def test_tier_spec_checks_and_bandwidth_sources():
    from infergen.perf.hardware import HARDWARE

    with pytest.raises(ConfigError, match="needs a tier"):
        TierSpec()
    with pytest.raises(ConfigError, match="bandwidth"):
        TierSpec(10, host_bandwidth=0.0)
    spec = TierSpec(10, 20).for_hardware(HARDWARE.get("h200"))
    assert (spec.host_bandwidth, spec.disk_bandwidth) == (
        DEFAULT_HOST_BANDWIDTH,
        DEFAULT_DISK_BANDWIDTH,
    )
    row = HARDWARE.get("h200").__class__(
        name="x", description="x", memory_bytes=1e9, bandwidth=1e9, host_bandwidth=3e9
    )
    chosen = TierSpec(10, host_bandwidth=None).for_hardware(row)
    assert chosen.host_bandwidth == 3e9 and dict(chosen.sources)["host"] == "hardware row x"
    assert TierSpec(10, host_bandwidth=5e9).for_hardware(row).host_bandwidth == 5e9


def test_recurrent_models_are_refused_as_the_engine_refuses_them():
    shape = PoolShape(10, (CacheGroup((0,)),), 16, state_slots=4, page_bytes=BLOCK_BYTES)
    sim = Simulator(linear_step, shape, tiers=tiers(10))
    with pytest.raises(ConfigError, match="recurrent"):
        sim.run([Shape(20, 4)], concurrency=1)


def test_predicted_gain_on_the_benchmark_workload():
    """bench_kv_tiers' workload shape (3 sessions of 4 turns, the pool a quarter of the
    working set) on a compute-bound CPU-like row: a host tier of twice the working set finds
    every reusable token, answers later turns sooner and serves more tokens per second; the
    gains are the two runs' ratios."""
    from infergen.perf.hardware import Hardware

    cpu = Hardware(name="cpu-like", description="a CPU", memory_bytes=32e9, bandwidth=25e9,
                   flops={"fp32": 2e11}, host_bandwidth=1e10)  # fmt: skip
    gain = predicted_tier_gain(
        sessions=3, turns=4, system=64, tool=48, answer=8, pool_blocks=23,
        host_bytes=2 * 54 * 2**22, model=LLAMA_8B, hardware=cpu,
    )  # fmt: skip
    section = gain["kv_offload"]
    on, off = section["with_tiers"], section["without_tiers"]
    assert on["reuse"]["recomputed"] == 0.0 < off["reuse"]["recomputed"]
    assert on["reuse"]["reusable_tokens"] == off["reuse"]["reusable_tokens"] > 0
    assert gain["ttft_p50_turn2on"] == off["ttft_p50_ms_turn2on"] / on["ttft_p50_ms_turn2on"]
    assert gain["output_tok_s"] == on["output_tok_s"] / off["output_tok_s"]
    assert gain["ttft_p50_turn2on"] > 1.1 and gain["output_tok_s"] > 1.1
    assert section["pool_blocks"] == 23 and on["failed"] == off["failed"] == 0


@pytest.mark.parametrize("host_blocks, disk_blocks", [(100, None), (3, None), (2, 8)])
def test_tier_counters_equal_the_engines_on_the_same_turns(host_blocks, disk_blocks, tmp_path):
    """The engine (a tiny model, a 12-block pool, real host / disk tiers) and the simulator
    serve 3 sessions of 4 turns in lockstep: the same prompt tokens found cached, the same
    hits, puts and evictions per tier, the same load decisions. (The disk budget leaves
    room for the files' headers, which the simulation does not count.)"""
    from infergen import LLM, SamplingParams
    from tests.hf_models import build_hf_model

    build_hf_model("llama_gqa", tmp_path / "model")
    sessions, turns, first, answer, follow = 3, 4, 40, 6, 20
    limits = dict(max_num_seqs=4, max_num_batched_tokens=64)
    block_bytes = LLM(str(tmp_path / "model"), num_kv_blocks=12).engine.kv_cache.block_bytes
    host, disk = host_blocks * block_bytes, None
    options = dict(kv_offload_memory=host)
    if disk_blocks is not None:
        disk = disk_blocks * block_bytes + 10_000
        options.update(kv_offload_dir=str(tmp_path / "kv"), kv_offload_disk=disk)
    engine = LLM(str(tmp_path / "model"), block_size=16, num_kv_blocks=12, **limits,
                 **options).engine  # fmt: skip
    rng = random.Random(0)
    conversations = [[rng.randrange(0, 200) for _ in range(first)] for _ in range(sessions)]
    params = SamplingParams(max_tokens=answer, temperature=0, ignore_eos=True)
    cached = 0
    for _ in range(turns):  # every session's turn together, as Simulator.run(lockstep=True)
        ids = [engine.add_request(prompt, params) for prompt in conversations]
        while engine.has_unfinished():
            engine.step()
        for s, request in enumerate(ids):
            out = engine.output(request)
            cached += out.num_cached_prompt_tokens
            new = [rng.randrange(0, 200) for _ in range(follow)]
            conversations[s] = conversations[s] + list(out.token_ids) + new
            engine.release(request)
    shape = PoolShape(12, engine.kv_cache.groups, 16, page_bytes=block_bytes)
    sim = Simulator(linear_step, shape, SchedulerConfig(**limits),
                    tiers=TierSpec(host, disk, False, 1e12, 1e12))  # fmt: skip
    shapes = [Shape(first, answer, (follow,) * (turns - 1), f"s{i}") for i in range(sessions)]
    *_, stats = sim.run(shapes, concurrency=sessions, lockstep=True)

    def counters(kv_tiers) -> dict:
        found = kv_tiers.stats()
        tiers = {name: (t["hits"], t["puts"], t["evictions"]) for name, t in found["tiers"].items()}
        return {"tiers": tiers, "loaded": found["loaded"], "decisions": found["decisions"]}

    assert counters(sim.tiers) == counters(engine.kv_tiers)
    assert stats.prefix_hit_tokens == cached > 0
