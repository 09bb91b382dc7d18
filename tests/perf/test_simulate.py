"""The serving simulator (infergen/perf/simulate.py), which runs the engine's Scheduler on
predicted step times. Oracles: the engine serving a real (tiny) model for the step-by-step
schedule, Little's law, the hardware roofline as an upper bound, and closed forms for
speculative decoding, prefix reuse and the pool's shape."""

from __future__ import annotations

import random

import pytest

from infergen.bench.report import summarize
from infergen.bench.workloads import SHAPES, Shape, WorkloadOptions
from infergen.config import SchedulerConfig
from infergen.io.model_config import read_model_config
from infergen.kvcache.groups import CacheGroup
from infergen.perf.hardware import HARDWARE
from infergen.perf.memory import PoolShape, kv_pool
from infergen.perf.predict import Deployment, fixed_shapes, predict
from infergen.perf.simulate import Simulator, SpecDecode
from infergen.perf.step_cost import Formats, Parallel

LLAMA_8B = "tests/perf/configs/llama-3.1-8b.json"


def linear_step(chunks) -> float:
    """A toy device: 5 ms per step plus 0.1 ms per token."""
    return 5e-3 + 1e-4 * sum(c.new for c in chunks)


def pool(num_blocks: int = 10**6) -> PoolShape:
    """A pool of `num_blocks` blocks of 16 tokens, one full-attention group."""
    return PoolShape(num_blocks, (CacheGroup((0,)),))


def random_shapes(n: int, seed: int = 0, output: int = 32) -> list[Shape]:
    opts = WorkloadOptions(num_requests=n, input_len=64, output_len=output)
    return SHAPES.get("random")(opts, random.Random(seed))


@pytest.mark.parametrize(
    "name, admission, num_blocks",
    [("llama_gqa", "optimistic", 12), ("llama_gqa", "reserve", 12), ("gemma3", "optimistic", 20)],
)
def test_schedule_equals_the_engine_scheduler_step_by_step(name, admission, num_blocks, tmp_path):
    """The same prompts on the real engine (tiny model, chunked prefill, a KV pool small
    enough to preempt; Gemma-3's sliding-window groups) and in the simulator: identical token
    counts in every step; reserving admission never preempts."""
    from infergen import LLM, SamplingParams
    from infergen.engine.scheduler import Scheduler
    from tests.hf_models import build_hf_model

    build_hf_model(name, tmp_path)
    rng = random.Random(3)
    shapes = [Shape(rng.randint(1, 70), rng.randint(1, 30)) for _ in range(9)]
    limits = dict(max_num_seqs=5, max_num_batched_tokens=32, admission=admission)
    llm = LLM(str(tmp_path), block_size=16, num_kv_blocks=num_blocks,
              enable_prefix_caching=False, **limits)  # fmt: skip
    engine_steps, original = [], Scheduler.schedule

    def recording(self):
        batch = original(self)
        engine_steps.append(list(batch.num_tokens))
        return batch

    Scheduler.schedule = recording
    try:
        prompts = [[rng.randrange(0, 211) for _ in range(s.prompt_tokens)] for s in shapes]
        params = [SamplingParams(max_tokens=s.max_tokens, ignore_eos=True) for s in shapes]
        llm.generate(prompts, params)
    finally:
        Scheduler.schedule = original
    sim_steps = []

    def step_time(chunks):
        sim_steps.append([c.new for c in chunks])
        return 1e-3

    shape = PoolShape(num_blocks, llm.engine.kv_cache.groups)
    sim = Simulator(step_time, shape, SchedulerConfig(**limits), prefix_caching=False)
    _, _, stats = sim.run(shapes, concurrency=len(shapes))
    # the pool is small enough to exercise preemption, unless admission reserves
    assert (stats.preemptions > 0) is (admission == "optimistic")
    assert stats.preemptions == llm.engine.scheduler.num_preemptions
    assert sim_steps == [s for s in engine_steps if s]


@pytest.mark.parametrize("name", ["llama_gqa", "gemma3", "gpt_oss", "qwen3_next", "falcon_h1"])
def test_pool_shape_is_the_engines(name, tmp_path):
    """The simulated pool is the one the engine builds from the same KV budget: the same
    cache groups (sliding windows), blocks and recurrent-state slots."""
    from infergen import LLM
    from tests.hf_models import build_hf_model

    build_hf_model(name, tmp_path)
    llm = LLM(str(tmp_path), kv_cache_memory="1MiB", max_num_seqs=4, block_size=8)
    cache = llm.engine.kv_cache
    fp32 = Formats(weight_bits=32, kv_bits=32, act_bytes=4)
    pool = kv_pool(llm.config.describe(), fp32, Parallel(), 2**20, 8, 4)
    assert pool.groups == cache.groups
    assert pool.num_blocks == cache.num_blocks
    assert pool.state_slots == (cache.states.num_slots if cache.states is not None else None)


