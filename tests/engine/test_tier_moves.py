"""The scheduler's traffic with the KV tiers (engine/tier_moves.py, issue 23 items 2–3):
background loads off the critical path, and preemption by swap.

Oracles: greedy tokens of the same prompts on an engine without pressure and without tiers
(cold), and the number of tokens the runner computed (the engine's own step records) against
the least any schedule can compute: each prompt once plus one token per further output.
A background load is held in flight by a real DiskTier whose `get` waits on a gate the test
opens (no timing): meanwhile the running sequences must step and later ones be admitted."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from infergen import LLM, SamplingParams
from infergen.cli import build_parser
from infergen.engine.options import engine_config
from infergen.engine.request import Status
from infergen.errors import ConfigError
from infergen.kvcache.tiers.disk import DiskTier
from tests.hf_models import build_hf_model

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
PRESSURE = dict(block_size=4, num_kv_blocks=30, max_num_seqs=4, max_num_batched_tokens=16)
MAX_STEPS = 2000  # far more than any test here needs (a few dozen steps)
GATE_S = 60.0  # a gated get gives up after this long (a hung test fails instead of hanging)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama")
    build_hf_model("llama_gqa", directory)
    return str(directory)


def _prompts(seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 200, (n,), generator=gen).tolist() for n in lengths]


def _counting(llm: LLM) -> list[int]:
    """Tokens the runner computes, step by step (the engine's step records)."""
    computed: list[int] = []
    llm.engine.on_step = lambda record: computed.append(sum(n for n, _ in record.chunks))
    return computed


# ---- preemption by swap -------------------------------------------------------------------
def test_swap_preemption_recomputes_nothing(llama):
    """A pool that forces preemption: with preemption_mode="swap" every preempted sequence
    comes back with all its computed tokens (full blocks and the partial one), so the runner
    computes each prompt once and one token per further output, and the tokens equal a run
    without pressure; recompute (the control) computes more."""
    prompts = _prompts(4, (30, 26, 34, 22))
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    least = sum(len(p) + params.max_tokens - 1 for p in prompts)
    want = LLM(llama, block_size=4, num_kv_blocks=200).generate(prompts, params)

    swap = LLM(llama, kv_offload_memory="4MiB", preemption_mode="swap", **PRESSURE)
    swap_computed = _counting(swap)
    got = swap.generate(prompts, params)
    preemptions = swap.engine.scheduler.num_preemptions
    stats = swap.engine.kv_tiers.stats()
    assert preemptions > 0 and stats["preemptions"] == {"swap": preemptions, "recompute": 0}
    assert sum(swap_computed) == least
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert stats["tiers"]["host"]["nbytes"] < 4 << 20  # partial copies dropped, budget held

    recompute = LLM(llama, kv_offload_memory="4MiB", preemption_mode="recompute", **PRESSURE)
    recompute_computed = _counting(recompute)
    again = recompute.generate(prompts, params)
    count = recompute.engine.scheduler.num_preemptions
    assert recompute.engine.kv_tiers.stats()["preemptions"] == {"swap": 0, "recompute": count}
    assert sum(recompute_computed) > least
    assert [o.token_ids for o in again] == [o.token_ids for o in want]


def test_auto_preemption_counts_each_choice(llama):
    """ "auto" with a host tier: every preemption is counted as a swap or a recompute (the
    cost rule on measured costs decides), and the tokens are those of a run without pressure."""
    prompts = _prompts(5, (28, 30, 24, 26))
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    want = LLM(llama, block_size=4, num_kv_blocks=200).generate(prompts, params)
    auto = LLM(llama, kv_offload_memory="4MiB", **PRESSURE)
    got = auto.generate(prompts, params)
    counted = auto.engine.kv_tiers.stats()["preemptions"]
    assert auto.engine.scheduler.num_preemptions == sum(counted.values()) > 0
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


def test_preemption_mode_is_validated(llama):
    with pytest.raises(ConfigError, match="auto, swap, recompute"):
        engine_config(preemption_mode="swapp")
    with pytest.raises(ConfigError, match="kv_offload_memory"):
        engine_config(preemption_mode="swap")  # no host tier
    with pytest.raises(ConfigError, match="kv_offload_memory"):
        engine_config(preemption_mode="swap", kv_offload_dir="/tmp/x")  # disk is no host tier
    with pytest.raises(ConfigError, match="enable_prefix_caching"):
        engine_config(preemption_mode="swap", kv_offload_memory="1MiB",
                      enable_prefix_caching=False)  # fmt: skip
    with pytest.raises(ConfigError, match="sparse_decode_blocks"):
        engine_config(preemption_mode="swap", kv_offload_memory="1MiB", sparse_decode_blocks=4)
    config = engine_config(preemption_mode="swap", kv_offload_memory="1MiB")
    assert config.scheduler.preemption_mode == "swap"
    args = build_parser().parse_args(["generate", "--preemption-mode", "recompute", "hi"])
    assert args.preemption_mode == "recompute"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--preemption-mode", "never", "hi"])


# ---- background loads ---------------------------------------------------------------------
class GatedDiskTier(DiskTier):
    """A real disk tier whose reads wait until the test opens the gate (`entered` is set as
    the first read starts): a load stays in flight as long as the test wants."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate, self.entered = threading.Event(), threading.Event()

    def get(self, key: bytes) -> torch.Tensor | None:
        self.entered.set()
        if not self.gate.wait(GATE_S):
            raise TimeoutError("the test never opened the gate")
        return super().get(key)


def _disk_engine(
    llama: str, directory, prompt: list[int], options: dict
) -> tuple[LLM, GatedDiskTier]:
    """An engine whose disk tier holds `prompt`'s blocks (written through by an earlier engine
    on the same directory) behind a gate."""
    LLM(llama, kv_offload_dir=str(directory), kv_offload_write_through=True,
        **options).generate(prompt, GREEDY)  # fmt: skip
    llm = LLM(llama, kv_offload_dir=str(directory), **options)
    tiers = llm.engine.kv_tiers
    (disk,) = tiers.tiers
    gated = GatedDiskTier(directory, disk.budget_bytes, disk.fingerprint)
    tiers.tiers = [gated]
    return llm, gated


def test_a_disk_hit_loads_while_the_others_step(llama, tmp_path):
    """While a sequence's prefix is read from the disk tier in the background, the running
    sequence steps every step and a later one is admitted past it; once the load lands, the
    sequence is admitted with its prefix cached and every sequence gives the cold run's
    tokens."""
    options = dict(block_size=4, num_kv_blocks=64, max_num_seqs=4)
    prompt, running, later = _prompts(7, (44, 10, 12))
    long = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    cold = LLM(llama, **options)
    want = [cold.generate(p, sp)[0].token_ids for p, sp in
            ((prompt, GREEDY), (running, long), (later, GREEDY))]  # fmt: skip
    llm, gated = _disk_engine(llama, tmp_path, prompt, options)
    engine = llm.engine
    b = engine.add_request(running, long)
    engine.step()  # b's prompt
    a = engine.add_request(prompt, GREEDY)
    engine.step()  # a's load starts in the background; b decodes
    assert gated.entered.wait(GATE_S)
    c = engine.add_request(later, GREEDY)
    for _ in range(3):
        before = len(engine.output(b).token_ids)
        engine.step()
        assert len(engine.output(b).token_ids) == before + 1  # b steps while a loads
    seq_a = engine._requests[a]
    assert seq_a.status is Status.WAITING and engine.scheduler.moves.loading(seq_a)
    assert engine._requests[c].status is not Status.WAITING  # admitted past the loading one
    held = engine.pool.num_blocks - engine.pool.num_free
    assert held >= 10  # a's blocks are held while they load
    gated.gate.set()
    while engine.has_unfinished():
        engine.step()
    outputs = [engine.output(r) for r in (a, b, c)]
    assert [o.token_ids for o in outputs] == want
    assert outputs[0].num_cached_prompt_tokens >= 40
    stats = engine.kv_tiers.stats()
    assert stats["loads"]["background"] == 1 and stats["loaded"] >= 10
    assert stats["load_seconds"]["background"] > 0


def test_abort_during_a_load_frees_its_blocks(llama, tmp_path):
    """A request aborted while its blocks load: once the block being copied lands, the job
    stops, and every pool block is free or idle again."""
    options = dict(block_size=4, num_kv_blocks=64, max_num_seqs=4)
    (prompt,) = _prompts(8, (44,))
    llm, gated = _disk_engine(llama, tmp_path, prompt, options)
    engine, pool = llm.engine, llm.engine.pool
    a = engine.add_request(prompt, GREEDY)
    assert engine.step() == []  # nothing else to step: the load is in flight
    assert gated.entered.wait(GATE_S)
    assert pool.num_free < pool.num_blocks
    engine.abort(a)
    assert engine.output(a).finish_reason == "abort"
    assert engine.has_unfinished()  # the cancelled job still holds its blocks
    gated.gate.set()
    while engine.has_unfinished():
        engine.step()
    assert pool.num_free == pool.num_blocks
    stats = engine.kv_tiers.stats()
    assert stats["loads"]["cancelled"] == 1 and stats["loaded"] == 1  # the block in flight


def test_many_disk_hits_into_a_small_pool(llama, tmp_path):
    """A restart: every request's prefix is on disk and the pool holds about three of them at
    once. Background loads go one at a time (a finished one's blocks never keep the head of
    the queue out), every request is served, with the cold run's tokens."""
    prompts = _prompts(9, (40, 44, 36, 42, 38))
    big = dict(block_size=4, num_kv_blocks=256, max_num_seqs=8)
    LLM(llama, kv_offload_dir=str(tmp_path), kv_offload_write_through=True,
        **big).generate(prompts, GREEDY)  # fmt: skip
    want = LLM(llama, **big).generate(prompts, GREEDY)
    small = dict(block_size=4, num_kv_blocks=40, max_num_seqs=4)
    llm = LLM(llama, kv_offload_dir=str(tmp_path), **small)
    engine = llm.engine
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    for _ in range(MAX_STEPS):  # (a livelock fails here instead of hanging)
        if not engine.has_unfinished():
            break
        engine.step()
    got = [engine.output(i) for i in ids]
    assert all(o.finished for o in got)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    stats = llm.engine.kv_tiers.stats()
    assert stats["loads"]["background"] >= 2 and stats["loaded"] >= 20
    assert sum(o.num_cached_prompt_tokens for o in got) >= 2 * 36


