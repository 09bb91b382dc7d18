"""The simulated KV tiers (infergen/perf/kv_tiers.py) in the serving simulator, and the
offload comparison (perf/offload.py). Oracles: a hand count of which prefix blocks must be
found where on a tiny deterministic workload, the engine's own tier counters on the same
turns, the run without tiers (tiers that hold nothing change nothing), a closed form of the
load and save seconds (inline ones in the steps, background ones delaying admission), and a
bigger host budget never finding fewer reusable tokens where no load failed (metamorphic)."""

from __future__ import annotations

import collections
import dataclasses
import random

import pytest

from infergen.bench.workloads import Shape
from infergen.config import CacheConfig, SchedulerConfig
from infergen.errors import ConfigError
from infergen.kvcache.groups import CacheGroup
from infergen.perf.kv_tiers import (
    DEFAULT_DISK_BANDWIDTH,
    DEFAULT_HOST_BANDWIDTH,
    SimulatedTiers,
    TierSpec,
)
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
# - a 1-block host over a disk tier: k1 spilled to disk, k0 in host memory. The load takes
#   its 2 pool blocks before it reads any (engine/tier_moves.py `fetch`): the free block,
#   then s0's least recent idle block, whose eviction enters the host tier and spills k0 to
#   disk too; both come from disk (in the background: a disk read), 8 tokens.
HAND_COUNT = [  # host blocks, disk blocks → tokens found in (pool, host, disk), recomputed
    (None, None, (8, 0, 0), 8),
    (0, None, (8, 0, 0), 8),
    (1, None, (8, 4, 0), 4),
    (2, None, (8, 4, 0), 4),
    (4, None, (8, 8, 0), 0),
    (100, None, (8, 8, 0), 0),
    (1, 100, (8, 0, 8), 0),
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


def test_inline_loads_and_saves_add_to_the_steps_and_background_loads_delay_admission():
    """One request at a time (the schedule does not depend on step times) and every decision
    a load. Inline loads and every save add their bytes / bandwidth to the steps that pay
    them (busy time). A background load (the engine's rule: a copy over a tenth of a decode
    step; at 1e6 B/s a 1000-byte block takes 1 ms, a step about 1 ms) delays its sequence's
    admission by its bytes / bandwidth, and here nothing else runs meanwhile (the others
    wait for the loader too): the engine idles for it. So at either bandwidth the busy time
    is the same compute plus the inline loads' and saves' bytes / bandwidth, the idle time
    the background loads' bytes / bandwidth, and the wall both."""
    shapes = [Shape(40, 8, (12, 12), f"s{i}") for i in range(3)]
    walls, computes = {}, {}
    for bandwidth in (1e6, 1e7):
        sim, results, wall, sim_stats = run(shapes, 8, tiers(100, bandwidth=bandwidth),
                                            linear_step, block_size=16)  # fmt: skip
        assert all(r.ok for r in results)
        stats = sim.tiers.stats()
        assert stats["decisions"]["recompute"] == 0 and stats["loaded"] > 0
        host = stats["tiers"]["host"]
        background = stats["load_seconds"]["background"] * bandwidth  # bytes
        inline = host["bytes_read"] - background
        assert stats["loads"]["background"] > 0 and background > 0
        assert wall - sim_stats.busy_s == pytest.approx(background / bandwidth, rel=1e-9)
        computes[bandwidth] = sim_stats.busy_s - (inline + host["bytes_written"]) / bandwidth
        walls[bandwidth] = wall, host["bytes_read"] + host["bytes_written"]
    (slow, moved), (fast, moved_again) = walls[1e6], walls[1e7]
    assert moved == moved_again > 0
    assert computes[1e6] == pytest.approx(computes[1e7], rel=1e-9)
    assert slow - fast == pytest.approx(moved / 1e6 - moved / 1e7, rel=1e-9)


def test_loads_that_would_not_overlap_run_inline_up_to_a_step():
    """Where a background load would not overlap the steps (TierSpec.loads_overlap False: the
    cpu-local row, whose forward takes every core), the engine's rule loads inline whatever
    takes up to one decode step. The workload above (a step about 1.1 ms; hits of 2-4 blocks
    of 1000 bytes): at 4e6 B/s (0.25 ms a block) every hit after the first (inline: nothing
    measured yet) goes to the background with overlapping tiers and loads inline without;
    at 1e6 B/s (1 ms a block: over a step) both send them to the background."""
    shapes = [Shape(40, 8, (12, 12), f"s{i}") for i in range(3)]

    def loads(bandwidth: float, overlap: bool) -> dict:
        spec = dataclasses.replace(tiers(100, bandwidth=bandwidth), loads_overlap=overlap)
        sim, results, *_ = run(shapes, 8, spec, linear_step, block_size=16)
        assert all(r.ok for r in results)
        found = sim.tiers.stats()["loads"]
        return {"inline": found["inline"], "background": found["background"]}

    assert loads(4e6, True) == {"inline": 1, "background": 4}
    assert loads(4e6, False) == {"inline": 5, "background": 0}
    assert loads(1e6, True) == loads(1e6, False) == {"inline": 1, "background": 4}


def test_a_bigger_host_budget_never_finds_fewer_reusable_tokens():
    """Metamorphic, one request at a time over random multi-turn sessions in lockstep: among
    the runs where no load failed, a bigger host budget never finds fewer reusable tokens; a
    tier never finds fewer than the pool alone, and one holding everything finds all.
    (Runs with a failed load are left out of the order: a load takes all its pool blocks
    before it reads any (engine/tier_moves.py `fetch`), and their evictions enter the host
    tier as its most recent leaves, pushing out the least recent ones: the tail of the very
    chain being loaded may go. A bigger tier holds a longer chain, so the load takes more
    blocks and may lose more of it: seed 0, a 5-block tier loads all 3 blocks it holds of a
    turn, an 8-block tier 2 of the 5 it holds. Not a theorem with a batch either: a tier's
    loads take pool blocks other waiting prompts would have hit.)"""
    for seed in range(20):
        rng = random.Random(seed)
        shapes = agentic(rng, rng.randint(2, 6))
        longest = max(s.prompt_tokens + sum(s.follow_up_tokens)
                      + s.max_tokens * (len(s.follow_up_tokens) + 1) for s in shapes)  # fmt: skip
        num_blocks = longest // 16 + 2 + rng.randint(0, 10)
        found, whole = [], []
        for host in (0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 1000):
            sim, _, _, stats = run(shapes, num_blocks, tiers(host), linear_step, block_size=16)
            reuse = stats.reuse()
            found.append(round(reuse["reusable_tokens"] * (1 - reuse["recomputed"])))
            if not sim.tiers.stats()["loads"]["failed"]:
                whole.append(found[-1])
        assert whole == sorted(whole), (seed, found, whole)
        assert found[0] == min(found), (seed, found)
        assert found[-1] == whole[-1] == stats.reusable_tokens  # a tier holding everything


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


@pytest.mark.parametrize("checkpoint_blocks", [100, 2])
def test_a_hybrid_resumes_from_the_same_checkpoints_as_the_engine(checkpoint_blocks, tmp_path,
                                                                  monkeypatch):  # fmt: skip
    """A hybrid (Falcon-H1: attention and Mamba-2 in every layer, tiny random weights) served
    by the engine and by the simulator, 3 sessions of 4 turns rotating 2 in flight over a
    12-block pool with host + disk tiers: the same prompt tokens found cached, the same
    recurrent-state checkpoints saved, found (in the store or a tier) and spilled, the same
    tier counters. With a store of 2 checkpoints (in state-bytes), most spill to the tiers and
    are found there."""
    from infergen import LLM, SamplingParams
    from infergen.kvcache.state_cache import slots_for
    from tests.hf_models import build_hf_model

    build_hf_model("falcon_h1", tmp_path / "model")
    sessions, turns, first, answer, follow = 3, 4, 40, 6, 20
    limits = dict(max_num_seqs=4, max_num_batched_tokens=64)
    probe = LLM(str(tmp_path / "model"), num_kv_blocks=12).engine
    block_bytes = probe.kv_cache.block_bytes
    state_bytes = probe.scheduler.checkpoints.state_bytes
    del probe
    host, disk = 3 * block_bytes + 2 * state_bytes, 40 * (block_bytes + state_bytes)
    budget = checkpoint_blocks * (state_bytes + 8)
    engine = LLM(str(tmp_path / "model"), block_size=16, num_kv_blocks=12, **limits,
                 kv_offload_memory=host, kv_offload_dir=str(tmp_path / "kv"),
                 kv_offload_disk=disk + 10_000, state_checkpoint_memory=budget).engine  # fmt: skip
    # every load inline on both sides (the engine's first disk load, before it has measured
    # a read, would go to the background; its later choices depend on real-time speeds)
    engine.kv_tiers.loads_inline = lambda keys: True
    monkeypatch.setattr(SimulatedTiers, "loads_inline", lambda self, keys: True)
    rng = random.Random(0)
    conversations = [[rng.randrange(0, 200) for _ in range(first)] for _ in range(sessions)]
    params = SamplingParams(max_tokens=answer, temperature=0, ignore_eos=True)
    cached = _rotate(engine, conversations, turns, params, follow, rng)
    shape = PoolShape(12, engine.kv_cache.groups, 16, slots_for(limits["max_num_seqs"]),
                      block_bytes, state_bytes)  # fmt: skip
    spec = TierSpec(host, disk, False, 1e12, 1e12)
    sim = Simulator(linear_step, shape, SchedulerConfig(**limits), tiers=spec,
                    checkpoint_bytes=budget)  # fmt: skip
    shapes = [Shape(first, answer, (follow,) * (turns - 1), f"s{i}") for i in range(sessions)]
    *_, stats = sim.run(shapes, concurrency=2, rotate=True)

    def counters(kv_tiers, checkpoints) -> dict:
        found = kv_tiers.stats()
        tiers = {name: (t["hits"], t["puts"], t["evictions"]) for name, t in found["tiers"].items()}
        states = {k: found[k] for k in ("states_saved", "states_loaded")}
        return {"tiers": tiers, "loaded": found["loaded"], **states, **checkpoints.stats}

    want = counters(engine.kv_tiers, engine.scheduler.checkpoints)
    assert counters(sim.tiers, sim.sched.checkpoints) == want
    assert stats.prefix_hit_tokens == cached > 0 and want["hits"] > 0
    if checkpoint_blocks == 2:
        assert want["spilled"] > 0 and want["tier_hits"] > 0


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


def _rotate(engine, conversations: list[list[int]], turns: int, params, follow, rng) -> int:
    """Every session's turns, `concurrency` 2 in flight, a session whose turn finished queued
    behind the waiting ones (Simulator.run(rotate=True), benchmarks/bench_kv_tiers.py's
    loop); the prompt tokens found cached."""
    ready, flight, done, cached = collections.deque(range(len(conversations))), {}, {}, 0
    while ready or flight:
        while ready and len(flight) < 2:
            s = ready.popleft()
            flight[engine.add_request(conversations[s], params)] = s
        for delta in engine.step():
            if delta.finished:
                s, out = flight.pop(delta.request_id), engine.output(delta.request_id)
                cached += out.num_cached_prompt_tokens
                engine.release(delta.request_id)
                done[s] = done.get(s, 0) + 1
                if done[s] < turns:
                    new = [rng.randrange(0, 200) for _ in range(follow)]
                    conversations[s] = conversations[s] + list(out.token_ids) + new
                    ready.append(s)
    return cached


DEFAULT_TAILS = CacheConfig.state_checkpoint_bytes


@pytest.mark.parametrize(
    "host_blocks, disk_blocks, rotate, tails",
    [(100, None, False, DEFAULT_TAILS), (3, None, False, DEFAULT_TAILS),
     (2, 8, False, DEFAULT_TAILS), (3, None, True, DEFAULT_TAILS), (2, 8, True, DEFAULT_TAILS),
     (2, 8, True, 0), (3, None, True, 1)],
)  # fmt: skip
def test_tier_counters_equal_the_engines_on_the_same_turns(host_blocks, disk_blocks, rotate,
                                                          tails, tmp_path):  # fmt: skip
    """The engine (a tiny model, a 12-block pool, real host / disk tiers) and the simulator
    serve 3 sessions of 4 turns in lockstep, or rotating with 2 in flight: the same prompt
    tokens found cached, the same hits, puts and evictions per tier, the same load
    decisions. `tails`: the prefix checkpoints' budget (partial blocks; 0: none, 1 byte:
    every one straight to the tiers). (The disk budget leaves room for the files' headers,
    which the simulation does not count.)"""
    from infergen import LLM, SamplingParams
    from tests.hf_models import build_hf_model

    build_hf_model("llama_gqa", tmp_path / "model")
    sessions, turns, first, answer, follow = 3, 4, 40, 6, 20
    limits = dict(max_num_seqs=4, max_num_batched_tokens=64)
    block_bytes = LLM(str(tmp_path / "model"), num_kv_blocks=12).engine.kv_cache.block_bytes
    host, disk = host_blocks * block_bytes, None
    options = dict(kv_offload_memory=host, state_checkpoint_memory=f"{tails}B")
    if disk_blocks is not None:
        disk = disk_blocks * block_bytes + 10_000
        options.update(kv_offload_dir=str(tmp_path / "kv"), kv_offload_disk=disk)
    engine = LLM(str(tmp_path / "model"), block_size=16, num_kv_blocks=12, **limits,
                 **options).engine  # fmt: skip
    # every load inline, as the simulator's at 1e12 B/s: the engine's choice compares the
    # disk's measured real-time read speed with its step time, which varies run to run
    engine.kv_tiers.loads_inline = lambda keys: True
    rng = random.Random(0)
    conversations = [[rng.randrange(0, 200) for _ in range(first)] for _ in range(sessions)]
    params = SamplingParams(max_tokens=answer, temperature=0, ignore_eos=True)
    cached = 0
    for _ in range(0 if rotate else turns):  # every session's turn together (lockstep)
        ids = [engine.add_request(prompt, params) for prompt in conversations]
        while engine.has_unfinished():
            engine.step()
        for s, request in enumerate(ids):
            out = engine.output(request)
            cached += out.num_cached_prompt_tokens
            new = [rng.randrange(0, 200) for _ in range(follow)]
            conversations[s] = conversations[s] + list(out.token_ids) + new
            engine.release(request)
    if rotate:
        cached = _rotate(engine, conversations, turns, params, follow, rng)
    shape = PoolShape(12, engine.kv_cache.groups, 16, page_bytes=block_bytes)
    sim = Simulator(linear_step, shape, SchedulerConfig(**limits),
                    tiers=TierSpec(host, disk, False, 1e12, 1e12),
                    checkpoint_bytes=tails)  # fmt: skip
    shapes = [Shape(first, answer, (follow,) * (turns - 1), f"s{i}") for i in range(sessions)]
    load = dict(concurrency=2, rotate=True) if rotate else dict(concurrency=sessions,
                                                                 lockstep=True)  # fmt: skip
    *_, stats = sim.run(shapes, **load)

    def counters(kv_tiers) -> dict:
        found = kv_tiers.stats()
        tiers = {name: (t["hits"], t["puts"], t["evictions"]) for name, t in found["tiers"].items()}
        return {
            "tiers": tiers,
            "loaded": found["loaded"],
            "decisions": found["decisions"],
            "states": (found["states_saved"], found["states_loaded"]),
        }

    assert counters(sim.tiers) == counters(engine.kv_tiers)
    assert stats.prefix_hit_tokens == cached > 0


def test_a_calibrated_disk_costs_each_block_a_file_and_its_bytes():
    """A hardware row's measured disk costs (`infergen perf calibrate`: a fixed time per file
    and a bandwidth, each way) price every simulated disk read and write; --disk-bandwidth
    replaces them with a bandwidth alone."""
    from infergen.perf.hardware import HARDWARE, FileCosts
    from infergen.perf.kv_tiers import SimulatedTiers, _Contents

    costs = FileCosts(read_file_s=1e-3, read_bandwidth=1e9, write_file_s=2e-3,
                      write_bandwidth=5e8)  # fmt: skip
    hw = dataclasses.replace(HARDWARE.get("h200"), disk=costs)
    spec = TierSpec(None, 100 * BLOCK_BYTES).for_hardware(hw)
    assert spec.disk_costs == costs and spec.disk_bandwidth == 1e9
    assert spec.as_dict()["tiers"]["disk"]["costs"]["write_file_s"] == 2e-3
    flagged = TierSpec(None, 100 * BLOCK_BYTES, disk_bandwidth=3e9).for_hardware(hw)
    assert flagged.disk_costs is None and flagged.costs()["disk"].read_seconds(3000) == 1e-6
    tiers = SimulatedTiers(spec, BLOCK_BYTES, 4, lambda: None, lambda: 0.0)
    (disk,) = tiers.tiers
    keys = [bytes([i]) * 16 for i in range(3)]
    for i, key in enumerate(keys):
        assert disk.put(key, keys[i - 1] if i else None, _Contents(BLOCK_BYTES))
    assert tiers.take_seconds() == pytest.approx(3 * (2e-3 + BLOCK_BYTES / 5e8))
    assert tiers.take_seconds() == 0.0
    shapes = [Shape(40, 8, (12, 12), f"s{i}") for i in range(3)]
    sim, results, *_ = run(shapes, 8, spec, linear_step, block_size=16)
    stats = sim.tiers.stats()
    assert all(r.ok for r in results) and stats["tiers"]["disk"]["hits"] > 0
    loads = stats["load_seconds"]["inline"] + stats["load_seconds"]["background"]
    assert loads == pytest.approx(stats["tiers"]["disk"]["hits"] * (1e-3 + BLOCK_BYTES / 1e9))


def test_answer_lengths_by_session():
    """One answer length per session (bench_kv_tiers' 12 / 16 / 20): the same prediction as
    one length when they are all equal; a list of another length is refused."""
    from infergen.perf.hardware import Hardware

    cpu = Hardware(name="cpu-like", description="a CPU", memory_bytes=32e9, bandwidth=25e9,
                   flops={"fp32": 2e11}, host_bandwidth=1e10)  # fmt: skip
    shape = dict(sessions=3, turns=3, system=64, tool=48, pool_blocks=23,
                 host_bytes=2 * 54 * 2**22, model=LLAMA_8B, hardware=cpu)  # fmt: skip
    same = predicted_tier_gain(answer=[8, 8, 8], **shape)
    assert same == predicted_tier_gain(answer=8, **shape)
    spread = predicted_tier_gain(answer=[4, 8, 12], **shape)
    assert spread["kv_offload"]["with_tiers"] != same["kv_offload"]["with_tiers"]
    with pytest.raises(ValueError, match="one length per session"):
        predicted_tier_gain(answer=[8, 8], **shape)