def test_littles_law_open_loop():
    sim = Simulator(linear_step, pool())
    results, wall, stats = sim.run(random_shapes(200), rate=6.0, seed=1)
    arrivals_per_s = len(results) / wall
    mean_e2e = sum(r.e2e for r in results) / len(results)
    # L (time-averaged requests in the system, integrated step by step) = lambda * W
    assert stats.in_system_s / wall == pytest.approx(arrivals_per_s * mean_e2e, rel=1e-9)


def test_closed_loop_keeps_concurrency_requests_in_the_system():
    sim = Simulator(linear_step, pool())
    results, wall, stats = sim.run(random_shapes(400), concurrency=8)
    assert len(results) == 400 and all(r.ok for r in results)
    assert stats.as_dict(wall)["mean_in_system"] == pytest.approx(8, rel=0.03)


@pytest.mark.parametrize("workload", ["random", "long-context", "agentic"])
def test_throughput_never_exceeds_the_roofline_bound(workload):
    desc, hw = read_model_config(LLAMA_8B).describe(), HARDWARE.get("h200")
    dep = Deployment(desc, hw, Formats(), "bf16")
    opts = WorkloadOptions(num_requests=64, input_len=512, output_len=128)
    shapes = SHAPES.get(workload)(opts, random.Random(0))
    for concurrency in (1, 16, 64):
        r = predict(dep, shapes, concurrency=concurrency)
        inputs = r["total_tok_s"] * r["wall_s"] - r["output_tok_s"] * r["wall_s"]
        outputs = r["output_tok_s"] * r["wall_s"]
        # every token multiplies with the active weights at least once, at peak FLOP/s; every
        # step reads all weights at peak bandwidth, and a request emits one token per step
        flops_s = 2 * desc.params_active() * (inputs + outputs) / hw.peak_flops("bf16")
        longest = max(s.max_tokens for s in shapes)
        memory_s = longest * desc.weight_bytes(16) / hw.bandwidth
        bound = outputs / max(flops_s, memory_s)
        assert 0 < r["output_tok_s"] <= bound


def test_ttft_grows_with_queueing_past_capacity():
    sim_ttft, tput = [], []
    for concurrency in (2, 8, 32, 128):
        sim = Simulator(linear_step, pool(), SchedulerConfig(max_num_seqs=8))
        results, wall, _ = sim.run(random_shapes(256), concurrency=concurrency)
        summary = summarize(results, wall)
        sim_ttft.append(summary["ttft_s"]["p50"])
        tput.append(summary["output_tok_s"])
    assert sim_ttft == sorted(sim_ttft)
    assert sim_ttft[3] > 4 * sim_ttft[1]  # 128 clients on 8 slots wait ~15 answers' time
    assert tput[3] == pytest.approx(tput[2], rel=0.1)  # capacity reached: no more throughput


def test_kv_capacity_admits_preempts_and_never_loses_a_request():
    shapes = random_shapes(48, output=64) + [Shape(5000, 8)]  # the last one can never fit
    for admission in ("optimistic", "reserve"):
        sim = Simulator(linear_step, pool(40), SchedulerConfig(admission=admission))
        results, _, stats = sim.run(shapes, concurrency=16)
        assert len(results) == len(shapes)
        failed = [r for r in results if not r.ok]
        assert len(failed) == 1 and "KV" in failed[0].error
        ok = [r for r in results if r.ok]
        assert sorted(r.output_tokens for r in ok) == sorted(s.max_tokens for s in shapes[:-1])
        # optimistic admission runs out and preempts; reserving the answer never does
        assert (stats.preemptions > 0) is (admission == "optimistic")