def _threads() -> set[str]:
    """The process's thread ids (compare sets: an earlier test's idle worker may exit
    meanwhile, when its executor is collected)."""
    return set(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_a_cpu_background_load_places_its_blocks_on_the_engine_thread(llama, tmp_path):
    """On the CPU the loader thread only reads: a torch copy there would run an OpenMP
    parallel region and leave a thread team of its own alive, which slows every later step
    (tiers/loader.py). Blocks of 49152 elements (copied in parallel by torch) load in the
    background: the process gains the loader's one thread and no team, the pool blocks are
    untouched until the job is settled, and equal the saved blocks after."""
    llm = LLM(llama, block_size=256, num_kv_blocks=8, num_threads=2,
              kv_offload_dir=str(tmp_path))  # fmt: skip
    llm.generate(_prompts(10, (500,)), GREEDY)  # fills blocks 0-1 with real KV
    tiers, cache = llm.engine.kv_tiers, llm.engine.kv_cache
    assert cache.page(0).numel() > 32768  # (above torch's grain size: a parallel copy)
    keys = [bytes([i]) * 16 for i in range(2)]
    for block, key in enumerate(keys):
        tiers.save(block, key, keys[block - 1] if block else None)
    want = [cache.block_data(block) for block in range(2)]
    targets = [5, 6]
    for block in targets:
        cache.write_block(block, torch.zeros_like(want[0]))
    before = _threads()
    job = tiers.load_async(keys, targets)
    assert tiers.wait_any([job], GATE_S)
    assert len(_threads() - before) == 1  # the loader's worker, no OpenMP team
    assert all(cache.block_data(block).abs().sum() == 0 for block in targets)
    assert tiers.settle(job) == 2
    for block, data in zip(targets, want, strict=True):
        assert torch.equal(cache.block_data(block), data)
    assert len(_threads() - before) == 1