def test_prefix_cache_reuses_each_sessions_previous_turn():
    opts = WorkloadOptions(num_requests=32, input_len=100, output_len=20, turns=4)
    shapes = SHAPES.get("agentic")(opts, random.Random(0))
    warm = Simulator(linear_step, pool())
    results, _, stats = warm.run(shapes, concurrency=4)
    # turn t > 0 reuses the full blocks of turn t - 1's prompt + answer (minus the last token)
    expected = 0
    for shape in shapes:
        context = shape.prompt_tokens
        for follow_up in shape.follow_up_tokens:
            cached = (context + shape.max_tokens - 1) // 16 * 16
            context += shape.max_tokens + follow_up
            expected += min(cached, (context - 1) // 16 * 16)
    assert stats.prefix_hit_tokens == expected
    cold_results, _, cold = Simulator(linear_step, pool(), prefix_caching=False).run(
        shapes, concurrency=4
    )
    assert cold.prefix_hit_tokens == 0

    def later_turns_ttft(rs):
        return sum(r.ttft for r in rs if r.turn > 0)

    assert later_turns_ttft(results) < later_turns_ttft(cold_results)


@pytest.mark.parametrize("acceptance", [0.0, 0.6, 1.0])
def test_speculative_decoding_emits_the_expected_tokens_per_step(acceptance):
    k, output = 4, 2000
    spec = SpecDecode(k, acceptance)
    sim = Simulator(lambda chunks: 1e-3, pool(), spec=spec, seed=7)
    results, _, stats = sim.run([Shape(10, output)], concurrency=1)
    assert results[0].output_tokens == output
    decode_steps = stats.steps - 1  # the prefill step emits the first token
    per_step = (output - 1) / decode_steps
    assert per_step == pytest.approx(spec.expected_tokens(), rel=0.05)
    if acceptance == 1.0:
        assert decode_steps == -(-(output - 1) // (k + 1))


@pytest.mark.parametrize("fraction", [0.0, 0.3, 1.0])
def test_a_share_of_decodes_without_drafts(fraction):
    """verify_fraction f: a decode verifies its drafts with probability f, else emits one
    token — f·E + (1 − f) tokens per decode step, and verifying steps f of them."""
    k, output = 4, 3000
    spec = SpecDecode(k, 0.6, verify_fraction=fraction)
    sizes = []
    sim = Simulator(lambda chunks: sizes.append(chunks[0].new) or 1e-3, pool(), spec=spec,
                    seed=3)  # fmt: skip
    results, _, stats = sim.run([Shape(10, output)], concurrency=1)
    assert results[0].output_tokens == output
    decodes = sizes[1:]  # (the first step: the prefill)
    per_step = (output - 1) / len(decodes)
    expected = fraction * spec.expected_tokens() + (1 - fraction)
    assert per_step == pytest.approx(expected, rel=0.05)
    assert sum(n > 1 for n in decodes) / len(decodes) == pytest.approx(fraction, abs=0.04)


def test_drafts_drawn_from_a_measured_histogram():
    """SpecDecode.drafts {d: share}: each verifying step verifies d drafts with that share
    (its step has 1 + d rows), and the tokens per decode step are the shares' mean of the
    chains, f·E + (1 − f)."""
    shares, output = {2: 0.25, 5: 0.75}, 4000
    spec = SpecDecode(6, 0.7, verify_fraction=0.9, drafts=shares)
    sizes = []
    sim = Simulator(lambda chunks: sizes.append(chunks[0].new) or 1e-3, pool(), spec=spec,
                    seed=5)  # fmt: skip
    results, _, _ = sim.run([Shape(10, output)], concurrency=1)
    assert results[0].output_tokens == output
    decodes = sizes[1:-1]  # (the prefill; the last step may be cut at max_tokens)
    verifying = [n - 1 for n in decodes if n > 1]
    assert set(verifying) == {2, 5}
    assert verifying.count(5) / len(verifying) == pytest.approx(0.75, abs=0.04)
    chains = {d: sum(0.7**i for i in range(d + 1)) for d in shares}
    assert spec.expected_tokens() == pytest.approx(sum(w * chains[d] for d, w in shares.items()))
    per_step = (output - 1) / len(sizes[1:])
    assert per_step == pytest.approx(0.9 * spec.expected_tokens() + 0.1, rel=0.05)


def test_predict_reports_the_issue_fields():
    dep = Deployment(read_model_config(LLAMA_8B).describe(), HARDWARE.get("h200"))
    r = predict(dep, fixed_shapes(256, 64, 64), concurrency=16)
    for key in ("params_total", "params_active", "weight_bytes", "kv_bytes_per_token"):
        assert r[key] > 0
    for key in ("ttft_ms", "itl_ms"):
        assert set(r[key]) >= {"mean", "p50", "p90", "p99"}
    assert r["output_tok_s"] > 0 and r["cost_per_mtok_usd"] > 0
    assert r["max_concurrency"] == 256  # the batch limit; KV alone fits thousands
    assert r["max_concurrency_kv"] == int(
        dep.memory.kv_capacity_bytes // (320 * dep.desc.kv_bytes_per_token(2))
    )
